"""What ``opfuse quantize`` did and measured: the figures, the recipes tried, the layers
kept in float, the speed and its verdict in words; as text lines, JSON and a short repr."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opfuse.quantization.accuracy import OutputAccuracy, brief
from opfuse.quantization.fallback import KeptFloat, Trial
from opfuse.quantization.gate import Gate
from opfuse.quantization.heads import HeadChoice
from opfuse.quantization.kept_fusions import KeptFusions
from opfuse.quantization.kernels import KernelCoverage
from opfuse.quantization.model_kind import ModelKind
from opfuse.quantization.trace import TensorError
from opfuse.runtime.cpu import CpuFeatures
from opfuse.tuning.measure import Measurement

if TYPE_CHECKING:
    import onnx

    from opfuse.pipeline.conductor import OptimizeResult

FLOAT_OPT, INT8 = "float-optimized", "int8"
SMALL_MODEL_S = 0.002  # below: Q/DQ around small layers can cost more than int8 saves
HARDSWISH_OPSET = 14  # HardSwish is an op from opset 14 (opfuse folds the written-out form)


def decomposed_hardswish(model: onnx.ModelProto) -> int:
    """How many HardSwish are written out in ``model`` as x * HardSigmoid(x) or
    x * Clip(x + 3, 0, 6) (/ 6): float ops between DQ and Q in int8 that ``--target-opset
    14`` folds into one HardSwish (a HardSigmoid gating another tensor, a squeeze-excite's,
    is not one)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    count = 0
    for node in model.graph.node:
        if node.op_type != "Mul" or len(node.input) != 2:
            continue
        for a, b in (node.input, node.input[::-1]):
            made = producer.get(b)
            if made is None or not made.input:
                continue
            if made.op_type == "HardSigmoid" and made.input[0] == a:
                count += 1
                break
            if made.op_type == "Clip":
                add = producer.get(made.input[0])
                if add is not None and add.op_type == "Add" and a in add.input:
                    count += 1
                    break
    return count


