"""Numeric comparison of two models under onnxruntime with its own optimizations off,
so that onnxruntime's fusions cannot hide a broken one of ours."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort

from opfuse.errors import OpfuseError, VerificationError, first_line
from opfuse.model.graphs import INPUT_PERMUTATION_KEY
from opfuse.model.sessions import open_session
from opfuse.verification import inputs as verify_inputs
from opfuse.verification import tolerance
from opfuse.verification.inputs import InputPlan, Sizing

ORT_DTYPES = {f"tensor({k})": v for k, v in verify_inputs.ORT_DTYPES.items() if k != "string"}


class OptimizedModelError(OpfuseError):
    """The model under verification (``compare_files``' ``optimized``) cannot load in
    onnxruntime or asks for an input the original does not have; the message names it."""


class OptimizedModelRunError(OptimizedModelError, VerificationError):
    """The model under verification cannot run on the inputs the original ran on: a failed
    verification (exit status 1)."""


def session(
    path: str | os.PathLike[str] | onnx.ModelProto, optimize: bool = False, threads: int = 0
) -> ort.InferenceSession:
    return open_session(path, graph_opt="all" if optimize else "off", threads=threads)


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
    spec: ort.NodeArg, model: str | os.PathLike[str] | onnx.ModelProto | None
) -> list[int | str | None] | None:
    """The dims a model declares for an input; None where its rank is unknown.
    onnxruntime reports an unknown rank as [] (a scalar's too): the model (its file, or
    the model in memory) tells."""
    if spec.shape or model is None:
        return list(spec.shape) if spec.shape else None
    for value in _proto(model).graph.input:
        if value.name == spec.name and value.type.tensor_type.HasField("shape"):
            return []
    return None


def _proto(model: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    """The model in memory: itself, or its file without the external data."""
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load_model(str(model), load_external_data=False)


def check_input_shape(
    spec: ort.NodeArg,
    dims: list[int],
    model: str | os.PathLike[str] | onnx.ModelProto | None = None,
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
    model: str | os.PathLike[str] | onnx.ModelProto | None = None,
) -> dict[str, np.ndarray]:
    """Seeded inputs for every model input (opfuse.verification.inputs), or the arrays of an
    ``.npz``. ``model``: the session's file (or model), read for a scalar input's rank and
    for the uses of integer inputs."""
    return make_inputs_and_plan(sess, input_shapes, inputs_npz, seed, model)[0]


def make_inputs_and_plan(
    sess: ort.InferenceSession,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
    model: str | os.PathLike[str] | onnx.ModelProto | None = None,
    sizing: Sizing = verify_inputs.FIRST_SIZING,
) -> tuple[dict[str, np.ndarray], InputPlan | None]:
    """make_inputs and how each input was generated (None for an ``.npz``); ``sizing``:
    how the sizes opfuse chooses are chosen (``verification.inputs.generate``)."""
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
        return _load_npz(inputs_npz, specs), None
    proto = None if model is None else _proto(model)
    feeds, plan = verify_inputs.generate(specs, input_shapes, proto, seed, sizing)
    return cast(dict[str, np.ndarray], feeds), plan  # a sequence input is a list of arrays


# the factors the sizes opfuse chose grow by when onnxruntime refuses generated inputs
# (doubling, with a factor of 3 and of 15 for a reshape that must divide), while no input
# exceeds MAX_GROWN_ELEMENTS
GROWTH = (2, 3, 4, 8, 15, 16)
MAX_GROWN_ELEMENTS = 1 << 24
# (model file, shapes, seed) -> the sizing that ran, the note saying why, the refusal
_GROWN: dict[tuple[object, ...], tuple[Sizing, str, str]] = {}


@dataclass(frozen=True)
class FedInputs:
    """What a model was fed, as every report names it: each input's shape, and where the
    values came from (``npz``: the user's file; else generated with ``seed``, ``how``
    each input was made, ``grown``: the sizes opfuse chose grown after onnxruntime
    refused the first ones)."""

    shapes: dict[str, list[int]]
    npz: str | None = None
    seed: int | None = 0
    how: tuple[str, ...] = ()
    grown: str | None = None
    refused: str | None = None  # onnxruntime's refusal of the sizes before they grew

    @property
    def generated(self) -> bool:
        return self.npz is None

    @classmethod
    def of(
        cls,
        feeds: Mapping[str, object],
        plan: InputPlan | None,
        npz: str | os.PathLike[str] | None = None,
        seed: int | None = 0,
    ) -> FedInputs:
        shapes = {k: list(np.shape(v)) for k, v in feeds.items() if isinstance(v, np.ndarray)}
        if plan is None:
            return cls(shapes, str(npz) if npz is not None else None, None)
        return cls(shapes, None, seed, tuple(plan.lines()), plan.grown, plan.refused)

    def shapes_text(self) -> str:
        """``x[1,3,224,224], mask[1,32]``"""
        return ", ".join(f"{k}[{','.join(map(str, v))}]" for k, v in self.shapes.items())

    def text(self) -> str:
        """``x[1,3,224,224] (generated, seed 0)`` or ``x[8,3,640,640] (from samples.npz)``."""
        if self.npz is not None:
            origin = f"from {self.npz}"
        else:
            origin = f"generated, seed {self.seed}" + (f"; {self.grown}" if self.grown else "")
        return f"{self.shapes_text() or 'no inputs'} ({origin})"

    def line(self, verb: str) -> str:
        """``timed on inputs x[1,3,224,224] (generated, seed 0): ...`` (``verb``: what was
        done on them), with what to give when they were generated."""
        text = f"{verb} on inputs {self.text()}"
        if self.generated:
            text += ": give the shapes and values you run with: --inputs samples.npz"
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "shapes": self.shapes,
            "generated": self.generated,
            "npz": self.npz,
            "seed": self.seed,
            "how": list(self.how),
            "grown": self.grown,
            "refused": self.refused,
        }


def runnable_inputs(
    sess: ort.InferenceSession,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
    model: str | os.PathLike[str] | onnx.ModelProto | None = None,
    shown_as: str | os.PathLike[str] | None = None,
    hint: str | None = None,
) -> tuple[dict[str, np.ndarray], InputPlan | None, list[np.ndarray]]:
    """``make_inputs_and_plan``, run once on ``sess``: the feeds, how they were made and the
    outputs. Generated inputs onnxruntime refuses (a reflect pad longer than the input, a
    reshape that does not divide, a height an image model cannot take) are made again
    (``_attempts``) before the refusal is raised (``optimize``'s one-line error naming
    ``shown_as``, ending in ``hint``, by default GENERATED_HINT for generated inputs). The
    attempt that ran is remembered for the file (tune's variants and the bisection verify
    against it again)."""
    feeds, plan = make_inputs_and_plan(sess, input_shapes, inputs_npz, seed, model)
    name = shown_as or (model if not isinstance(model, onnx.ModelProto | None) else "the model")
    if plan is None:
        return feeds, None, run_model(sess, feeds, name, "" if hint is None else hint)
    key = _growth_key(model, input_shapes, seed)
    if key is not None and key in _GROWN:
        sizing, note, reason = _GROWN[key]
        grown, grown_plan = make_inputs_and_plan(sess, input_shapes, None, seed, model, sizing)
        outputs, _ = _try_run(sess, grown)
        if outputs is not None and grown_plan is not None:
            grown_plan.grown, grown_plan.refused = note, reason
            return grown, grown_plan, outputs
        del _GROWN[key]
    outputs, refused = _try_run(sess, feeds)
    if outputs is not None:
        return feeds, plan, outputs
    for sizing in _attempts(plan):
        grown, grown_plan = make_inputs_and_plan(sess, input_shapes, None, seed, model, sizing)
        if grown_plan is None or any(np.size(v) > MAX_GROWN_ELEMENTS for v in grown.values()):
            continue
        outputs, _ = _try_run(sess, grown)
        if outputs is not None:
            grown_plan.grown = f"{sizing.text()}: onnxruntime refused {_shapes_of(feeds)}"
            grown_plan.refused = _reason(refused or "")
            if key is not None:
                _GROWN[key] = (sizing, grown_plan.grown, grown_plan.refused)
            return grown, grown_plan, outputs
    raise _cannot_run(name, feeds, refused or "", GENERATED_HINT if hint is None else hint)


def _attempts(plan: InputPlan) -> list[Sizing]:
    """The sizings tried in turn after onnxruntime refused the first generated inputs: an
    image's free height and width at a text line's LINE_DIMS, then at DEFAULT_DIM (a model
    that runs only at small heights, such as the PP-OCRv4 recognizer below 96, which passed
    at 32 before images got 224, and is timed at its real size at 48x320; a cheap run where
    a larger one is not), the sizes opfuse chose grown by each
    factor of GROWTH, then the same with a free middle dim at 1 (silero_vad.onnx: its
    state [2, ?, 128] holds the batch, and its input must be 192 long)."""
    if not plan.free:
        return []
    images = [Sizing(text_line=True), Sizing(image_sizes=False)] if plan.images else []
    middle = [Sizing(f, middle_ones=True) for f in (1, *GROWTH)] if plan.middle else []
    return images + [Sizing(f) for f in GROWTH] + middle


def _growth_key(
    model: str | os.PathLike[str] | onnx.ModelProto | None,
    input_shapes: Mapping[str, list[int]] | None,
    seed: int,
) -> tuple[object, ...] | None:
    """The file's identity (path, size, modification time), the shapes given, the seed:
    a file verified again (tune's variants, the bisection) starts from the factor that ran."""
    if model is None or isinstance(model, onnx.ModelProto):
        return None
    try:
        stat = os.stat(model)
    except OSError:
        return None
    shapes = tuple(sorted((k, tuple(v)) for k, v in (input_shapes or {}).items()))
    return (os.path.abspath(model), stat.st_size, stat.st_mtime_ns, shapes, seed)


def _try_run(
    sess: ort.InferenceSession, feeds: dict[str, np.ndarray]
) -> tuple[list[np.ndarray] | None, str | None]:
    """The outputs, or None and onnxruntime's first line when it refuses the inputs."""
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4
    try:
        return list(sess.run(None, feeds, quiet)), None
    except Exception as exc:  # onnxruntime raises its own exception types
        return None, first_line(exc)


def _reason(text: str) -> str:
    """onnxruntime's message without its status prefix, cut short."""
    text = text.rpartition("Status Message: ")[2] or text
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    return text if len(text) <= 160 else text[:157] + "..."


def _shapes_of(feeds: Mapping[str, object]) -> str:
    return ", ".join(
        f"{k}[{','.join(map(str, np.shape(v)))}]" for k, v in feeds.items() if hasattr(v, "shape")
    )


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
    sess: ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    path: str | os.PathLike[str],
    hint: str = "",
) -> list[np.ndarray]:
    """One inference; a model that cannot run on these inputs (dims that contradict each
    other or the model) is a one-line error naming the file, ending in ``hint``."""
    outputs, refused = _try_run(sess, feeds)  # the failure is reported once, not logged too
    if outputs is None:
        raise _cannot_run(path, feeds, refused or "", hint)
    return outputs


def _cannot_run(
    path: str | os.PathLike[str], feeds: Mapping[str, object], why: str, hint: str
) -> OpfuseError:
    shapes = ", ".join(  # a sequence input is a list of arrays
        f"{k} {list(v.shape) if hasattr(v, 'shape') else 'sequence'}" for k, v in feeds.items()
    )
    return OpfuseError(f"{path}: onnxruntime cannot run the model on inputs {shapes}: {why}{hint}")


GENERATED_HINT = (
    " (the inputs were generated; give realistic ones with --inputs samples.npz,"
    " or sizes with --input-shape)"
)


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
    inputs: list[str] = field(default_factory=list)  # how each input was generated
    # generated inputs that decide a branch real inputs may not take (verification.inputs)
    input_warnings: list[str] = field(default_factory=list)
    # where the inputs of a failed comparison were written (``save_failing_inputs``)
    saved_inputs: Path | None = None
    npz: str | None = None  # the .npz the inputs came from (None: generated with ``seed``)
    grown: str | None = None  # generated sizes grown after onnxruntime refused the first
    refused: str | None = None  # ... and onnxruntime's reason

    @property
    def fed(self) -> FedInputs:
        """The inputs both models ran on, as every report names them."""
        return FedInputs(
            self.input_shapes, self.npz, self.seed, tuple(self.inputs), self.grown, self.refused
        )

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def failure(self) -> str:
        bad = [o for o in self.outputs if not o.ok]
        return "; ".join(
            f"output {o.name!r} {o.detail or f'differs by {o.max_abs:.3g} (relative {o.max_rel:.3g})'}"
            for o in bad
        )

    def summary(self) -> str:
        """The verdict with the tolerances and inputs, then one line per output (its errors,
        the bound applied, the share of it used); ``failure()`` is the failing outputs only."""
        verdict = "passed" if self.ok else "FAILED"
        lines = [
            f"verification {verdict}: rtol {self.rtol:g}, atol {self.atol:g}; "
            f"inputs {inputs_text(self)}"
        ]
        lines += [output_line(o, self.rtol) for o in self.outputs]
        lines += [f"warning: {w}" for w in self.input_warnings]
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "rtol": self.rtol,
            "atol": self.atol,
            "input_shapes": self.input_shapes,
            "seed": self.seed,
            "outputs": [o.__dict__ for o in self.outputs],
            "inputs": self.inputs,
            "inputs_generated": self.npz is None,
            "inputs_npz": self.npz,
            "inputs_grown": self.grown,
            "inputs_refused": self.refused,
            "input_warnings": self.input_warnings,
        }


