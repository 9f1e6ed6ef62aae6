"""Numeric comparison of two models under onnxruntime with its own optimizations off,
so that onnxruntime's fusions cannot hide a broken one of ours."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from opfuse.errors import OpfuseError, VerificationError

# optimized model metadata: {input name: permutation from the original's layout}
INPUT_PERMUTATION_KEY = "opfuse.input_permutation"

ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
DEFAULT_BATCH = 1
DEFAULT_DIM = 32  # sequence length and other symbolic dims


def session(
    path: str | os.PathLike[str], optimize: bool = False, threads: int = 0
) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OpfuseError(f"{path}: onnxruntime cannot load the model: {first}") from None


def parse_input_shapes(specs: list[str] | None) -> dict[str, list[int]]:
    """``name:1,3,224,224`` items to a dict."""
    shapes: dict[str, list[int]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise OpfuseError(
                f"--input-shape {spec!r}: expected NAME:D0,D1,... with integers"
            ) from None
        if any(d < 0 for d in shapes[name]):
            raise OpfuseError(f"--input-shape {spec!r}: dims must be 0 or more")
    return shapes


def _dims_text(dims: list[int | str | None]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"


def declared_shape(
    spec: ort.NodeArg, model: str | os.PathLike[str] | None
) -> list[int | str | None] | None:
    """The dims a model declares for an input; None where its rank is unknown.
    onnxruntime reports an unknown rank as [] (a scalar's too): the model file tells."""
    if spec.shape or model is None:
        return list(spec.shape) if spec.shape else None
    import onnx

    proto = onnx.load_model(str(model), load_external_data=False)
    for value in proto.graph.input:
        if value.name == spec.name and value.type.tensor_type.HasField("shape"):
            return []
    return None


def check_input_shape(
    spec: ort.NodeArg, dims: list[int], model: str | os.PathLike[str] | None = None
) -> None:
    """``--input-shape`` dims must have the input's rank and keep its fixed dims."""
    declared = declared_shape(spec, model)
    if declared is None:
        return
    given = f"--input-shape {spec.name}:{','.join(map(str, dims))}"
    if len(dims) != len(declared):
        raise OpfuseError(
            f"{given}: input {spec.name!r} has rank {len(declared)} {_dims_text(declared)}; "
            f"give {len(declared)} dims"
        )
    for i, (d, a) in enumerate(zip(declared, dims, strict=True)):
        if isinstance(d, int) and d >= 0 and d != a:
            raise OpfuseError(
                f"{given}: input {spec.name!r} is {_dims_text(declared)}, its dim {i} is fixed at {d}"
            )


def make_inputs(
    sess: ort.InferenceSession,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
    model: str | os.PathLike[str] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random inputs for every model input, or the arrays of an ``.npz``.
    ``model``: the session's file, read only to tell a scalar input from an unknown rank."""
    specs = sess.get_inputs()
    names = [i.name for i in specs]
    for name in input_shapes or {}:
        if name not in names:
            raise OpfuseError(
                f"--input-shape names {name!r}, which is not a model input ({', '.join(names)})"
            )
    for spec in specs:
        if input_shapes and spec.name in input_shapes:
            check_input_shape(spec, input_shapes[spec.name], model)
    if inputs_npz is not None:
        return _load_npz(inputs_npz, specs)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        dtype = ORT_DTYPES.get(spec.type)
        if dtype is None:
            raise OpfuseError(
                f"input {spec.name!r} has type {spec.type}, which verify cannot generate"
            )
        given = (input_shapes or {}).get(spec.name)
        shape = (
            given
            if given is not None
            else [
                d if isinstance(d, int) and d >= 0 else (DEFAULT_BATCH if i == 0 else DEFAULT_DIM)
                for i, d in enumerate(spec.shape)
            ]
        )
        feeds[spec.name] = _random(rng, dtype, shape)
    return feeds


def _random(rng: np.random.Generator, dtype: type, shape: list[int]) -> np.ndarray:
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype in (np.uint8, np.int8):
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)  # indices and masks stay in range


def _load_npz(path: str | os.PathLike[str], specs: list) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise OpfuseError(f"{path}: cannot read inputs .npz: {exc}") from None
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name not in arrays:
            raise OpfuseError(f"{path}: has no array for model input {spec.name!r}")
        array = arrays.pop(spec.name)
        dtype = ORT_DTYPES.get(spec.type)
        if dtype is not None and array.dtype != dtype:
            raise OpfuseError(
                f"{path}: array {spec.name!r} is {array.dtype}, the input is {spec.type}"
            )
        if len(array.shape) != len(spec.shape) or any(
            isinstance(d, int) and d >= 0 and d != a
            for d, a in zip(spec.shape, array.shape, strict=True)
        ):
            raise OpfuseError(
                f"{path}: array {spec.name!r} has shape {list(array.shape)}, the input is {spec.shape}"
            )
        feeds[spec.name] = array
    if arrays:
        raise OpfuseError(f"{path}: array {sorted(arrays)[0]!r} is not a model input")
    return feeds


def run_model(
    sess: ort.InferenceSession, feeds: dict[str, np.ndarray], path: str | os.PathLike[str]
) -> list[np.ndarray]:
    """One inference; a model that cannot run on these inputs (dims that contradict each
    other or the model) is a one-line error naming the file."""
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # the failure is reported once, below, not logged too
    try:
        return list(sess.run(None, feeds, quiet))
    except Exception as exc:  # onnxruntime raises its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        raise OpfuseError(
            f"{path}: onnxruntime cannot run the model on inputs {shapes}: {first}"
        ) from None


