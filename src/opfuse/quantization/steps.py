"""The steps a recipe is made of, each a small wrapper around one algorithm module (the
way NNCF composes its algorithms in ``post_training/pipeline.py``):

- ``float`` steps change the float model before quantization and are verified against
  the fused float model within the verifier's bound (a step that fails it is dropped and
  said): ``cle`` (equalize.py: cross-layer equalization, without its inexact bias absorption),
  ``smoothquant`` (smooth.py); ``float-decomposed`` (activations.py) changes no float
  op: it keeps a written-out GELU's and LayerNorm statistics' nodes out of quantization;
  ``float-stem`` (float_stem.py) likewise keeps the stem (the leading layers, up to 8% of
  the multiply-adds) out of it (mixed precision: it costs their int8 kernels);
- ``ranges`` steps choose the activation ranges (ranges.py), given to onnxruntime's
  quantizer as per-tensor overrides: ``minmax`` (onnxruntime's own MinMax calibration:
  the global extremes), ``mean-minmax``, ``percentile``, ``mse``;
- ``int8`` steps change the quantized model: ``dynamic`` and ``int4`` (made by
  ``recipes.build`` through ort_backend.py: dynamic int8, weight-only int4), ``float-requant`` (float_requant.py: drops the
  requantization of tensors an element-wise or data-moving op makes and no compute op
  reads; exact in float), then ``bias-correction`` (fast) or ``bias-correction-full``
  (bias_correction.py).

A recipe is a set of step names; ``recipe_steps`` orders them float -> ranges -> quantize
-> int8 and adds ``minmax`` when no ranges step is named.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import onnx

from opfuse.errors import OpfuseError, first_line
from opfuse.quantization import flow, ranges
from opfuse.quantization.activations import float_decomposed
from opfuse.quantization.bias_correction import correct_bias
from opfuse.quantization.equalize import equalizable_pairs, equalize
from opfuse.quantization.float_requant import COMPUTE, drop_requant
from opfuse.quantization.float_stem import STEM_SHARE, stem_nodes
from opfuse.quantization.model_kind import attention, model_kind
from opfuse.quantization.names import RECIPE_HELP
from opfuse.quantization.ort_backend import INT4_BLOCK
from opfuse.quantization.smooth import smooth, smoothable
from opfuse.quantization.workspace import StepReport, Workspace
from opfuse.runtime.cpu import cpu_features

if TYPE_CHECKING:
    import onnxruntime as ort

VERIFY_RTOL, VERIFY_ATOL = 1e-4, 1e-5  # the verifier's default bound (opfuse verify)
VERIFY_SAMPLES = 4  # samples a float step is verified on
PHASES = ("float", "ranges", "int8")


class Step(Protocol):
    name: str
    phase: str  # "float", "ranges" or "int8"

    def applies(self, ws: Workspace) -> bool:
        """Would it do anything on this model."""
        ...

    def run(self, ws: Workspace) -> StepReport:
        """Change ``ws.float_model`` / ``ws.overrides`` / ``ws.int8_model``."""
        ...


class Ranges:
    """Activation ranges by ``method`` (ranges.py), as per-tensor overrides; ``minmax``
    is onnxruntime's own MinMax calibration (the same global extremes, no overrides)."""

    phase = "ranges"

    def __init__(self, method: str) -> None:
        self.name = method

    def applies(self, ws: Workspace) -> bool:
        return True

    def run(self, ws: Workspace) -> StepReport:
        if self.name == "minmax":
            ws.calibrate_method = "minmax"
            return StepReport(self.name, 0, "onnxruntime's MinMax calibration")
        key = (ws.model_key, ws.samples_key, self.name, ws.activation_type)
        found = ws.stats.ranges.get(key)
        if found is None:
            tensors = ranges.quantized_activations(ws.float_model)
            found = ranges.activation_ranges(
                ws.float_model, ws.calib, tensors, self.name, activation_type=ws.activation_type
            )
            ws.stats.ranges[key] = found
        ws.overrides.update(ranges.to_overrides(found))
        return StepReport(self.name, len(found), f"{len(found)} activation ranges")