def share(o: OutputDiff) -> str:
    """How much of its bound the worst element used: ``23%``."""
    if not o.ok and o.detail:
        return "-"
    if o.used >= 10:
        return f"{o.used:.0f}x"
    return f"{o.used:.1%}" if o.used < 0.1 else f"{o.used:.0%}"


def bound_text(o: OutputDiff, rtol: float) -> str:
    """The bound applied to every element: ``1e-05 + 1e-04*|ref|`` (atol already scaled)."""
    if o.detail and not o.abs_bound:
        return "exact" if "exact dtype" in o.detail else "-"
    return f"{o.abs_bound:.3g} + {rtol:.3g}*|ref|"


def output_line(o: OutputDiff, rtol: float) -> str:
    if o.detail and not o.abs_bound:
        return f"output {o.name!r} {o.detail}"
    verdict = "ok" if o.ok else "DIFFERS"
    if o.ok and o.detail:  # passed the float64 judge (opfuse.verification.tolerance)
        verdict = f"ok, {o.detail}"
    return (
        f"output {o.name!r}: max abs error {o.max_abs:.3g} (relative {o.max_rel:.3g}); "
        f"bound {bound_text(o, rtol)}; worst element at {share(o)} of its bound: {verdict}"
    )


def inputs_text(report: VerifyReport) -> str:
    """``x[1,3,224,224] (generated, seed 0)``: what both models ran on."""
    return report.fed.text()