@dataclass
class QuantizeResult:
    """``model``: the int8 model (``onnx.ModelProto``; None when the gate failed and
    nothing was made to write). ``passed``: the gate held on the held-back samples."""

    fused: OptimizeResult
    accuracy: list[OutputAccuracy]  # on the held-back (evaluation) samples
    gate: Gate
    calibration_samples: int
    eval_samples: int
    eval_source: str
    kept_float: list[KeptFloat] = field(default_factory=list)
    speed: Measurement | None = None
    cpu: CpuFeatures | None = None
    warnings: list[str] = field(default_factory=list)
    output: Path | None = None
    nodes: dict[str, int] = field(default_factory=dict)
    coverage: KernelCoverage | None = None  # integer kernels after onnxruntime's QDQ fusion
    fusions: KeptFusions | None = None  # onnxruntime's fused kernels, float optimized -> int8
    # where the first int8 model's error grew most (traced only when it missed the gate)
    error_growth: list[TensorError] = field(default_factory=list)
    validation_samples: int = 0
    validation_apart: bool = True  # False: too few samples, chosen on the calibration ones
    recipe: str = ""  # the recipe kept
    recipes: list[dict[str, object]] = field(default_factory=list)  # each tried, JSON
    recipe_lines: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    heads: list[HeadChoice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # workarounds (the quantizer's failures)
    first_accuracy: list[OutputAccuracy] = field(default_factory=list)  # before the fallback
    first_recipe: str = ""  # the recipe search's choice (``recipe`` adds the stem in float)
    # the --max-drop the model before the fallback passes (it keeps more in int8: faster)
    first_passes: str = ""
    fallback_tries: int = 0
    fallback_stopped: str = ""
    trials: list[Trial] = field(default_factory=list)  # the restorer's, scored and costed
    passed: bool = True
    command: str = ""  # on a failed gate: the command that writes the best model anyway
    sizes: dict[str, int] = field(default_factory=dict)  # bytes: original, int8
    model: onnx.ModelProto | None = field(default=None, repr=False)
    seconds: float = 0.0
    form: str = "onnxruntime"  # the QDQ form written: the runtime's ("openvino": NNCF's)
    hardswish_written_out: int = 0  # x * HardSigmoid(x) below opset 14: --target-opset 14
    timed_on: str = ""  # the inputs the speed was measured on, said with it
    model_kind: ModelKind | None = None  # what the graph says the model is

    @property
    def measures(self) -> set[str]:
        """The measures the gate judged this model's outputs by (their kinds)."""
        return {a.measure for a in self.accuracy}

    @property
    def speedup(self) -> float | None:
        """The float original's latency over the int8 model's (paired)."""
        return None if self.speed is None else 1 / self.speed.ratio(INT8)

    def pays(self) -> bool | None:
        if self.speed is None:
            return None
        return self.speed.faster(INT8, "original") and self.speed.faster(INT8, FLOAT_OPT)

    def __repr__(self) -> str:
        top1 = [a.top1 for a in self.accuracy if a.top1 is not None]
        sqnr = min((a.sqnr_db for a in self.accuracy), default=float("nan"))
        maps = [a.map_iou for a in self.accuracy if a.map_iou is not None]
        figures = (
            (f"top1={min(top1):.1%}, " if top1 else "")
            + (f"map_iou={min(maps):.1%}, " if maps else "")
            + f"sqnr={sqnr:.1f} dB"
        )
        speed = f", speedup={self.speedup:.2f}x" if self.speedup is not None else ""
        gate = "passed" if self.passed else "missed"
        return f"QuantizeResult(recipe={self.recipe!r}, {figures}, gate {gate}{speed})"

    def summary(self) -> str:
        """The text ``opfuse quantize`` prints."""
        return "\n".join(self.lines())

    def to_json(self) -> dict[str, object]:
        speed = None
        if self.speed is not None:
            speed = {
                **self.speed.to_json(),
                "int8_ratio_to_original": self.speed.ratio(INT8),
                "float_optimized_ratio_to_original": self.speed.ratio(FLOAT_OPT),
                "int8_pays": self.pays(),
                "verdict": self.speed_verdict(),
                "timed_on": self.timed_on or None,
            }
        return {
            "schema": "opfuse.quantize/3",
            "output": None if self.output is None else str(self.output),
            "passed": self.passed,
            "calibration_samples": self.calibration_samples,
            "validation_samples": self.validation_samples,
            "validation_apart": self.validation_apart,
            "eval_samples": self.eval_samples,
            "eval_source": self.eval_source,
            "model_kind": None if self.model_kind is None else self.model_kind.to_json(),
            "gate": self.gate.describe(self.measures),
            "recipe": self.recipe,
            "form": self.form,
            "recipes": self.recipes,
            "recipes_skipped": self.skipped,
            "heads": [h.to_json() for h in self.heads],
            "accuracy": [a.to_json() for a in self.accuracy],
            "first_accuracy": [a.to_json() for a in self.first_accuracy],
            "first_recipe": self.first_recipe or self.recipe,
            "first_passes_max_drop": self.first_passes or None,
            "kept_float": [
                {
                    "kept": k.node,
                    "nodes": list(k.in_float),
                    "sqnr_db": None if math.isnan(k.sqnr_db) else k.sqnr_db,
                    "measure": k.how,
                    "share": k.share or None,  # a share of the leading multiply-adds
                    "exclude": k.exclude_items,  # the --exclude items that keep it
                }
                for k in self.kept_float
            ],
            "fallback": {
                "tries": self.fallback_tries,
                "stopped": self.fallback_stopped,
                "trials": [t.to_json() for t in self.trials],
            },
            "command": self.command or None,
            "speed": speed,
            "cpu": None if self.cpu is None else self.cpu.describe(),
            "nodes": self.nodes,
            "sizes": self.sizes,
            "integer_kernels": None
            if self.coverage is None
            else {
                "integer_fraction": self.coverage.integer_fraction,
                "integer_ops": self.coverage.integer_ops,
                "float_between_qdq": self.coverage.float_between_qdq,
            },
            "runtime_fusions": None if self.fusions is None else self.fusions.to_json(),
            "error_growth": [e.to_json() for e in self.error_growth],
            "notes": self.notes,
            "warnings": self.warnings,
            "seconds": round(self.seconds, 2),
        }

    def lines(self) -> list[str]:
        """``summary()`` line by line (the command prints those starting ``warning:`` on
        stderr)."""
        valid = (
            f"calibrating on {self.calibration_samples - self.validation_samples} of them "
            f"and validating on the other {self.validation_samples}"
            if self.validation_apart
            else "on the calibration samples themselves (too few to hold a validation part apart)"
        )
        kind = "" if self.model_kind is None else f"the model: {self.model_kind.describe()}; "
        out = [
            f"{kind}calibrated on {self.calibration_samples} samples (the recipe chosen {valid}); "
            f"accuracy on {self.eval_samples} {self.eval_source}",
        ]
        if self.recipe_lines:
            out.append(f"recipes (validation figures): {'; '.join(self.recipe_lines)}")
            out.append(f"kept: {self.recipe}")
        if self.skipped:
            out.append(f"not tried: {'; '.join(self.skipped)}")
        out += [f"note: {n}" for n in self.notes]
        out += [h.describe() for h in self.heads]
        out += [f"  {a.line()}" for a in self.accuracy]
        if self.gate.off:
            out.append("gate: off")
        else:
            gate = self.gate.describe(self.measures)
            out.append(f"gate: {gate}: " + ("passed" if self.passed else "MISSED"))
        if self.error_growth:
            grows = "; ".join(e.describe() for e in self.error_growth)
            out.append(f"the first int8 try's error grew most at: {grows}")
        stem = bool(self.first_recipe) and self.first_recipe != self.recipe
        if self.first_accuracy and (self.kept_float or stem):
            out.append(
                f"before the fallback (recipe {self.first_recipe or self.recipe}): "
                f"{brief(self.first_accuracy)}; after: {brief(self.accuracy)}"
                + (
                    f" (the model before it, more in int8, passes --max-drop {self.first_passes}: "
                    f"--recipe {self.first_recipe or self.recipe} --max-drop {self.first_passes} "
                    "writes it)"
                    if self.first_passes and self.passed
                    else ""
                )
            )
        if self.kept_float:
            kept = ", ".join(k.describe() for k in self.kept_float)
            why = "to pass the gate" if self.passed else "(the gate still missed)"
            out.append(f"kept in float {why}: {kept}")
        if self.fallback_tries:
            tries = "1 try" if self.fallback_tries == 1 else f"{self.fallback_tries} tries"
            out.append(f"fallback: {tries}, stopped at {self.fallback_stopped}")
        if self.coverage is not None:
            out.append(f"onnxruntime (CPU, after its QDQ fusion): {self.coverage.describe()}")
        if self.fusions is not None and self.fusions.describe():
            out.append(self.fusions.describe())
        verdict = self.speed_verdict()
        if verdict:
            out.append(verdict)
        if self.command and not self.passed:
            out.append(f"to write the best model reached anyway: {self.command}")
        elif self.command:  # the gate held, but the float optimized model is faster
            out.append(
                f"the float optimized model, as fast or faster: {self.command} "
                "(--write-slower writes the int8 model anyway)"
            )
        return out + [f"warning: {w}" for w in self.warnings]

    def speed_verdict(self) -> str:
        """The speed in words: when int8 pays, by how much, the sizes and the CPU; when it
        does not, the cause measured and what to try."""
        if self.speed is None or self.cpu is None:
            return ""
        s = self.speed
        int8_ms, orig_ms, opt_ms = (
            s.medians[INT8] * 1000,
            s.original_s * 1000,
            s.medians[FLOAT_OPT] * 1000,
        )
        sizes = ""
        if self.sizes.get("int8") and self.sizes.get("original"):
            sizes = f"; {_size(self.sizes['int8'])} against {_size(self.sizes['original'])}"
        where = f"on {s.runtime} ({self.cpu.describe()})"
        if self.timed_on:
            where += f", timed on {self.timed_on}"
        apart = s.medians_ratio_apart(INT8)
        load = (
            ""
            if apart is None
            else f" (paired; the medians give {1 / apart:.2f}x: the machine's load changed "
            "between rounds, the paired figure is the one to trust)"
        )
        kind = "int4" if "int4" in self.recipe.split(",") else "int8"
        if self.pays():
            return (
                f"{kind} pays on this machine: {int8_ms:.3g} ms against {orig_ms:.3g} ms for the "
                f"float original, {1 / s.ratio(INT8):.2f}x faster{load} (the float optimized "
                f"model {opt_ms:.3g} ms; noise +-{s.noise:.0%}){sizes}, {where}"
            )
        causes = self._slow_causes(orig_ms)
        return (
            f"{kind} does not pay on this machine: {int8_ms:.3g} ms against {orig_ms:.3g} ms for "
            f"the float original and {opt_ms:.3g} ms for the float optimized model (noise "
            f"+-{s.noise:.0%}){sizes}, {where}. Measured cause: {' '.join(causes)} The float "
            "optimized model (opfuse optimize) is the faster choice here."
        )

    def _slow_causes(self, orig_ms: float) -> list[str]:
        causes = []
        cov = self.coverage
        if cov is not None and cov.float_between_qdq:
            ops = ", ".join(f"{op} {n}" for op, n in sorted(cov.float_between_qdq.items()))
            count = sum(cov.float_between_qdq.values())
            text = f"{count} float ops stay between DequantizeLinear and QuantizeLinear ({ops}), each a conversion to float and back."
            # each written-out HardSwish ends in a Mul: only a float Mul can be one (the
            # others run as QLinearMul, or sit in the layers kept in float)
            hardswish = min(self.hardswish_written_out, cov.float_between_qdq.get("Mul", 0))
            if hardswish:
                text += (
                    f" Up to {hardswish} of them are HardSwish written out (x * "
                    "HardSigmoid(x) or x * Clip(x + 3, 0, 6) / 6) below opset 14: try "
                    "--target-opset 14 (opfuse then folds each into one HardSwish op)."
                )
            causes.append(text)
        if cov is not None and cov.total_macs and cov.integer_fraction < 0.9:
            kept = (
                f" ({', '.join(k.node for k in self.kept_float)} kept in float to pass the gate)"
                if self.kept_float
                else ""
            )
            causes.append(
                f"Only {cov.integer_fraction:.0%} of the multiply-adds run in integer kernels{kept}."
            )
        if self.fusions is not None and self.fusions.lost:
            causes.append(self.fusions.lost_cause(self.recipe))
        if self.cpu is not None and not self.cpu.vnni:
            causes.append(self.cpu.int8_verdict())
        if orig_ms < SMALL_MODEL_S * 1000:
            causes.append(
                f"The model runs in {orig_ms:.2g} ms: around layers this small the Q/DQ "
                "conversions cost about what the int8 kernels save."
            )
        if not causes:
            causes.append(
                "every multiply-add runs in integer kernels with no float op between Q and DQ, "
                "yet the int8 kernels ran slower than float here; try --activation-type "
                "uint8 (onnxruntime x86's fast kernels take unsigned activations) or another "
                "--runtime."
            )
        return causes


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"
