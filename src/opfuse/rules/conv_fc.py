"""A 1x1 Conv over a 1x1 spatial map is a fully connected layer (CANN's
ConvToFullyConnectionFusionPass).

    Flatten(Conv(x[N,C,1,1], W[M,C,1,1], b), axis=1)        ==>  Gemm(Flatten(x), W[M,C], b, transB=1)
    Reshape(Conv(...), [N or 0 or -1, M or 0 or -1])

Same products and sums; the runtime's Gemm may add them in another order than its
Conv, so results can differ in the last ulp.
"""

from __future__ import annotations

from opfuse.rewrite import Builder, Match, Op, Optional, PassContext, Rule, Var
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr


def reshape_keeps_two_dims(target: list[int], n: object, m: int, allowzero: bool) -> bool:
    """Whether Reshape(y[N, M, 1, ...], target) gives [N, M]."""
    if len(target) != 2 or target.count(-1) > 1 or (allowzero and 0 in target):
        return False
    first, second = target
    return first in (0, -1, *([n] if isinstance(n, int) else [])) and second in (0, -1, m)


class ConvToFullyConnectionRule(Rule):
    """Flatten/Reshape(Conv 1x1 over a 1x1 map) ==> Gemm(Flatten(x), W, b, transB=1)"""

    name = "conv_to_fc"
    pattern = Op(
        ("Flatten", "Reshape"),
        Op("Conv", Var("x"), Var("w"), Optional(Var("b")), name="conv"),
        Optional(Var("shape")),
        name="flat",
    )
    constants = ("w", "shape")

    def check(self, m: Match, ctx: PassContext) -> str | None:
        w = m["w"]
        x = m.value("x")
        if attr(m.node("conv"), "group", 1) != 1:
            return "Conv is grouped"
        if w.ndim < 3 or any(d != 1 for d in w.shape[2:]):
            return "kernel is not 1x1"
        if any(attr(m.node("conv"), "pads", [0]) or [0]):
            return "Conv has padding"
        if x.shape is None or len(x.shape) != w.ndim:
            return "input rank unknown"
        if any(d != 1 for d in list(x.shape)[2:]):
            return "input spatial dims are not all 1"
        flat = m.node("flat")
        if flat.op_type == "Flatten":
            axis = attr(flat, "axis", 1)
            if axis not in (1, 1 - w.ndim):
                return "Flatten does not flatten at axis 1"
            return None
        target = [int(d) for d in m["shape"].reshape(-1)]
        allowzero = bool(attr(flat, "allowzero", 0))
        if not reshape_keeps_two_dims(target, x.shape[0], int(w.shape[0]), allowzero):
            return "Reshape does not give [batch, channels]"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        conv, w = m.node("conv"), m["w"]
        name = conv.name or "conv"
        flat = b.op("Flatten", [m.value("x")], {"axis": 1}, like=m.node("flat"))
        inputs = [flat, b.const(w.reshape(w.shape[0], -1), f"{name}.weight_fc")]
        if "b" in m:
            inputs.append(m.value("b"))
        return [b.op("Gemm", inputs, {"transB": 1}, like=conv)]


register(
    PassInfo(
        "ConvToFullyConnectionFusionPass",
        "Turn a 1x1 Conv over a 1x1 spatial map followed by Flatten/Reshape into Flatten + Gemm",
        rules=(ConvToFullyConnectionRule(),),
    )
)