def compare_arrays(
    name: str, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float
) -> OutputDiff:
    """Allclose with atol scaled by the output's magnitude: ``|got - ref| <= atol *
    max(1, max|ref|) + rtol * |ref|`` (rtol and atol no tighter than the dtype's precision,
    opfuse.verification.tolerance), NaN and inf only where the reference has them."""
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
    rtol, atol = tolerance.for_dtype(ref.dtype, rtol, atol)
    diff = np.abs(r[finite] - g[finite])
    bound = tolerance.allowed(r[finite], rtol, atol)
    ok = bool(np.all(diff <= bound))
    max_abs = float(diff.max())
    # relative to |ref|, but never to less than the absolute tolerance: an element within
    # it near a zero reference is not a 1e300 relative error
    absolute = tolerance.allowed(r[finite], 0.0, atol)
    floor = np.maximum(np.abs(r[finite]), np.maximum(absolute, np.finfo(np.float64).tiny))
    max_rel = float(np.max(diff / floor))
    used = float(np.max(diff / np.maximum(bound, np.finfo(np.float64).tiny)))
    return OutputDiff(name, max_abs, max_rel, ok, abs_bound=float(absolute.flat[0]), used=used)


def compare_values(name: str, ref: object, got: object, rtol: float, atol: float) -> OutputDiff:
    """compare_arrays through a sequence output (a list of arrays, compared one by one),
    a map (skl2onnx's ZipMap: the same keys, the values compared as one array) and an
    optional one (None when absent)."""
    if isinstance(ref, dict) or isinstance(got, dict):
        if not isinstance(ref, dict) or not isinstance(got, dict) or list(ref) != list(got):
            return OutputDiff(name, float("inf"), float("inf"), False, "differs (map keys)")
        return compare_arrays(
            name, np.asarray(list(ref.values())), np.asarray(list(got.values())), rtol, atol
        )
    if isinstance(ref, list) or isinstance(got, list):
        if not isinstance(ref, list) or not isinstance(got, list) or len(ref) != len(got):
            return OutputDiff(name, float("inf"), float("inf"), False, "differs (sequence)")
        parts = [compare_values(name, r, g, rtol, atol) for r, g in zip(ref, got, strict=True)]
        bad = [p for p in parts if not p.ok]
        worst = max(parts, key=lambda p: p.max_abs, default=OutputDiff(name, 0.0, 0.0, True))
        return bad[0] if bad else worst
    if ref is None or got is None:
        same = ref is None and got is None
        return OutputDiff(
            name,
            0.0 if same else float("inf"),
            0.0 if same else float("inf"),
            same,
            "" if same else "differs (optional)",
        )
    return compare_arrays(name, np.asarray(ref), np.asarray(got), rtol, atol)


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
    instead: Callable[[], onnx.ModelProto | None] | None = None,
) -> None:
    """Fail now, with a one-line error, on ``--input-shape`` or ``.npz`` inputs that do not
    fit ``model`` (optimize checks them before it works, not only when it verifies).
    ``instead``: the model to check them on when onnxruntime cannot load ``model`` (None:
    the failure stands)."""
    try:
        sess = session(model)
    except OpfuseError:
        other = instead() if instead is not None else None
        if other is None:
            raise
        make_inputs(session(other), input_shapes, inputs_npz, model=other)
        return
    make_inputs(sess, input_shapes, inputs_npz, model=model)


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
    """Run both models on the same inputs and compare every output by name.

    ``OptimizedModelError`` (``OptimizedModelRunError``: it cannot run) when ``optimized``
    is at fault; any other OpfuseError is about ``original`` or the inputs given."""
    ref_sess = session(original)
    try:
        got_sess = session(optimized)
    except OpfuseError as exc:
        raise OptimizedModelError(str(exc)) from None
    feeds, plan, ref_values = runnable_inputs(
        ref_sess, input_shapes, inputs_npz, seed, model=original
    )
    perms = input_permutations(optimized)
    got_feeds = {
        k: (np.ascontiguousarray(v.transpose(perms[k])) if k in perms else v)
        for k, v in feeds.items()
    }
    ref_out = dict(zip([o.name for o in ref_sess.get_outputs()], ref_values, strict=True))
    wanted = [i.name for i in got_sess.get_inputs()]
    missing = [n for n in wanted if n not in got_feeds]
    if missing:
        raise OptimizedModelError(
            f"{Path(optimized)}: has input {missing[0]!r} that {Path(original)} does not"
        )
    try:
        got_values = run_model(got_sess, {k: got_feeds[k] for k in wanted}, optimized)
    except OpfuseError as exc:  # the original ran on these inputs: the optimized must too
        raise OptimizedModelRunError(str(exc)) from None
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
        diffs.append(compare_values(name, ref, got_out[name], rtol, atol))
    judge_by_float64(original, feeds, ref_out, got_out, diffs, rtol, atol)
    shapes = {k: list(np.shape(v)) for k, v in feeds.items() if isinstance(v, np.ndarray)}
    return VerifyReport(
        diffs,
        rtol,
        atol,
        shapes,
        None if inputs_npz is not None else seed,
        feeds=dict(feeds),
        inputs=plan.lines() if plan is not None else [],
        input_warnings=plan.warnings if plan is not None else [],
        npz=str(inputs_npz) if inputs_npz is not None else None,
        grown=plan.grown if plan is not None else None,
        refused=plan.refused if plan is not None else None,
    )