FloatChangeFn = Callable[
    [onnx.ModelProto, Sequence[dict[str, np.ndarray]]], tuple[onnx.ModelProto, int]
]


class FloatChange:
    """A step that changes the float model (``change(model, samples)`` returns the copy and
    a count), verified against the fused float model before quantizing."""

    phase = "float"

    def __init__(
        self,
        name: str,
        change: FloatChangeFn,
        what: str,
        candidates: Callable[[onnx.ModelProto], object] | None = None,
    ) -> None:
        self.name, self.change, self.what = name, change, what
        self.candidates = candidates  # the module's cheap check (no session), if any

    def _none_to_consider(self, ws: Workspace) -> bool:
        return self.candidates is not None and not self.candidates(ws.float_model)

    def _result(self, ws: Workspace) -> tuple[onnx.ModelProto, int] | StepReport:
        key = (ws.model_key, self.name)  # computed once per scope (on its first samples)
        known = ws.stats.float_changes
        if key not in known:
            try:
                made, count = self.change(ws.float_model, ws.calib)
            except OpfuseError as exc:
                known[key] = StepReport(self.name, 0, first_line(exc), dropped=True)
            else:
                known[key] = (made, count)
                if count:
                    bad = float_check(ws, made)
                    if bad:
                        known[key] = StepReport(self.name, count, bad, dropped=True)
        return known[key]

    def applies(self, ws: Workspace) -> bool:
        if self._none_to_consider(ws):  # cheap: nothing of the kind in the graph
            return False
        found = self._result(ws)
        return isinstance(found, tuple) and found[1] > 0

    def reason(self, ws: Workspace) -> str:
        """Why it does not apply: dropped (and why), or nothing to change."""
        found = self._result(ws)
        if isinstance(found, StepReport):
            return f"dropped: {found.detail}"
        return f"nothing to change: no {self.what}"

    def run(self, ws: Workspace) -> StepReport:
        found = self._result(ws)
        if isinstance(found, StepReport):
            return found
        made, count = found
        if count:
            ws.replace_float_model(made, self.name)
        return StepReport(self.name, count, f"{count} {self.what}")


class FloatDecomposed:
    """Written-out GELUs and LayerNorm statistics kept out of quantization (activations.py):
    their nodes join the workspace's float nodes; the float model is unchanged."""

    phase = "float"
    name = "float-decomposed"

    def applies(self, ws: Workspace) -> bool:
        return bool(float_decomposed(ws.float_model))

    def reason(self, ws: Workspace) -> str:
        return "nothing to change: no written-out GELU or LayerNorm statistics"

    def run(self, ws: Workspace) -> StepReport:
        names = [n for n in float_decomposed(ws.float_model) if n not in ws.exclude]
        ws.exclude.extend(names)
        return StepReport(
            self.name, len(names), f"{len(names)} nodes of written-out GELUs/LayerNorms in float"
        )


class FloatStem:
    """The stem (the leading layers up to ``STEM_SHARE`` of the multiply-adds, and the
    element-wise ops between them) kept out of quantization (float_stem.py): its nodes join
    the workspace's float nodes; the float model is unchanged."""

    phase = "float"
    name = "float-stem"

    def _nodes(self, ws: Workspace) -> list[str]:
        key = ws.model_key
        if key not in ws.stats.stems:
            feed = ws.calib[0] if ws.calib else None
            ws.stats.stems[key] = stem_nodes(ws.float_model, feed)
        return ws.stats.stems[key]

    def applies(self, ws: Workspace) -> bool:
        return bool(self._nodes(ws))

    def reason(self, ws: Workspace) -> str:
        return (
            f"nothing to change: the first weighted layer alone holds more than "
            f"{STEM_SHARE:.0%} of the multiply-adds, or every one fits in that share"
        )

    def run(self, ws: Workspace) -> StepReport:
        names = [n for n in self._nodes(ws) if n not in ws.exclude]
        ws.exclude.extend(names)
        layers = sum(
            1 for n in ws.float_model.graph.node if n.name in names and n.op_type in COMPUTE
        )
        return StepReport(
            self.name, len(names), f"{len(names)} nodes of the stem in float ({layers} layers)"
        )


