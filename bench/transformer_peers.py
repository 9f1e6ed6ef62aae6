"""bench.quant_transformers' peers beyond onnxruntime: onnxsim's quantizers (its command
line, in a child process) and the OpenVINO CPU latency column.

onnxsim 0.8.1 (MIT): ``--dynamic-quantize`` writes int8 weights per output channel,
symmetric, with DynamicQuantizeLinear + MatMulInteger on standard ONNX ops;
``--weight-only-quantize-int4`` writes int4 weights (one scale per block of 32 input
channels) behind DequantizeLinear(block_size=32), which needs opset 21 (INT4 tensors): at
the encoders' opset 17 it leaves every weight in float and says nothing, so the benchmark
asks for ``--target-opset 21``. Both leave the float weights they replaced in the file as
unused initializers (the size column counts them; onnxruntime drops them at load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ONNXSIM_FLAGS = {
    "onnxsim-dynamic": ["--dynamic-quantize"],
    "onnxsim-int4": ["--weight-only-quantize-int4", "--target-opset", "21"],
}


def onnxsim_args(tool: str, src: Path, out: Path) -> list[str]:
    """The child's ``python`` arguments for an onnxsim tool (no check runs: check_n 0)."""
    return ["-m", "onnxsim", str(src), str(out), *ONNXSIM_FLAGS[tool]]


def openvino_loadable(models: dict[str, Path]) -> tuple[dict[str, Path], dict[str, str]]:
    """The models OpenVINO's CPU plugin compiles (one thread, its default precision), and
    for the others the first line of its error."""
    from opfuse.runtime.ov import OpenVinoRuntime

    runtime = OpenVinoRuntime(threads=1)
    ok: dict[str, Path] = {}
    failed: dict[str, str] = {}
    for label, path in models.items():
        try:
            runtime.load(path)
        except Exception as exc:  # OpenVINO raises its own RuntimeError kinds
            text = str(exc).strip().splitlines()
            failed[label] = f"{type(exc).__name__}: {text[0][:160] if text else ''}"
        else:
            ok[label] = path
    return ok, failed


def openvino_columns(case: Any, models: dict[str, Path], seconds: float) -> dict[str, Any]:
    """bench.quant.openvino_latency on the models OpenVINO runs (the float model at f32
    twice for the noise and at the default precision, each int8 model at the default),
    with the ones it could not compile and why."""
    from bench.quant import openvino_latency

    ok, failed = openvino_loadable(models)
    lat = openvino_latency(case, ok, seconds) if ok else {}
    return {**lat, "failed": failed}


def ov_text(lat: dict[str, Any], tool: str) -> str:
    """A row's OpenVINO cell: the ratio to the float model at f32, then to the float
    model at OpenVINO's default precision (the footnote gives the default's own ratio)."""
    if tool in lat.get("failed", {}):
        return "does not compile"
    if "ratio" not in lat:
        return ""
    if tool == "float":
        return "1.00 / 1.00"
    if tool in lat.get("failed", {}):
        return "does not compile"
    if tool not in lat["ratio"]:
        return ""
    return f"{lat['ratio'][tool]:.2f} / {lat['ratio_default'][tool]:.2f}"
