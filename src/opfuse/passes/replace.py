"""Operator replacement (Atlas tuning guide): Pow with a constant exponent becomes the
cheaper elementwise ops that compute it.

    Pow(x, 2)    ==> Mul(x, x)                 exact (onnxruntime computes x*x itself)
    Pow(x, 3)    ==> Mul(Mul(x, x), x)         may differ from pow() in the last ulp
    Pow(x, 1)    ==> x                         exact
    Pow(x, 0.5)  ==> Sqrt(x)                   exact for finite x (both correctly rounded)
    Pow(x, -1)   ==> Reciprocal(x)             exact (both correctly rounded)
    Pow(x, -0.5) ==> Reciprocal(Sqrt(x))       two roundings: may differ in the last ulp

Outside the last ulp (well inside the verifier's tolerance) only IEEE special cases
differ: pow(-inf, 0.5) is +inf where Sqrt gives NaN, and pow(-0, -0.5) is +inf where
1/Sqrt(-0) is -inf.
"""

from __future__ import annotations

from opfuse.passes._util import rank
from opfuse.registry import PassInfo, register
from opfuse.rewrite import Builder, Match, Op, PassContext, Rule, Var

FLOAT_ONLY = {0.5, -1.0, -0.5}  # their replacements are float-only ops
EXPONENTS = {2.0, 3.0, 1.0, *FLOAT_ONLY}


class PowToMulRule(Rule):
    """Pow(x, c) with c in {2, 3, 1, 0.5, -1, -0.5} ==> Mul / Sqrt / Reciprocal / x"""

    name = "pow_to_mul"
    pattern = Op("Pow", Var("x"), Var("e"))
    constants = ("e",)

    def check(self, m: Match, ctx: PassContext) -> str | None:
        e = m["e"]
        if e.size != 1:
            return "exponent is not a single value"
        x_rank = rank(m.value("x"))
        if e.ndim > 0 and (x_rank is None or e.ndim > x_rank):
            return "exponent's rank may broadcast the output"
        value = float(e.reshape(-1)[0])
        if value not in EXPONENTS:
            return f"exponent {value:g} has no cheaper form"
        dtype = m.value("x").dtype
        if dtype is None:
            return "input dtype unknown"
        if value in FLOAT_ONLY and not dtype.is_floating_point():
            return f"exponent {value:g} needs a float input"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        x = m.value("x")
        value = float(m["e"].reshape(-1)[0])
        pow_node = m.root
        if value == 1.0:
            return [x]
        if value == 2.0:
            return [b.op("Mul", [x, x], like=pow_node)]
        if value == 3.0:
            square = b.op("Mul", [x, x], name=f"{pow_node.name}/square" if pow_node.name else None)
            return [b.op("Mul", [square, x], like=pow_node)]
        if value == 0.5:
            return [b.op("Sqrt", [x], like=pow_node)]
        if value == -1.0:
            return [b.op("Reciprocal", [x], like=pow_node)]
        root = b.op("Sqrt", [x], name=f"{pow_node.name}/sqrt" if pow_node.name else None)
        return [b.op("Reciprocal", [root], like=pow_node)]


register(
    PassInfo(
        "PowToMulFusionPass",
        "Replace Pow with a constant exponent 2, 3, 1, 0.5, -1, -0.5 by Mul, Sqrt, "
        "Reciprocal or nothing",
        rules=(PowToMulRule(),),
        note="exponents 3 and -0.5 may differ from pow() in the last ulp; "
        "Pow(-inf, 0.5) is inf where Sqrt gives NaN",
    )
)