@dataclass
class OutputDiff:
    name: str
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""
    # the bound applied: |got - ref| <= abs_bound + rtol * |ref| (abs_bound is atol scaled
    # by the output's magnitude); used: the worst element's error as a share of its bound
    abs_bound: float = 0.0
    used: float = 0.0


@dataclass
class VerifyReport:
    outputs: list[OutputDiff]
    rtol: float
    atol: float
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    seed: int | None = None  # None: the inputs came from an .npz
    feeds: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def failure(self) -> str:
        bad = [o for o in self.outputs if not o.ok]
        return "; ".join(
            f"output {o.name!r} {o.detail or f'differs by {o.max_abs:.3g} (relative {o.max_rel:.3g})'}"
            for o in bad
        )

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "rtol": self.rtol,
            "atol": self.atol,
            "input_shapes": self.input_shapes,
            "seed": self.seed,
            "outputs": [o.__dict__ for o in self.outputs],
        }


def compare_arrays(
    name: str, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float
) -> OutputDiff:
    """Allclose with atol scaled by the output's magnitude: ``|got - ref| <= atol *
    max(1, max|ref|) + rtol * |ref|``, NaN and inf only where the reference has them."""
    if ref.shape != got.shape:
        return OutputDiff(
            name,
            float("inf"),
            float("inf"),
            False,
            f"has shape {list(got.shape)}, expected {list(ref.shape)}",
        )
    if ref.size == 0:
        return OutputDiff(name, 0.0, 0.0, True)
    if not np.issubdtype(ref.dtype, np.number) or not np.issubdtype(ref.dtype, np.inexact):
        same = bool(np.array_equal(ref, got))
        return OutputDiff(
            name,
            0.0 if same else float("inf"),
            0.0 if same else float("inf"),
            same,
            "" if same else "differs (exact dtype)",
        )
    r, g = ref.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(r)
    if not np.array_equal(np.isnan(r), np.isnan(g)) or not np.array_equal(
        r[np.isinf(r)], g[np.isinf(r)]
    ):
        return OutputDiff(
            name, float("inf"), float("inf"), False, "has NaN or inf where the original does not"
        )
    if not finite.any():
        return OutputDiff(name, 0.0, 0.0, True)
    diff = np.abs(r[finite] - g[finite])
    scale = max(1.0, float(np.max(np.abs(r[finite]))))
    bound = atol * scale + rtol * np.abs(r[finite])
    ok = bool(np.all(diff <= bound))
    max_abs = float(diff.max())
    max_rel = float(np.max(diff / np.maximum(np.abs(r[finite]), np.finfo(np.float64).tiny)))
    used = float(np.max(diff / np.maximum(bound, np.finfo(np.float64).tiny)))
    return OutputDiff(name, max_abs, max_rel, ok, abs_bound=atol * scale, used=used)


def input_permutations(path: str | os.PathLike[str]) -> dict[str, list[int]]:
    """Layout changes recorded by the optimizer in the optimized model's metadata."""
    import onnx

    proto = onnx.load_model(str(path), load_external_data=False)
    for prop in proto.metadata_props:
        if prop.key == INPUT_PERMUTATION_KEY:
            return {k: list(v) for k, v in json.loads(prop.value).items()}
    return {}


def check_feeds(
    model: str | os.PathLike[str],
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
) -> None:
    """Fail now, with a one-line error, on ``--input-shape`` or ``.npz`` inputs that do not
    fit ``model`` (optimize checks them before it works, not only when it verifies)."""
    make_inputs(session(model), input_shapes, inputs_npz, model=model)


def compare_files(
    original: str | os.PathLike[str],
    optimized: str | os.PathLike[str],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Run both models on the same inputs and compare every output by name."""
    ref_sess = session(original)
    got_sess = session(optimized)
    feeds = make_inputs(ref_sess, input_shapes, inputs_npz, seed, model=original)
    perms = input_permutations(optimized)
    got_feeds = {
        k: (np.ascontiguousarray(v.transpose(perms[k])) if k in perms else v)
        for k, v in feeds.items()
    }
    ref_out = dict(
        zip(
            [o.name for o in ref_sess.get_outputs()],
            run_model(ref_sess, feeds, original),
            strict=True,
        )
    )
    wanted = [i.name for i in got_sess.get_inputs()]
    missing = [n for n in wanted if n not in got_feeds]
    if missing:
        raise OpfuseError(
            f"{Path(optimized)}: has input {missing[0]!r} that {Path(original)} does not"
        )
    try:
        got_values = run_model(got_sess, {k: got_feeds[k] for k in wanted}, optimized)
    except OpfuseError as exc:  # the original ran on these inputs: the optimized must too
        raise VerificationError(str(exc)) from None
    got_out = dict(zip([o.name for o in got_sess.get_outputs()], got_values, strict=True))
    diffs = []
    for name, ref in ref_out.items():
        if name not in got_out:
            diffs.append(
                OutputDiff(
                    name, float("inf"), float("inf"), False, "is missing from the optimized model"
                )
            )
            continue
        diffs.append(compare_arrays(name, np.asarray(ref), np.asarray(got_out[name]), rtol, atol))
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    return VerifyReport(
        diffs, rtol, atol, shapes, None if inputs_npz is not None else seed, feeds=feeds
    )
