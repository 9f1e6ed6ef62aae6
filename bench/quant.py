"""int8 quantization side by side on models with trained weights and real inputs:

    python -m bench.quant [--models ppocr_rec,ppocr_cls,ppocr_det,keras_mobilenetv3small]
                          [--tools opfuse,onnxruntime,nncf] [--seconds 8] [--docs FILE]

The models and images come from pip packages, downloaded here (``pip download``, never
committed) into the ignored ``bench/out/quant/downloads``:
- rapidocr-onnxruntime 1.4.4 (Apache-2.0): PaddleOCR's trained PP-OCRv4 text detector
  and recognizer and the mobile v2.0 direction classifier;
- scikit-image 0.26.0 (BSD-3-Clause; its sample images are public domain or CC0): a
  scanned page and a text image (crops feed the recognizer and the classifier) and photos
  (the detector, and the Keras export);
- the zoo's keras_mobilenetv3small (decomposed BN, NHWC; random weights: structure and
  speed only, its agreement figures mean little).

Every tool quantizes from the same calibration samples with the same settings (static
QDQ, per-channel int8 weights, uint8 activations, MinMax); accuracy is measured on
held-back samples no tool saw (other text lines, other photos): the SQNR (dB) and
cosine similarity against the float model, and where the output scores classes (N x C or
N x T x C) top-1 agreement (the same class) and top-5 agreement (the float model's class
among the int8 model's five best; where one class holds most positions, as CTC's blank
does, top-1 also over the other positions). Latency: the int8 model's ratio to the float original
on onnxruntime CPU (ORT_ENABLE_ALL) and OpenVINO CPU, one thread, paired and interleaved
by ``opfuse.tuning.measure`` with the original measured twice (the noise)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "quant"
# OPFUSE_ZOO: the zoo's folder where it is not ../shared/zoo (a git worktree elsewhere)
ZOO_SRC = Path(os.environ.get("OPFUSE_ZOO", ROOT.parent / "shared" / "zoo"))
DOCS = ROOT / "docs" / "BENCHMARKS.md"
PACKAGES = {
    "rapidocr": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"),
    "skimage": ("scikit-image==0.26.0", "scikit_image-0.26.0-*.whl"),
}
OCR_MODELS = {
    "ppocr_det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "ppocr_rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "ppocr_cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
TEXT_IMAGES = ("page.png", "text.png")
PHOTOS = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "cell.png",
    "chelsea.png",
    "clock_motion.png",
    "coffee.png",
    "coins.png",
    "color.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "logo.png",
    "moon.png",
    "motorcycle_left.png",
    "retina.jpg",
    "rocket.jpg",
    "page.png",
    "text.png",
)
ALL_MODELS = ("ppocr_rec", "ppocr_cls", "ppocr_det", "keras_mobilenetv3small")
TOOLS = ("opfuse", "onnxruntime", "nncf")
MAP_THRESHOLD = 0.3  # PaddleOCR's detector binarizes its score map here (det_db_thresh)
MARK_BEGIN = "<!-- bench.quant begin -->"
MARK_END = "<!-- bench.quant end -->"


@dataclass
class Case:
    """A model file, its calibration samples and the held-back ones, and whether its
    first output scores classes."""

    name: str
    path: Path
    calibration: list[dict[str, np.ndarray]]
    evaluation: list[dict[str, np.ndarray]]
    classes: bool
    note: str


# ---------------------------------------------------------------------------- downloads


def download(key: str, dest: Path) -> Path:
    """The wheel of PACKAGES[key] in ``dest`` (``pip download --no-deps`` once)."""
    spec, pattern = PACKAGES[key]
    found = sorted(dest.glob(pattern))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        cmd += ["--only-binary=:all:", "-d", str(dest), spec]
        subprocess.run(cmd, check=True)
        found = sorted(dest.glob(pattern))
    return found[-1]


def extract(wheel: Path, member: str, dest: Path) -> Path:
    out = dest / Path(member).name
    if not out.exists():
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            out.write_bytes(zf.read(member))
    return out


def image(wheel: Path, name: str, dest: Path) -> Any:
    from PIL import Image

    return Image.open(extract(wheel, f"skimage/data/{name}", dest / "images")).convert("RGB")


# ------------------------------------------------------------------------------ samples


def text_lines(page: Any) -> list[Any]:
    """The text lines of a scanned page (grayscale as RGB): bands of rows with ink, ink
    being pixels 50 levels darker than the lightest pixel within 7 px (the page's light
    falls off unevenly)."""
    from numpy.lib.stride_tricks import sliding_window_view

    gray = np.asarray(page.convert("L"), dtype=np.float32)
    background = sliding_window_view(np.pad(gray, 7, mode="edge"), (15, 15)).max(axis=(2, 3))
    rows = ((background - gray) > 50).mean(axis=1) > 0.04
    lines, start = [], None
    for y, ink in enumerate([*rows, False]):
        if ink and start is None:
            start = y
        elif not ink and start is not None:
            if y - start >= 8:
                lines.append(page.crop((0, max(0, start - 3), page.size[0], y + 3)))
            start = None
    return lines


def text_crops(lines: list[Any], height: int, width: int, rotate: bool) -> list[np.ndarray]:
    """Windows along text lines with the model's aspect ratio (half a window apart),
    resized to height x width, PaddleOCR's normalization ((x/255 - 0.5) / 0.5), NCHW;
    with ``rotate`` every other window is turned 180 degrees (the direction classifier's
    two classes)."""
    from PIL import Image

    crops = []
    for line in lines:
        w, h = line.size
        cw = min(w, h * width // height)
        for x in range(0, max(1, w - cw + 1), max(1, cw // 2)):
            crop = line.crop((x, 0, x + cw, h)).resize((width, height), Image.BILINEAR)
            if rotate and len(crops) % 2:
                crop = crop.rotate(180)
            arr = np.asarray(crop, dtype=np.float32) / 255.0
            crops.append(((arr - 0.5) / 0.5).transpose(2, 0, 1)[None].copy())
    return crops


def photos(images: list[Any], size: int, layout: str, imagenet: bool) -> list[np.ndarray]:
    """Photos resized to size x size; ImageNet mean/std on [0, 1] (PaddleOCR's detector)
    or raw 0..255 (a Keras model with its own Rescaling); NCHW or NHWC."""
    from PIL import Image

    out = []
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    for img in images:
        arr = np.asarray(img.resize((size, size), Image.BILINEAR), dtype=np.float32)
        if imagenet:
            arr = (arr / 255.0 - mean) / std
        if layout == "NCHW":
            arr = arr.transpose(2, 0, 1)
        out.append(arr[None].astype(np.float32).copy())
    return out


def input_name(path: Path) -> str:
    import onnx

    model = onnx.load_model(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    return next(i.name for i in model.graph.input if i.name not in inits)


MIN_OPSET = 13  # per-channel DequantizeLinear (its axis) needs opset 13


def at_least_opset_13(path: Path) -> tuple[Path, str]:
    """``path``, or a copy converted to opset 13 when it is older: every tool starts from
    the same float model, and onnxruntime's quantize_static writes per-channel
    DequantizeLinear nodes that are invalid below 13 (it does not upgrade)."""
    import onnx
    from onnx import version_converter

    model = onnx.load_model(str(path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= MIN_OPSET:
        return path, ""
    out = path.with_name(f"{path.stem}.opset{MIN_OPSET}.onnx")
    if not out.exists():
        onnx.save_model(version_converter.convert_version(model, MIN_OPSET), str(out))
    return out, f"; opset {opset} converted to {MIN_OPSET} for every tool"


def cases(names: list[str], work: Path) -> Iterator[Case]:
    """Each model's case, made when its turn comes."""
    dl = work / "downloads"
    sk = download("skimage", dl)
    lines = text_lines(image(sk, "page.png", dl))
    pics = [image(sk, n, dl) for n in PHOTOS]
    for name in names:
        if name in OCR_MODELS:
            path = extract(download("rapidocr", dl), OCR_MODELS[name], dl / "models")
            path, converted = at_least_opset_13(path)
            inp = input_name(path)
            if name == "ppocr_det":
                arrays = photos(pics, 320, "NCHW", imagenet=True)
                calib, held = arrays[0::2], arrays[1::2]
                note = "PP-OCRv4 text detector (trained), photos and pages 320x320; a score map"
            else:  # calibrate on the even text lines, evaluate on the odd ones
                width, rotate = (320, False) if name == "ppocr_rec" else (192, True)
                calib = text_crops(lines[0::2], 48, width, rotate)
                held = text_crops(lines[1::2], 48, width, rotate)
                note = (
                    f"PP-OCRv4 recognizer (trained), windows of {len(lines)} text lines of a "
                    "scanned page, calibration and held-back from different lines; per step"
                    if name == "ppocr_rec"
                    else "PP-OCR text direction classifier (trained, 2 classes), the same "
                    "windows 48x192, every other turned 180 degrees"
                )
            yield Case(
                name,
                path,
                [{inp: a} for a in calib],
                [{inp: a} for a in held],
                name != "ppocr_det",
                note + converted,
            )
        elif name.startswith("keras_"):
            zoo = work / "zoo"
            if not (zoo / f"{name}.onnx").exists():
                cmd = [sys.executable, str(ZOO_SRC / "materialize.py"), str(zoo), name]
                subprocess.run(cmd, check=True, capture_output=True)
            path = zoo / f"{name}.onnx"
            arrays = photos(pics, 224, "NHWC", imagenet=False)
            inp = input_name(path)
            note = (
                "the zoo's Keras export (decomposed BN, NHWC), photos 224x224; random weights: "
                "its softmax is near uniform (about 0.001 per class), below the 1/255 step of "
                "the [0, 1] range onnxruntime's quantizer fixes for a Softmax output, so that "
                "int8 output is all zero: structure and speed only"
            )
            yield Case(
                name,
                path,
                [{inp: a} for a in arrays[0::2]],
                [{inp: a} for a in arrays[1::2]],
                True,
                note,
            )
        else:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL_MODELS)}")


