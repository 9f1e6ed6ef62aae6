"""HardSwish written out in small ops, folded into one HardSwish (opset 14+).

    x * Clip(x + 3, 0, 6) / 6          ==>  HardSwish(x)
    x * Clip(x + 3, 0, 6) * (1/6)      ==>  HardSwish(x)
    x * (Clip(x + 3, 0, 6) / 6)        ==>  HardSwish(x)   (and with * (1/6))
    x * HardSigmoid(x, 1/6, 0.5)       ==>  HardSwish(x)

HardSwish(x) is defined as ``x * max(0, min(1, x/6 + 1/2))``, which is
``x * Clip(x + 3, 0, 6) / 6`` in real arithmetic: exact up to the rounding of the last
ulp (the written-out form rounds ``x + 3`` and the division, the kernel ``x/6 + 1/2``),
as every fusion of this kind. NaN stays NaN and +inf stays +inf in both forms.
"""

from __future__ import annotations

from opfuse.rewrite import Builder, Const, Match, Op, Or, PassContext, Rule, Var
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import rank

SIXTH_RTOL = 1e-6  # 1/6 as float32 (0.16666667) is within 3e-8 of 1/6

X = Var("x")
RELU6 = Op(
    "Clip",
    Op("Add", X, Const("three", value=3.0), name="add"),
    Const("low", value=0.0),
    Const("high", value=6.0),
    name="clip",
)
SIXTH_OF_RELU6 = Or(
    Op("Div", RELU6, Const("six", value=6.0), name="scale"),
    Op("Mul", RELU6, Const("sixth", value=1 / 6, rtol=SIXTH_RTOL), name="scale"),
)
HARD_SIGMOID = Op(
    "HardSigmoid",
    X,
    name="hard_sigmoid",
    attrs={
        "alpha": lambda a: a is not None and abs(a - 1 / 6) <= SIXTH_RTOL,
        "beta": lambda b: b is None or b == 0.5,  # 0.5 is its default
    },
)


class HardSwishRule(Rule):
    """x * Clip(x + 3, 0, 6) / 6 in its groupings, or x * HardSigmoid(x) ==> HardSwish(x)"""

    name = "hardswish"
    pattern = Or(
        Op("Div", Op("Mul", X, RELU6, name="product"), Const("six", value=6.0)),
        Op(
            "Mul",
            Op("Mul", X, RELU6, name="product"),
            Const("sixth", value=1 / 6, rtol=SIXTH_RTOL),
        ),
        Op("Mul", X, Or(SIXTH_OF_RELU6, HARD_SIGMOID)),
    )

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.value("x").dtype
        if dtype is None or not dtype.is_floating_point():
            return "input is not a float tensor"
        x_rank = rank(m.value("x"))
        for name in ("three", "low", "high", "six", "sixth"):
            if name not in m:
                continue
            if m[name].size != 1:
                return f"the {name} constant is not a single value"
            if m[name].ndim > 0 and (x_rank is None or m[name].ndim > x_rank):
                return f"the {name} constant's rank may broadcast the output up"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [b.op("HardSwish", [m.value("x")], like=m.root)]


register(
    PassInfo(
        "HardSwishFusionPass",
        "Fold x * Clip(x + 3, 0, 6) / 6 (also * 1/6, and x * HardSigmoid(x)) into HardSwish",
        opset_min=14,
        rules=(HardSwishRule(),),
    )
)
