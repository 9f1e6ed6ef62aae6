"""Softmax written out in small ops, folded back into one Softmax (CANN's SoftmaxFusionPass).

    e = Exp(x - ReduceMax(x, axis))
    y = Div(e, ReduceSum(e, axis))                  ==>  y = Softmax(x, axis)

Both reductions must keep their dims and reduce one and the same axis. Before opset 13
Softmax flattens the input to 2-D at ``axis`` and normalises over all the trailing dims
together, which equals the written-out form only for the last axis.

SoftmaxNoMaxFusionPass (off by default) folds the form without ``ReduceMax``
(``e = Exp(x)``). Softmax subtracts the maximum itself, so it gives the same numbers
except where the original's Exp leaves the float range: above ~88 (float32; ~11 for
float16) Exp(x) is inf and the original yields NaN, and when a whole row lies below
~-87 its Exp values are denormal or zero and the original loses precision or yields
0/0. Softmax gives the right value in both cases, so the results differ there.
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir

from opfuse.rewrite import Builder, Match, Op, Or, PassContext, Rule, Var
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr, rank, reduce_axes


def single_axis(node: ir.Node, x_rank: int | None) -> tuple[int | None, str | None]:
    """The one axis a keepdims reduction reduces, normalised when the rank is known."""
    axes = reduce_axes(node)
    if axes is None:
        return None, f"{node.op_type} axes are not constant"
    if len(axes) != 1:
        return None, f"{node.op_type} does not reduce exactly one axis"
    if not attr(node, "keepdims", 1):
        return None, f"{node.op_type} drops the reduced axis (keepdims=0)"
    axis = axes[0]
    if axis < 0 and x_rank is not None:
        axis += x_rank
    return axis, None


X = Var("x")
# one Exp node read twice; the max subtraction when it is there, else x is Exp's input
EXP = Op(
    "Exp",
    Or(Op("Sub", X, Op("ReduceMax", X, name="max", variadic=True), name="sub"), X),
    name="exp",
)


class SoftmaxRule(Rule):
    """Div(Exp(x - ReduceMax(x)), ReduceSum(Exp(...))) on one axis ==> Softmax(x, axis)"""

    name = "softmax"
    pattern = Op("Div", EXP, Op("ReduceSum", EXP, name="sum", variadic=True), name="div")
    with_max: ClassVar[bool] = True

    def check(self, m: Match, ctx: PassContext) -> str | None:
        if self.with_max and "max" not in m:
            return (
                "no max subtraction: Softmax differs where Exp overflows (SoftmaxNoMaxFusionPass)"
            )
        if not self.with_max and "max" in m:
            return "has the max subtraction (SoftmaxFusionPass)"
        x = m.value("x")
        x_rank = rank(x)
        if x.dtype is None or not x.dtype.is_floating_point():
            return "input is not a float tensor"
        axis, reason = single_axis(m.node("sum"), x_rank)
        if reason:
            return reason
        if "max" in m:
            max_axis, reason = single_axis(m.node("max"), x_rank)
            if reason:
                return reason
            if max_axis != axis:
                return "ReduceMax and ReduceSum reduce different axes"
        if ctx.opset < 13:
            if x_rank is None:
                return "input rank unknown (Softmax before opset 13 needs the last axis)"
            if axis not in (-1, x_rank - 1):
                return "Softmax before opset 13 normalises all dims after axis: not the last axis"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        axis, _ = single_axis(m.node("sum"), rank(m.value("x")))
        return [b.op("Softmax", [m.value("x")], {"axis": axis}, like=m.root)]


class SoftmaxNoMaxRule(SoftmaxRule):
    """Div(Exp(x), ReduceSum(Exp(x))) on one axis ==> Softmax(x, axis)"""

    name = "softmax_no_max"
    with_max = False


register(
    PassInfo(
        "SoftmaxFusionPass",
        "Fold Exp(x - ReduceMax) / ReduceSum / Div into Softmax",
        rules=(SoftmaxRule(),),
    )
)

register(
    PassInfo(
        "SoftmaxNoMaxFusionPass",
        "Fold Exp / ReduceSum / Div without the max subtraction into Softmax",
        default=False,
        rules=(SoftmaxNoMaxRule(),),
        note="not exact: where Exp overflows (x above ~88 in float32) the original gives "
        "NaN, and where a whole row underflows it is imprecise or NaN; Softmax gives the "
        "right value there",
    )
)