class FloatRequant:
    """The requantizations onnxruntime's QDQ fusion does not need (float_requant.py): a tensor
    an element-wise or data-moving op makes and no Conv/MatMul/Gemm reads keeps no
    QuantizeLinear/DequantizeLinear pair (exact in float: only pairs are removed)."""

    phase = "int8"
    name = "float-requant"

    def applies(self, ws: Workspace) -> bool:
        """A node other than a compute op whose every reader is not a compute op either
        (the int8 model is not made yet: its pairs are what the step would look at)."""
        graph = ws.float_model.graph
        readers: dict[str, list[str]] = {}
        for n in graph.node:
            for name in n.input:
                readers.setdefault(name, []).append(n.op_type)
        return any(
            n.op_type not in COMPUTE
            and n.op_type != "Constant"
            and any(readers.get(o) for o in n.output)
            and not any(op in COMPUTE for o in n.output for op in readers.get(o, []))
            for n in graph.node
        )

    def reason(self, ws: Workspace) -> str:
        return "nothing to change: no element-wise op read by no compute op"

    def run(self, ws: Workspace) -> StepReport:
        assert ws.int8_model is not None
        made, count = drop_requant(ws.int8_model, ws.float_model)
        ws.int8_model = made
        return StepReport(self.name, count, f"{count} requantizations dropped")


DYNAMIC = "dynamic"
DYNAMIC_MIN_MATMULS = 2  # a classifier's one dense head is no reason for it
STATIC_OPS = frozenset({"Conv", "ConvTranspose"})  # kept static in a dynamic recipe


def dynamic_nodes(model: onnx.ModelProto, exclude: Sequence[str] = ()) -> list[str]:
    """The MatMuls whose second input is a constant 2-D weight (an initializer), named
    and not in ``exclude``: what dynamic int8 quantizes."""
    weights = {t.name for t in model.graph.initializer if len(t.dims) == 2}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul"
        and n.name
        and len(n.input) == 2
        and n.input[1] in weights
        and n.name not in exclude
    ]


def static_part(model: onnx.ModelProto, exclude: Sequence[str] = ()) -> bool:
    """Has the model convolutions (STATIC_OPS) left for static int8 in a dynamic recipe."""
    return any(n.op_type in STATIC_OPS and n.name not in exclude for n in model.graph.node)


class Dynamic:
    """Dynamic int8 for the MatMuls with constant weights (onnxruntime's
    DynamicQuantizeMatMul: weights int8 per output channel, symmetric; activations
    quantized at run time, so no calibrated activation range can clip them), the
    convolutions static QDQ as in any recipe, everything else float: the recipe of the
    transformer encoders CPU deployments run (issue 42: a MiniLM's embeddings at cosine
    0.963 dynamic against 0.945 static, 0.49x against 0.83x). ``recipes.build`` makes the
    model; this step reports it."""

    phase = "int8"
    name = DYNAMIC

    def applies(self, ws: Workspace) -> bool:
        """A transformer: attention (a MatMul of two activations) and MatMuls with
        constant weights, DYNAMIC_MIN_MATMULS or more (an MLP or a CNN's dense head keeps
        the static recipes)."""
        model = ws.float_model
        dense = len(dynamic_nodes(model, ws.exclude)) >= DYNAMIC_MIN_MATMULS
        return dense and attention(model)

    def reason(self, ws: Workspace) -> str:
        return (
            f"nothing to change: no attention (a MatMul of two activations) with "
            f"{DYNAMIC_MIN_MATMULS} or more MatMuls of constant weights"
        )

    def run(self, ws: Workspace) -> StepReport:
        assert ws.int8_model is not None
        count = sum(1 for n in ws.int8_model.graph.node if n.op_type == "MatMulInteger")
        return StepReport(self.name, count, f"{count} MatMuls dynamic int8")


