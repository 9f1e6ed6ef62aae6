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
import onnx

from opfuse.errors import OpfuseError
from opfuse.quantization.preprocess import Preprocess

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelInput:
    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


def model_inputs(path: str | os.PathLike[str] | onnx.ModelProto) -> list[ModelInput]:
    """The graph inputs that are not initializers, with their dtypes and shapes."""
    import onnx

    proto = (
        path
        if isinstance(path, onnx.ModelProto)
        else onnx.load_model(str(path), load_external_data=False)
    )
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
    return _arrays_samples(arrays, inputs, path)


def _arrays_samples(
    arrays: dict[str, np.ndarray], inputs: Sequence[ModelInput], path: Path
) -> list[Sample]:
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in arrays]
    extra = [k for k in arrays if k not in names and k != LABELS]
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


FEW_EVAL_SAMPLES = 10  # accuracy on fewer samples than this is warned about


def split(samples: list[Sample], eval_share: float = 0.25) -> tuple[list[Sample], list[Sample]]:
    """(calibration, held back for evaluation): every k-th sample held back, so both
    parts span the data; at least one sample each, and a held-back sample is never a
    calibration sample (2 samples: 1 and 1; 3: 2 and 1). One sample is refused."""
    if len(samples) < 2:
        raise OpfuseError(
            "--calibration holds 1 sample: give at least 2 (one is held back to measure "
            "accuracy), or give --eval"
        )
    step = max(2, round(1 / eval_share))
    held_at = set(range(step - 1, len(samples), step)) or {len(samples) - 1}
    kept = [s for i, s in enumerate(samples) if i not in held_at]
    held = [s for i, s in enumerate(samples) if i in held_at]
    return kept, held


MIN_VALIDATION_SPLIT = 8  # calibration samples below which no validation part is held
# (from 8 on, at least 2 validation samples: one alone chooses by noise)


def validation_split(samples: list[Sample]) -> tuple[list[Sample], list[Sample], bool]:
    """(calibration part, validation part, whether they are apart): the recipes are
    chosen on the validation part, never on the evaluation data. Below
    MIN_VALIDATION_SPLIT samples both parts are all the samples (said)."""
    if len(samples) < MIN_VALIDATION_SPLIT:
        return samples, samples, False
    calib, valid = split(samples)
    return calib, valid, True


def from_arrays(data: object, inputs: Sequence[ModelInput], where: str) -> list[Sample]:
    """Samples given in memory (the Python API): a mapping of arrays named after the
    inputs with N samples along the first axis (as an .npz), or an iterable of feeds (one
    mapping of input name -> array per sample), each checked like a file's."""
    from collections.abc import Iterable, Mapping

    path = Path(where)
    if isinstance(data, Mapping):
        arrays = {}
        for key, value in data.items():
            if not isinstance(key, str):
                raise OpfuseError(f"{where}: keys are the model's input names, got {key!r}")
            arrays[key] = _array(value, f"{where}[{key!r}]")
        return _arrays_samples(arrays, inputs, path)
    if isinstance(data, str | bytes | np.ndarray) or not isinstance(data, Iterable):
        raise OpfuseError(
            f"{where}: expected a path, a mapping of input name -> array (N samples on "
            f"axis 0) or an iterable of feeds, got {type(data).__name__}"
        )
    samples = []
    names = [i.name for i in inputs]
    for k, feed in enumerate(data):
        if not isinstance(feed, Mapping):
            raise OpfuseError(
                f"{where}: sample {k} is a {type(feed).__name__}, expected a mapping of "
                f"input name -> array"
            )
        if sorted(feed) != sorted(names):
            raise OpfuseError(
                f"{where}: sample {k} has {sorted(feed)}, the model's inputs are {names}"
            )
        samples.append(
            {
                spec.name: _checked(
                    _array(feed[spec.name], f"{where}[{k}][{spec.name!r}]"), spec, path
                )
                for spec in inputs
            }
        )
    if not samples:
        raise OpfuseError(f"{where}: holds no samples")
    return samples


def _array(value: object, where: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise OpfuseError(f"{where}: not an array ({exc})") from None
    if array.dtype.kind not in "biuf":
        raise OpfuseError(f"{where}: not an array of numbers ({array.dtype})")
    return array


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


LABELS = "labels"  # an eval .npz's (or mapping's) array of one class index per sample


def read_labels(data: object, inputs: Sequence[ModelInput]) -> np.ndarray | None:
    """The ``labels`` array of an eval ``.npz`` file or mapping (not a model input of that
    name), one class index per sample; None where there is none."""
    from collections.abc import Mapping

    if any(i.name == LABELS for i in inputs):
        return None
    if isinstance(data, Mapping):
        return None if LABELS not in data else _array(data[LABELS], f"eval[{LABELS!r}]")
    if not isinstance(data, str | os.PathLike) or not Path(data).is_file():
        return None
    with np.load(data, allow_pickle=False) as arrays:
        return np.asarray(arrays[LABELS]) if LABELS in arrays.files else None


def check_finite(samples: Sequence[Sample], where: str) -> None:
    """A NaN or an infinity in a float array: one line naming the array and the sample
    (calibration ranges and accuracy figures on them mean nothing: exit 2)."""
    for i, sample in enumerate(samples):
        for name, array in sample.items():
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                what = "NaN" if np.isnan(array).any() else "an infinity"
                raise OpfuseError(
                    f"{where}: sample {i}, array {name!r} holds {what}: give finite values "
                    "(a NaN makes every range and figure meaningless)"
                )
