"""Clip/Relu right before a QuantizeLinear whose saturation already clips the same way
(Relu6QuantFusionPass).

QuantizeLinear computes ``Q(v) = clamp(round(v / scale) + zp, qmin, qmax)``, a
non-decreasing function of v. For any non-decreasing Q and lo <= hi,

    Q(clip(v, lo, hi)) = clamp(Q(v), Q(lo), Q(hi))

(below lo both sides are Q(lo), above hi both are Q(hi), in between both are Q(v)).
So the clip changes nothing exactly when ``Q(lo) = qmin`` and ``Q(hi) = qmax``, since
``Q(v)`` already lies in [qmin, qmax]. Per case (checked for every scale/zero point of
a per-axis quantization):

* lower bound implied: lo = -inf, or round(lo / scale) + zp <= qmin. For Relu and
  Clip(0, ...): Q(0) = zp, so exactly when the zero point is the type's minimum
  (uint8 with zp 0, int8 with zp -128).
* upper bound implied: hi = +inf (Relu), or round(hi / scale) + zp >= qmax; for
  Relu6 into uint8 with scale 6/255: 6 / (6/255) = 255 -> qmax.

Both implied: the Clip/Relu is removed. Only the upper implied and lo = 0: Clip(0, hi)
becomes Relu (Q(Relu(v)) = clamp(Q(v), zp, qmax) = clamp(Q(v), Q(0), Q(hi))).
Otherwise it stays. The runtime divides in float32 where we compute in float64, so
the bounds must hold with a margin of 0.25 of a quantization step (a case within the
margin is refused, never wrongly accepted).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import Op, Optional, Var, const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr

MARGIN = 0.25
QUANT_RANGES = {
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT16: (-32768, 32767),
    ir.DataType.UINT4: (0, 15),
    ir.DataType.INT4: (-8, 7),
}


def clip_bounds(node: ir.Node, opset: int) -> tuple[float, float] | str:
    """(lo, hi) of a Relu or Clip, or why they are not constants."""
    if node.op_type == "Relu":
        return 0.0, float("inf")
    if opset < 11:
        return float(attr(node, "min", -np.inf)), float(attr(node, "max", np.inf))
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        value = node.inputs[i] if len(node.inputs) > i else None
        if value is None:
            bounds.append(float(default))
            continue
        array = const_array(value)
        if array is None or array.size != 1:
            return "Clip bounds are not constant scalars"
        bounds.append(float(array.reshape(-1)[0]))
    return bounds[0], bounds[1]


class ClipQuantMatch(Match):
    mode: str = "remove"  # what the check found: "remove" the Clip/Relu or make it a "relu"


class Relu6QuantRule(Rule[ClipQuantMatch]):
    """QuantizeLinear(Clip(x, lo, hi) | Relu(x)) ==> QuantizeLinear(x) or
    QuantizeLinear(Relu(x)) when the quantized range clips at the same bounds"""

    name = "relu6_quant"
    pattern = Op(
        "QuantizeLinear",
        Op(("Clip", "Relu"), Var("x"), name="act", variadic=True),
        Var("scale"),
        Optional(Var("zp")),
        name="quant",
    )
    constants = ("scale", "zp")
    match_type = ClipQuantMatch

    def check(self, m: ClipQuantMatch, ctx: PassContext) -> str | None:
        bounds = clip_bounds(m.node("act"), ctx.opset)
        if isinstance(bounds, str):
            return bounds
        lo, hi = bounds
        if np.isnan(lo) or np.isnan(hi) or lo > hi:
            return "Clip bounds are NaN or crossed"
        dtype = m.root.outputs[0].dtype
        if dtype not in QUANT_RANGES:
            return f"QuantizeLinear output type {dtype} is not an integer type it knows"
        qmin, qmax = QUANT_RANGES[dtype]
        scale = m["scale"].astype(np.float64)
        zp = m["zp"].astype(np.float64) if "zp" in m else np.zeros(1)
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            return "QuantizeLinear scale is not finite and positive"
        if scale.size != 1 and zp.size != 1 and scale.shape != zp.shape:
            return "scale and zero point shapes differ"
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lower = lo == -np.inf or bool(np.all(lo / scale + zp <= qmin + MARGIN))
            upper = hi == np.inf or bool(np.all(hi / scale + zp >= qmax - MARGIN))
        act = m.node("act").op_type
        if lower and upper:
            m.mode = "remove"
        elif upper and lo == 0 and act == "Clip":
            m.mode = "relu"
        else:
            low = float(np.min((qmin - zp) * scale))
            high = float(np.max((qmax - zp) * scale))
            return (
                f"the quantized range [{low:g}, {high:g}] does not clip at the {act} "
                f"bounds [{lo:g}, {hi:g}]"
            )
        return None

    def rewrite(self, m: ClipQuantMatch, b: Builder, ctx: PassContext):
        quant, act = m.node("quant"), m.node("act")
        x = m.value("x")
        if m.mode == "relu":
            x = b.op("Relu", [x], like=act)
        inputs = [x, *quant.inputs[1:]]
        return [b.op("QuantizeLinear", inputs, dict(quant.attributes.items()), like=quant)]


register(
    PassInfo(
        "Relu6QuantFusionPass",
        "Remove a Clip/Relu before a QuantizeLinear whose saturation clips at the same bounds, "
        "or turn Clip(0, hi) into Relu when only the upper bound is implied",
        opset_min=10,
        rules=(Relu6QuantRule(),),
    )
)
