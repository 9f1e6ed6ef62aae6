"""Shared by the tests of the float-graph recovery methods (equalize, smooth): running a
model, the verifier's rule for "same outputs", and the SQNR of onnxruntime's per-tensor or
per-channel int8 QDQ model (quantize_static, MinMax) against the float model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from opfuse.verification import tolerance
from opfuse.verification.compare import compare_arrays
from qdq_models import quantize

Feed = dict[str, np.ndarray]


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: Sequence[Feed]) -> list[list[np.ndarray]]:
    sess = session(model)
    return [list(sess.run(None, f)) for f in feeds]


def deviations(a: onnx.ModelProto, b: onnx.ModelProto, feeds: Sequence[Feed]) -> list[str]:
    """The outputs (per sample) where ``b`` fails the verifier's rule against ``a``
    (rtol 1e-4, atol 1e-5 scaled by the output's magnitude; on a miss, the float64 judge)."""
    bad = []
    names = [o.name for o in a.graph.output]
    for i, (feed, ra, rb) in enumerate(zip(feeds, run(a, feeds), run(b, feeds), strict=True)):
        for name, x, y in zip(names, ra, rb, strict=True):
            diff = compare_arrays(name, x, y, 1e-4, 1e-5)
            if diff.ok:
                continue
            truth = tolerance.run_float64(a, feed, session)[name]
            if not tolerance.within_rounding(x, y, truth, 1e-4, 1e-5):
                bad.append(f"sample {i} output {name}: {diff.max_abs:.3g} (used {diff.used:.3g})")
    return bad


def max_deviation(a: onnx.ModelProto, b: onnx.ModelProto, feeds: Sequence[Feed]) -> float:
    """The largest |b - a| over outputs and samples, relative to max |a| of that output."""
    worst = 0.0
    for ra, rb in zip(run(a, feeds), run(b, feeds), strict=True):
        for x, y in zip(ra, rb, strict=True):
            scale = max(float(np.max(np.abs(x))), 1e-30)
            worst = max(worst, float(np.max(np.abs(x - y))) / scale)
    return worst


def int8(
    model: onnx.ModelProto, calib: Sequence[Feed], tmp: Path, *, per_channel: bool = False
) -> onnx.ModelProto:
    """onnxruntime's QDQ model of ``model``: uint8 activations, int8 weights, MinMax."""
    return quantize(model, tmp, samples=calib, per_channel=per_channel)


def sqnr(reference: onnx.ModelProto, other: onnx.ModelProto, feeds: Sequence[Feed]) -> float:
    """10 log10(sum ref^2 / sum (ref - other)^2) over every output and sample, in dB."""
    signal = noise = 0.0
    for ra, rb in zip(run(reference, feeds), run(other, feeds), strict=True):
        for x, y in zip(ra, rb, strict=True):
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            signal += float(np.sum(x64 * x64))
            noise += float(np.sum((x64 - y64) ** 2))
    return float(10 * np.log10(signal / max(noise, 1e-300)))


def int8_sqnr(
    model: onnx.ModelProto,
    reference: onnx.ModelProto,
    calib: Sequence[Feed],
    feeds: Sequence[Feed],
    tmp: Path,
    *,
    per_channel: bool = False,
) -> float:
    """SQNR of ``model``'s int8 version against the float ``reference`` on ``feeds``."""
    return sqnr(reference, int8(model, calib, tmp, per_channel=per_channel), feeds)


def ort_quantize(
    model: onnx.ModelProto,
    samples: Sequence[Feed],
    tmp: Path,
    *,
    exclude: Sequence[str] = (),
    overrides: dict | None = None,
) -> onnx.ModelProto:
    """onnxruntime's static QDQ quantizer (uint8 activations, int8 per-channel weights),
    ``exclude`` node names in float, ``overrides`` its TensorQuantOverrides; each call in a
    folder of its own under ``tmp``."""
    out = tmp / f"qdq{len(list(tmp.iterdir()))}"
    extra: dict[str, object] = {"TensorQuantOverrides": overrides or {}}
    return quantize(model, out, samples=samples, exclude=exclude, extra=extra)


def build_rows(
    nodes: list[onnx.NodeProto],
    inits: dict[str, object],
    outputs: Sequence[str] = ("y",),
    channels: int = 16,
) -> onnx.ModelProto:
    """A model of ``nodes`` on ``x`` [4, channels] with float initializers ``inits``, its
    outputs [4, channels] (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, channels])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4, channels]) for o in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