def judge_by_float64(
    original: str | os.PathLike[str],
    feeds: Mapping[str, np.ndarray],
    ref_out: Mapping[str, np.ndarray],
    got_out: Mapping[str, np.ndarray],
    diffs: list[OutputDiff],
    rtol: float,
    atol: float,
) -> None:
    """Float outputs that failed the plain rule pass when they are as close to the
    original run in float64 as the original's own float32 output (opfuse.verification.tolerance)."""
    failed = [
        d
        for d in diffs
        if not d.ok
        and not d.detail
        and isinstance(ref_out[d.name], np.ndarray)
        and ref_out[d.name].dtype == np.float32
    ]
    if not failed:
        return
    import onnx

    try:
        truth = tolerance.run_float64(
            onnx.load_model(str(original)), feeds, lambda m: _proto_session(m)
        )
    except Exception:  # no float64 model onnxruntime runs: the plain rule stands
        return
    for d in failed:
        ref, got = np.asarray(ref_out[d.name]), np.asarray(got_out[d.name])
        if d.name in truth and tolerance.within_rounding(ref, got, truth[d.name], rtol, atol):
            d.ok = True
            d.detail = "within the original's own float32 error against float64"


def _proto_session(model: onnx.ModelProto) -> ort.InferenceSession:
    # a float64 copy opfuse made: a refusal is onnxruntime's own exception (the caller
    # keeps the plain rule)
    return open_session(model, graph_opt="off", threads=0, errors="onnxruntime")
