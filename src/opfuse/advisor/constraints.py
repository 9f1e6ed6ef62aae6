"""Operator constraint hints from the Atlas tuning guide: channel alignment, replaceable ops,
Resize with align_corners whose scale is not an integer, ops that fell back to another
execution provider (or to the AI CPU on Ascend)."""

from __future__ import annotations

from dataclasses import dataclass

from opfuse.advisor.graph import OpGraph
from opfuse.advisor.pass_verdict import Verdict
from opfuse.advisor.profile_readers import OpRecord
from opfuse.advisor.trial import registered

# op type -> (what to use instead, the opfuse pass that does it or None)
REPLACEABLE: dict[str, tuple[str, str | None]] = {
    "Pow": (
        "Mul / Reciprocal for a constant exponent 2, 3, -1 (Sqrt for 0.5: PowToSqrtFusionPass, off by default)",
        "PowToMulFusionPass",
    ),
    "Einsum": ("MatMul with Transpose/Reshape", None),
    "Upsample": ("Resize (Upsample is deprecated since opset 10)", None),
    "ReduceL2": ("Mul + ReduceSum + Sqrt", None),
}


# why a hint of this kind names no opfuse pass (the verdict's reason)
NO_PASS = {
    "alignment": "no opfuse pass pads channels (it would change the weights: pad or retrain "
    "the model)",
    "resize_align_corners": "no opfuse pass changes tensor sizes (they are the model's own)",
    "fallback": "no opfuse pass moves operators between execution units",
}


@dataclass
class Hint:
    kind: str  # alignment | replace | resize_align_corners | fallback
    node: str
    op_type: str
    message: str
    duration_us: float = 0.0
    opfuse_pass: str | None = None
    verdict: Verdict | None = None
    gain_us: float | None = None  # estimated saving per run where the guide gives one

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "node": self.node,
            "op_type": self.op_type,
            "message": self.message,
            "duration_us": round(self.duration_us, 3),
            "gain_us": round(self.gain_us, 3) if self.gain_us is not None else None,
            "opfuse": (self.verdict or self.no_verdict()).to_json(),
        }

    def no_verdict(self) -> Verdict:
        """The verdict where no trial was run for this hint."""
        if self.opfuse_pass is not None:
            return Verdict(
                self.opfuse_pass, available=self.opfuse_pass in registered(), reason="not tried"
            )
        reason = NO_PASS.get(self.kind, f"no opfuse pass replaces {self.op_type}")
        return Verdict(None, available=False, reason=reason)


ALIGN_GAIN = 0.20  # the tuning guide: aligned convolutions measured ~20% faster
SMALL_CHANNELS = 4  # image inputs (RGB) and output heads (a mask, a score): nothing to pad


def _group(value: object) -> int:
    """A Conv's ``group`` attribute (1 when absent)."""
    return int(value) if isinstance(value, int | float | str) and value else 1


def alignment_hints(g: OpGraph, times: dict[int, float], alignment: int) -> list[Hint]:
    """Conv channels that are not a multiple of the target's alignment (the guide: ~20%),
    except counts of at most 4 (an RGB input, a 1-channel output head): padding those
    multiplies the work for nothing."""
    hints = []
    for node in g.nodes:
        if node.op_type not in ("Conv", "ConvTranspose") or not node.const_inputs:
            continue
        w = g.shapes.get(node.const_inputs[0])
        if not w or len(w) < 3:
            continue
        d0, d1 = w[0], w[1]
        if d0 is None or d1 is None:
            continue
        group = _group(node.attrs.get("group"))
        if node.op_type == "Conv":
            cout, cin = int(d0), int(d1) * group
        else:
            cin, cout = int(d0), int(d1) * group
        bad = [
            f"{label} {c}"
            for label, c in (("input channels", cin), ("output channels", cout))
            if c % alignment and c > SMALL_CHANNELS
        ]
        if bad:
            took = times.get(node.index, 0.0)
            hints.append(
                Hint(
                    "alignment",
                    node.name,
                    node.op_type,
                    f"{' and '.join(bad)} not a multiple of {alignment}: pad the channels; "
                    f"estimated gain {ALIGN_GAIN * took:.1f} us per run (the tuning guide "
                    f"measures ~{ALIGN_GAIN:.0%} faster convolutions when aligned)",
                    took,
                    gain_us=ALIGN_GAIN * took,
                )
            )
    return hints


def replace_hints(g: OpGraph, times: dict[int, float]) -> list[Hint]:
    hints = []
    for node in g.nodes:
        if node.op_type in REPLACEABLE:
            instead, pass_name = REPLACEABLE[node.op_type]
            hints.append(
                Hint(
                    "replace",
                    node.name,
                    node.op_type,
                    f"replace {node.op_type} by {instead}",
                    times.get(node.index, 0.0),
                    pass_name,
                )
            )
    return hints


def resize_hints(g: OpGraph, times: dict[int, float]) -> list[Hint]:
    """Resize with align_corners is fast only when (dst-1)/(src-1) is an integer on each
    spatial axis (the guide's 175->350 at 20 ms vs 176->351 at 1.6 ms)."""
    hints = []
    for node in g.nodes:
        if node.op_type not in ("Resize", "Upsample", "Interp", "ResizeBilinearV2"):
            continue
        mode = node.attrs.get("coordinate_transformation_mode")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if node.op_type == "Resize" and mode != "align_corners":
            continue
        src = g.shapes.get(node.inputs[0]) if node.inputs else None
        dst = g.shapes.get(node.outputs[0]) if node.outputs else None
        if not src or not dst or len(src) != len(dst) or len(src) < 3:
            continue
        bad = []
        for axis in range(2, len(src)):
            s, d = src[axis], dst[axis]
            if s is None or d is None or s <= 1 or s == d:
                continue
            if (d - 1) % (s - 1):
                k = max(1, round((d - 1) / (s - 1)))
                bad.append(
                    f"axis {axis}: ({d}-1)/({s}-1) = {(d - 1) / (s - 1):.3f}; "
                    f"input {s + 1} and output {k * s + 1} make it {k} "
                    f"(or output {k * (s - 1) + 1})"
                )
        if bad:
            hints.append(
                Hint(
                    "resize_align_corners",
                    node.name,
                    node.op_type,
                    "align_corners scale is not an integer: " + "; ".join(bad),
                    times.get(node.index, 0.0),
                )
            )
    return hints


def fallback_hints(records: list[OpRecord], provider: str, source: str) -> list[Hint]:
    """Nodes that ran on another execution provider than the one asked for (or on the AI
    CPU in an Ascend op summary)."""
    hints = []
    for rec in records:
        if source == "op_summary":
            if rec.provider.upper().replace(" ", "_") != "AI_CPU":
                continue
            message = (
                "runs on the AI CPU: replace it by an AI Core operator (the guide's Pow -> Mul)"
            )
        elif provider and rec.provider and rec.provider != provider:
            message = f"fell back from {provider} to {rec.provider}"
        else:
            continue
        hints.append(Hint("fallback", rec.name, rec.op_type, message, rec.duration_us))
    return hints