INT4 = "int4"
INT8_WEIGHTS = "int8-weights"  # weight-only int8: MatMulNBits at 8 bits
WEIGHT_ONLY = (INT4, INT8_WEIGHTS)


def decoder_signs(model: onnx.ModelProto) -> str:
    """Why ``model`` is a decoder language model ('' when it is not): its kind
    (``model_kind``: with past key values, or without past but with a causal mask and
    logits over the vocabulary) and what in the graph says so."""
    kind = model_kind(model)
    return f"a {kind.kind}: {kind.signs}" if kind.decoder else ""


class Int4:
    """Weight-only int4 for the MatMuls with constant 2-D weights (onnxruntime's
    MatMulNBits: 4-bit, symmetric, in blocks of ``ort_backend.INT4_BLOCK``, rounded to
    nearest; ``accuracy_level`` 4 where the CPU has VNNI, else 0), everything else float:
    no Q/DQ, no calibration (issue 42, item 3). It trades accuracy for size (a weight in
    about a sixth of its float bytes, with a scale per block), which the search's measure
    (accuracy alone) cannot weigh: ``--recipe auto`` tries it only on a decoder
    (``decoder_signs``), whose weights are what its size and its memory-bound token-by-
    token latency are made of; elsewhere it is forced (``--recipe int4``).
    ``recipes.build`` makes the model; this step reports it."""

    phase = "int8"
    name = INT4
    bits = 4

    def applies(self, ws: Workspace) -> bool:
        return bool(dynamic_nodes(ws.float_model, ws.exclude))

    def reason(self, ws: Workspace) -> str:
        return "nothing to change: no MatMul with a constant 2-D weight"

    def run(self, ws: Workspace) -> StepReport:
        assert ws.int8_model is not None
        nodes = [n for n in ws.int8_model.graph.node if n.op_type == "MatMulNBits"]
        level = next((a.i for n in nodes for a in n.attribute if a.name == "accuracy_level"), 0)
        detail = (
            f"{len(nodes)} MatMuls weight-only int{self.bits} (MatMulNBits, block "
            f"{INT4_BLOCK}, accuracy_level {level})"
        )
        decoder = decoder_signs(ws.float_model)
        return StepReport(self.name, len(nodes), f"{detail}; {decoder}" if decoder else detail)


class Int8Weights(Int4):
    """Weight-only int8 (MatMulNBits at 8 bits, symmetric, blocks of INT4_BLOCK), the
    activations float: on a trained decoder (SmolLM2-135M, bench.quant_decoder) it keeps
    94.8% of the next tokens (perplexity +0.6%) at 0.41 of the file, where int4 keeps 59%
    and dynamic int8, which quantizes the activations too, 56%; one decoding step runs at
    0.45x the float model's, as dynamic int8 does. Tried by ``--recipe auto`` on decoders
    after ``int4``, as it is."""

    name = INT8_WEIGHTS
    bits = 8


def int4_accuracy_level() -> int:
    """MatMulNBits' ``accuracy_level``: 4 (int8 activations in its dot products) where
    this CPU has VNNI, else 0 (unset: float dot products on dequantized weights)."""
    return 4 if cpu_features().vnni else 0


class BiasCorrection:
    """The mean output shift each quantized layer adds, folded into its bias."""

    phase = "int8"

    def __init__(self, full: bool) -> None:
        self.full = full
        self.name = "bias-correction-full" if full else "bias-correction"

    def applies(self, ws: Workspace) -> bool:
        return bool(flow.weighted_nodes(ws.float_model))

    def run(self, ws: Workspace) -> StepReport:
        assert ws.int8_model is not None
        made, count = correct_bias(ws.float_model, ws.int8_model, ws.calib, full=self.full)
        ws.int8_model = made
        return StepReport(self.name, count, f"{count} layers' biases corrected")


