"""The user's samples for calibration and evaluation: an ``.npz`` whose arrays are named
after the model's inputs with N samples along the first axis, a folder of ``.npz`` files
(one sample each), or a folder of images with ``--preprocess``. Every sample is checked
against the model's inputs (names, dtypes, ranks and fixed dims); a bad one is a one-line
OpfuseError naming the file and what is wrong."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.quantization.preprocess import Preprocess

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelInput:
    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


def model_inputs(path: str | os.PathLike[str]) -> list[ModelInput]:
    """The graph inputs that are not initializers, with their dtypes and shapes."""
    import onnx

    proto = onnx.load_model(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    found = []
    for value in proto.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor.shape.dim
        )
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        found.append(ModelInput(value.name, dtype, dims))
    return found


def read_samples(
    source: str | os.PathLike[str],
    inputs: Sequence[ModelInput],
    preprocess: Preprocess | None = None,
) -> list[Sample]:
    """Every sample in ``source`` (see the module), checked against ``inputs``."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        npz = [p for p in files if p.suffix == ".npz"]
        images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
        if npz:
            samples = [s for p in npz for s in _npz_samples(p, inputs)]
        elif images:
            samples = [_image_sample(p, inputs, preprocess) for p in images]
        else:
            raise OpfuseError(f"{path}: no .npz files or images in the folder")
    elif path.is_file():
        samples = _npz_samples(path, inputs)
    else:
        raise OpfuseError(f"{path}: no such file or folder")
    if not samples:
        raise OpfuseError(f"{path}: holds no samples")
    return samples


def _npz_samples(path: Path, inputs: Sequence[ModelInput]) -> list[Sample]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise OpfuseError(f"{path}: not a readable .npz ({exc})") from None
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in arrays]
    extra = [k for k in arrays if k not in names]
    if missing or extra:
        raise OpfuseError(
            f"{path}: arrays {sorted(arrays)} do not match the model's inputs {names}"
            + (f" (missing {missing})" if missing else "")
            + (f" (not inputs: {extra})" if extra else "")
        )
    counts = {arrays[i.name].shape[0] if arrays[i.name].ndim else 0 for i in inputs}
    if len(counts) != 1 or 0 in counts:
        raise OpfuseError(
            f"{path}: every input needs its samples along the first axis; the arrays hold "
            f"{sorted(counts)} samples"
        )
    samples = []
    for k in range(counts.pop()):
        sample = {}
        for spec in inputs:
            array = arrays[spec.name]
            # N x (the input's shape): sample k is array[k]; N x ... of the input's rank:
            # samples along its batch axis, fed one at a time
            one = np.asarray(array[k]) if array.ndim == len(spec.shape) + 1 else array[k : k + 1]
            sample[spec.name] = _checked(one, spec, path)
        samples.append(sample)
    return samples


def _checked(array: np.ndarray, spec: ModelInput, path: Path) -> np.ndarray:
    where = f"{path}: input {spec.name!r}"
    if array.dtype != spec.dtype:
        raise OpfuseError(f"{where} is {array.dtype}, the model takes {spec.dtype}")
    if array.ndim != len(spec.shape):
        raise OpfuseError(f"{where} has rank {array.ndim}, the model takes {len(spec.shape)}")
    for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
        if isinstance(want, int) and want > 0 and got != want:
            raise OpfuseError(
                f"{where} has shape {list(array.shape)}, the model fixes dim {axis} at {want}"
            )
    return array


def _image_sample(
    path: Path, inputs: Sequence[ModelInput], preprocess: Preprocess | None
) -> Sample:
    if preprocess is None:
        raise OpfuseError(f"{path.parent}: images need --preprocess (size, layout, mean, std...)")
    if len(inputs) != 1:
        raise OpfuseError(
            f"{path.parent}: images feed a model with one input; this one has "
            f"{[i.name for i in inputs]}"
        )
    return {inputs[0].name: _checked(preprocess.image(path), inputs[0], path)}


def first(samples: list[Sample], count: int | None, where: str) -> list[Sample]:
    """The first ``count`` samples (``--samples``, at least 1, checked before the data is
    read; None: all); fewer in ``where`` than asked for is bad input."""
    if count is None:
        return samples
    if len(samples) < count:
        raise OpfuseError(f"{where}: {len(samples)} samples, --samples asks for {count}")
    return samples[:count]


def split(samples: list[Sample], eval_share: float = 0.25) -> tuple[list[Sample], list[Sample]]:
    """(calibration, held back for evaluation): every k-th sample held back, so both
    parts span the data; at least one sample each."""
    if len(samples) < 2:
        raise OpfuseError(
            "--calibration holds 1 sample: give at least 2 (one is held back to measure "
            "accuracy), or give --eval"
        )
    step = max(2, round(1 / eval_share))
    held = samples[step - 1 :: step] or samples[-1:]
    kept = [s for i, s in enumerate(samples) if (i + 1) % step != 0] if len(held) > 0 else samples
    return kept, held


def random_samples(inputs: Sequence[ModelInput], n: int, seed: int = 0) -> list[Sample]:
    """Standard-normal samples (``--calibration random``: structure and speed only)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sample = {}
        for spec in inputs:
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
            sample[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        out.append(sample)
    return out