# -------------------------------------------------------------------------------- tools


def stack(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}


def reader(samples: list[dict[str, np.ndarray]]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    return Reader()


def ort_quantize(case: Case, out: Path, tmp: Path) -> None:
    """onnxruntime's own pipeline: quant_pre_process, then quantize_static."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = tmp / "pre.onnx"
    try:
        quant_pre_process(str(case.path), str(pre))
    except Exception as exc:  # its symbolic shape inference asserts on some real models
        print(f"   onnxruntime: quant_pre_process failed ({error(exc)}); "
              "retried with skip_symbolic_shape=True", flush=True)  # fmt: skip
        if "quant_pre_process" not in case.note:
            case.note += (
                "; onnxruntime's quant_pre_process fails on it (symbolic shape inference) "
                "and ran with skip_symbolic_shape=True"
            )
        quant_pre_process(str(case.path), str(pre), skip_symbolic_shape=True)
    quantize_static(
        str(pre),
        str(out),
        reader(case.calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )


def opfuse_quantize(case: Case, out: Path, tmp: Path, **settings: Any) -> None:
    """opfuse quantize through the Python API, the same data; the gate off (no other
    column has one) so the figures compare the quantized models themselves. ``settings``:
    other keywords of ``opfuse.quantize`` (the setting sweep's rows)."""
    import opfuse

    if not hasattr(opfuse, "quantize"):
        raise RuntimeError("opfuse.quantize is not in this build")
    calib, held = tmp / "calibration.npz", tmp / "eval.npz"
    np.savez(calib, **stack(case.calibration))
    np.savez(held, **stack(case.evaluation))
    opfuse.quantize(
        str(case.path),
        output=str(out),
        calibration=str(calib),
        eval=str(held),
        **{"max_drop": "off", **settings},
        benchmark=False,
    )  # fmt: skip  (the bench measures)


def nncf_quantize(case: Case, out: Path, tmp: Path) -> None:
    """NNCF's post-training quantization for ONNX (its defaults: symmetric int8, MinMax
    on the same samples)."""
    if importlib.util.find_spec("nncf") is None:
        raise RuntimeError("nncf is not installed")
    import nncf
    import onnx

    model = onnx.load_model(str(case.path))
    dataset = nncf.Dataset(case.calibration)
    quantized = nncf.quantize(model, dataset, subset_size=len(case.calibration))
    onnx.save_model(quantized, str(out))


QUANTIZERS: dict[str, Callable[[Case, Path, Path], None]] = {
    "opfuse": opfuse_quantize,
    "onnxruntime": ort_quantize,
    "nncf": nncf_quantize,
}
# opfuse with one setting changed from its defaults: the measurement behind the defaults
# (``--tools opfuse,opfuse-entropy,...``; not in the default run)
SETTING_SWEEP: dict[str, dict[str, Any]] = {
    "opfuse-entropy": {"calibrate_method": "entropy"},
    "opfuse-percentile": {"calibrate_method": "percentile"},
    "opfuse-per-tensor": {"per_channel": False},
    "opfuse-int8-activations": {"activation_type": "int8"},
    "opfuse-gate": {"max_drop": "auto"},  # the default gate and its float fallback
}
QUANTIZERS.update(
    {name: functools.partial(opfuse_quantize, **kw) for name, kw in SETTING_SWEEP.items()}
)


# ------------------------------------------------------------------------------ figures


def outputs(path: Path, samples: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The first output of every sample, onnxruntime CPU at ORT_ENABLE_ALL (the way the
    int8 model is deployed: its integer kernels exist only after the QDQ fusion)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(sess.run(None, s)[0], dtype=np.float64) for s in samples]


def accuracy(ref: list[np.ndarray], got: list[np.ndarray], classes: bool) -> dict[str, float]:
    r = np.concatenate([a.ravel() for a in ref])
    g = np.concatenate([a.ravel() for a in got])
    err = float(np.sum((r - g) ** 2))
    figures = {
        "sqnr_db": float(10 * np.log10(np.sum(r**2) / err)) if err else float("inf"),
        "cosine": float(np.dot(r, g) / (np.linalg.norm(r) * np.linalg.norm(g) or 1.0)),
        "max_abs": float(np.max(np.abs(r - g))),
    }
    if not classes and r.min() >= 0 and r.max() <= 1:  # a probability map (the detector's)
        ink_r, ink_g = r > MAP_THRESHOLD, g > MAP_THRESHOLD
        union = np.sum(ink_r | ink_g)
        figures["map_iou"] = float(np.sum(ink_r & ink_g) / union) if union else 1.0
    if classes:
        rc = np.concatenate([a.reshape(-1, a.shape[-1]) for a in ref])
        gc = np.concatenate([a.reshape(-1, a.shape[-1]) for a in got])
        top1 = rc.argmax(-1)
        same = top1 == gc.argmax(-1)
        figures["top1"] = float(np.mean(same))
        # a class most positions share (CTC's blank) makes top-1 easy: also without it
        common = np.bincount(top1).argmax()
        if np.mean(top1 == common) > 0.5 and np.any(top1 != common):
            figures["top1_rare"] = float(np.mean(same[top1 != common]))
            figures["common_share"] = float(np.mean(top1 == common))
        if rc.shape[-1] > 5:
            top5 = np.argsort(-gc, axis=-1)[:, :5]
            figures["top5"] = float(np.mean((top5 == top1[:, None]).any(-1)))
        figures["positions"] = int(rc.shape[0])
    return figures


def latency(case: Case, models: dict[str, Path], runtime_name: str, seconds: float) -> dict:
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import measure

    runtime = get_runtime(runtime_name, threads=1)
    m = measure(case.path, {k: str(v) for k, v in models.items()}, runtime, seconds=seconds,
                feeds=case.evaluation[0])  # fmt: skip
    return {"runtime": m.runtime, "noise": m.noise, "rounds": m.rounds,
            "float_ms": m.original_s * 1000,
            "ratio": {label: m.ratio(label) for label in models}}  # fmt: skip


def error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(exc).__name__


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnx

    from bench.measure import node_count
    from opfuse.quantization.kernels import integer_coverage
    from opfuse.runtime.cpu import cpu_features

    work: Path = args.out
    cpu = cpu_features()
    results: dict[str, Any] = {"cpu": cpu.describe(), "verdict": cpu.int8_verdict(), "models": {}}
    for case in cases(args.models, work):
        print(f"== {case.name}: {len(case.calibration)} calibration, "
              f"{len(case.evaluation)} held-back samples", flush=True)  # fmt: skip
        case.note += f"; {len(case.calibration)} calibration, {len(case.evaluation)} held back"
        row: dict[str, Any] = {"note": case.note, "float_nodes": node_count(case.path),
                               "tools": {}}  # fmt: skip
        ref = outputs(case.path, case.evaluation)
        made: dict[str, Path] = {}
        for tool in args.tools:
            out = work / "int8" / f"{case.name}.{tool}.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            cell: dict[str, Any] = {}
            with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
                start = time.perf_counter()
                try:  # in the temp folder: quant_pre_process leaves files in the cwd
                    with contextlib.chdir(tmp):
                        QUANTIZERS[tool](case, out.resolve(), Path(tmp))
                except Exception as exc:  # one cell of the table, not the run
                    cell["error"] = error(exc)
                    print(f"   {tool}: {cell['error']}", flush=True)
                    row["tools"][tool] = cell
                    continue
                cell["quantize_s"] = time.perf_counter() - start
            try:
                cell["nodes"] = node_count(out)
                cov = integer_coverage(onnx.load_model(str(out)))
                cell["int8_macs"] = cov.integer_fraction
                cell["float_between_qdq"] = sum(cov.float_between_qdq.values())
                cell["accuracy"] = accuracy(ref, outputs(out, case.evaluation), case.classes)
            except Exception as exc:  # an invalid int8 model is a finding, not a crash
                cell = {"error": f"its int8 model does not run: {error(exc)}"}
                print(f"   {tool}: {cell['error']}", flush=True)
                row["tools"][tool] = cell
                continue
            made[tool] = out
            row["tools"][tool] = cell
            print(f"   {tool}: {cell}", flush=True)
        for runtime_name in args.runtimes:
            if not made:
                break
            try:
                lat = latency(case, made, runtime_name, args.seconds)
            except Exception as exc:
                lat = {"error": error(exc)}
            row.setdefault("latency", {})[runtime_name] = lat
            print(f"   {runtime_name}: {lat}", flush=True)
        row["note"] = case.note  # with what the tools had to do to it
        results["models"][case.name] = row
    return results


# ------------------------------------------------------------------------------- report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def top1_text(acc: dict[str, Any]) -> str:
    """``97.5%``, or ``96.5% (94.2% off the common class)`` when one class (CTC's blank)
    holds most positions; for a probability map, the IoU of its pixels above 0.3."""
    if "map_iou" in acc:
        return f"map IoU {_pct(acc['map_iou'])}"
    text = _pct(acc.get("top1"))
    if "top1_rare" in acc:
        text += f" ({_pct(acc['top1_rare'])} off the common class)"
    return text


def table(results: dict[str, Any], command: str) -> str:
    lines = [
        MARK_BEGIN,
        f"Measured with `{command}` on a CPU with {results['cpu']}; onnxruntime "
        f"{results.get('onnxruntime', '?')}, OpenVINO {results.get('openvino', 'not installed')}, "
        f"NNCF {results.get('nncf', 'not installed')}. Every tool gets the same float model and "
        "calibration samples and the same settings (static QDQ, per-channel int8 weights, "
        "uint8 activations, MinMax; NNCF: its defaults). Accuracy against the float model "
        "on held-back samples no tool calibrated on (top-1: the same class; where one class, "
        "CTC's blank, holds most steps, also over the other steps; map IoU: the detector's "
        "pixels above 0.3). Latency: the int8 model's median time over the float "
        "original's (paired, interleaved, one thread; below 1 is faster), noise = the "
        "original measured twice. MACs in int8 kernels: the share of the Conv/MatMul/Gemm "
        "multiply-adds onnxruntime runs in integer kernels after its QDQ fusion "
        "(opfuse.quantization.kernels), and the float ops it leaves between DQ and Q. "
        f"What the CPU's features predict: {results.get('verdict', '')}",
        "",
        "| model | tool | SQNR dB | cosine | top-1 (or map IoU) | top-5 | ORT CPU ratio | OpenVINO ratio "
        "| MACs in int8 kernels (float ops between DQ and Q) | nodes (float) | quantize s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["models"].items():
        lat = row.get("latency", {})
        for tool, cell in row["tools"].items():
            if "error" in cell:
                lines.append(f"| {name} | {tool} | {cell['error']} |  |  |  |  |  |  |  |  |")
                continue
            acc = cell["accuracy"]
            ratios = []
            for rt in ("onnxruntime", "openvino"):
                m = lat.get(rt, {})
                if "ratio" in m and tool in m["ratio"]:
                    ratios.append(f"{m['ratio'][tool]:.2f}x (+-{m['noise']:.0%})")
                else:
                    ratios.append(m.get("error", "-")[:40] if m else "-")
            lines.append(
                f"| {name} | {tool} | {acc['sqnr_db']:.1f} | {acc['cosine']:.4f} "
                f"| {top1_text(acc)} | {_pct(acc.get('top5'))} | {ratios[0]} "
                f"| {ratios[1]} | {_pct(cell.get('int8_macs'))} ({cell.get('float_between_qdq', '-')}) "
                f"| {cell['nodes']} ({row['float_nodes']}) "
                f"| {cell['quantize_s']:.1f} |"
            )
    lines.append("")
    for name, row in results["models"].items():
        floats = {rt: m.get("float_ms") for rt, m in row.get("latency", {}).items()}
        ms = ", ".join(f"{rt} {v:.2f} ms" for rt, v in floats.items() if v)
        lines.append(f"- {name}: {row['note']}" + (f" (float: {ms})" if ms else ""))
    lines.append(MARK_END)
    return "\n".join(lines) + "\n"


def write_docs(path: Path, section: str) -> None:
    text = path.read_text(encoding="utf-8")
    if MARK_BEGIN in text:
        head, rest = text.split(MARK_BEGIN, 1)
        text = head + section.rstrip("\n") + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## int8 quantization (bench/quant.py)\n\n" + section
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.quant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--models", default=",".join(ALL_MODELS))
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--runtimes", default="onnxruntime,openvino")
    p.add_argument("--seconds", type=float, default=8.0, help="latency budget per runtime")
    p.add_argument("--out", type=Path, default=OUT, help="downloads and results (ignored)")
    p.add_argument("--docs", type=Path, default=None, help=f"update the section in e.g. {DOCS}")
    args = p.parse_args(argv)
    args.out = args.out.resolve()  # the quantizers run in a temp folder
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in ALL_MODELS]
    if unknown:
        p.error(f"unknown model {unknown[0]!r}; known: {', '.join(ALL_MODELS)}")
    args.tools = [t for t in args.tools.split(",") if t]
    unknown = [t for t in args.tools if t not in QUANTIZERS]
    if unknown:
        p.error(f"unknown tool {unknown[0]!r}; known: {', '.join(QUANTIZERS)}")
    args.runtimes = [r for r in args.runtimes.split(",") if r]
    if "openvino" in args.runtimes and importlib.util.find_spec("openvino") is None:
        print("OpenVINO is not installed: its column is left out", file=sys.stderr)
        args.runtimes.remove("openvino")
    return args


def main(argv: list[str] | None = None) -> int:
    import onnxruntime

    args = parse_args(argv)
    results = run(args)
    results["onnxruntime"] = onnxruntime.__version__
    if importlib.util.find_spec("openvino") is not None:
        import openvino

        results["openvino"] = openvino.__version__.split("-")[0]
    if importlib.util.find_spec("nncf") is not None:
        from importlib.metadata import version

        results["nncf"] = version("nncf")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    command = "python -m bench.quant " + " ".join(argv if argv is not None else sys.argv[1:])
    section = table(results, command.strip())
    print(section)
    if args.docs is not None:
        write_docs(args.docs, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