STEPS: dict[str, Step] = {
    "minmax": Ranges("minmax"),
    "mean-minmax": Ranges("mean-minmax"),
    "percentile": Ranges("percentile"),
    "mse": Ranges("mse"),
    "cle": FloatChange("cle", equalize, "layer pairs equalized", equalizable_pairs),
    "smoothquant": FloatChange("smoothquant", smooth, "layers smoothed", smoothable),
    "float-decomposed": FloatDecomposed(),
    "float-requant": FloatRequant(),
    "float-stem": FloatStem(),
    DYNAMIC: Dynamic(),
    INT4: Int4(),
    INT8_WEIGHTS: Int8Weights(),
    "bias-correction": BiasCorrection(full=False),
    "bias-correction-full": BiasCorrection(full=True),
}


def parse_recipe(text: str) -> tuple[str, ...] | None:
    """``--recipe``: None for auto, else the step names (ordered); a bad name, two ranges
    steps or both bias corrections is a one-line OpfuseError."""
    if text in ("", "auto"):
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in STEPS]
    if unknown or not names:
        raise OpfuseError(f"--recipe {text!r}: {RECIPE_HELP}")
    for kind in (
        [n for n in names if STEPS[n].phase == "ranges"],
        [n for n in names if n.startswith("bias-correction")],
    ):
        if len(kind) > 1:
            raise OpfuseError(f"--recipe {text!r}: one of {', '.join(kind)}, not both")
    for weights in (n for n in names if n in WEIGHT_ONLY):
        other = [n for n in names if n != weights and STEPS[n].phase != "float"]
        if other:
            raise OpfuseError(
                f"--recipe {text!r}: {weights} is weight-only (no activation is quantized): "
                f"not with {', '.join(other)}"
            )
    return recipe_steps(names)


def recipe_steps(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` in the order they run (float, ranges, int8), minmax when no ranges step
    (none in a weight-only int4 recipe: nothing is calibrated)."""
    names = list(dict.fromkeys(names))
    weight_only = any(n in WEIGHT_ONLY for n in names)
    if not weight_only and not any(STEPS[n].phase == "ranges" for n in names):
        names.append("minmax")
    # float-requant before a bias correction (which measures the int8 model's shift)
    return tuple(sorted(names, key=lambda n: (PHASES.index(STEPS[n].phase), n.startswith("bias"))))


def recipe_name(steps: Sequence[str]) -> str:
    return ",".join(steps)


def float_check(ws: Workspace, changed: onnx.ModelProto) -> str:
    """Why ``changed`` is not the fused float model within the verifier's bound on the
    first validation samples ('' when it is): the plain bound, or else within the fused
    model's own float32 error against float64, as ``opfuse verify`` judges."""
    from opfuse.verification import tolerance
    from opfuse.verification.compare import compare_arrays

    samples = ws.valid[:VERIFY_SAMPLES]
    want = _disabled_run(ws.fused_model, samples)
    got = _disabled_run(changed, samples)
    names = ws.output_names
    for k, sample in enumerate(samples):
        truth: dict[str, np.ndarray] | None = None
        for name, ref, out in zip(names, want[k], got[k], strict=True):
            diff = compare_arrays(name, np.asarray(ref), np.asarray(out), VERIFY_RTOL, VERIFY_ATOL)
            if diff.ok:
                continue
            if truth is None:
                try:
                    truth = tolerance.run_float64(ws.fused_model, sample, _disabled_session)
                except Exception:  # no float64 model onnxruntime runs: the plain rule stands
                    truth = {}
            if (
                diff.detail
                or name not in truth
                or not tolerance.within_rounding(
                    np.asarray(ref), np.asarray(out), truth[name], VERIFY_RTOL, VERIFY_ATOL
                )
            ):
                return (
                    f"changes output {name} beyond the verifier's bound (max abs "
                    f"{diff.max_abs:.3g}, {diff.used:.1f}x the bound)"
                )
    return ""


def _disabled_session(model: onnx.ModelProto) -> ort.InferenceSession:
    from opfuse.model.sessions import open_session

    return open_session(model, graph_opt="off", threads=0, errors="onnxruntime")


def _disabled_run(
    model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    sess = _disabled_session(model)
    return [sess.run(None, s) for s in samples]
