"""Operator replacement (Atlas tuning guide): Pow with a constant exponent becomes the
cheaper elementwise ops that compute it.

PowToMulFusionPass (on by default), bit-identical to onnxruntime's Pow on inf, -inf,
NaN, -0 and overflow (onnxruntime itself computes x*x and x*x*x for 2 and 3):

    Pow(x, 2)    ==> Mul(x, x)                 bit-identical
    Pow(x, 3)    ==> Mul(Mul(x, x), x)         bit-identical
    Pow(x, 1)    ==> x                         bit-identical for float and int32 inputs
    Pow(x, -1)   ==> Reciprocal(x)             1/x is correctly rounded; onnxruntime's
                                               pow(x, -1) is 1 ulp off for ~0.06% of x

onnxruntime computes Pow(int64, 1) through double: above 2**53 it rounds x, and it
turns INT64_MAX into INT64_MIN. So exponent 1 on int64 input is left alone.

A Pow(x, 3) that is the x^3 of GPT-2's tanh GELU, 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x +
0.044715 * x^3))), is left alone: onnxruntime fuses that GELU into one FastGelu kernel only
while x^3 is a Pow (its session's fusion at ORT_ENABLE_ALL and its transformers optimizer
alike), and the two Muls would cost it (a 4-layer GPT-2 dynamo export: FastGelu 4 -> 0).
PowToMulInGeluFusionPass (off by default) rewrites those too, for a runtime without that
fusion, where a measurement (``opfuse tune`` tries it) says it pays.

PowToSqrtFusionPass (off by default): the results differ on special values.

    Pow(x, 0.5)  ==> Sqrt(x)                   pow(-inf, 0.5) = +inf, Sqrt(-inf) = NaN;
                                               pow(-0, 0.5) = +0, Sqrt(-0) = -0
    Pow(x, -0.5) ==> Reciprocal(Sqrt(x))       pow(-inf, -0.5) = +0, here NaN;
                                               pow(-0, -0.5) = +inf, here -inf;
                                               elsewhere two roundings: ~1 ulp
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir

from opfuse.rewrite import Builder, Match, Op, PassContext, Rule, Var
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import rank, tanh_gelu_cube

MUL_EXPONENTS = (2.0, 3.0, 1.0, -1.0)
IN_GELU = (
    "the Pow is the x^3 of a tanh GELU, which onnxruntime fuses into FastGelu only while it "
    "is a Pow (PowToMulInGeluFusionPass rewrites it)"
)
SQRT_EXPONENTS = (0.5, -0.5)
FLOAT_ONLY = {-1.0, *SQRT_EXPONENTS}  # their replacements are float-only ops


def _name(node: ir.Node, suffix: str) -> str | None:
    return f"{node.name}/{suffix}" if node.name else None


class _PowRule(Rule):
    """Pow(x, c) with a constant single-value exponent c in ``exponents``."""

    pattern = Op("Pow", Var("x"), Var("e"))
    constants = ("e",)
    exponents: ClassVar[tuple[float, ...]]
    elsewhere: ClassVar[dict[float, str]] = {}  # exponent -> why this pass leaves it

    def check(self, m: Match, ctx: PassContext) -> str | None:
        e = m["e"]
        if e.size != 1:
            return "exponent is not a single value"
        x_rank = rank(m.value("x"))
        if e.ndim > 0 and (x_rank is None or e.ndim > x_rank):
            return "exponent's rank may broadcast the output"
        value = float(e.reshape(-1)[0])
        if value in self.elsewhere:
            return self.elsewhere[value]
        if value not in self.exponents:
            return f"exponent {value:g} has no cheaper form"
        dtype = m.value("x").dtype
        if dtype is None:
            return "input dtype unknown"
        if value in FLOAT_ONLY and not dtype.is_floating_point():
            return f"exponent {value:g} needs a float input"
        if value == 1.0 and dtype == ir.DataType.INT64:
            return "onnxruntime's Pow(int64, 1) rounds through double: x is not its result"
        return None


class PowToMulRule(_PowRule):
    """Pow(x, c) with c in {2, 3, 1, -1} ==> Mul / Mul(Mul) / x / Reciprocal"""

    name = "pow_to_mul"
    exponents = MUL_EXPONENTS
    elsewhere = {
        c: f"exponent {c:g} needs Sqrt, which differs on -inf and -0 (PowToSqrtFusionPass)"
        for c in SQRT_EXPONENTS
    }

    def check(self, m: Match, ctx: PassContext) -> str | None:
        reason = super().check(m, ctx)
        if reason is None and float(m["e"].reshape(-1)[0]) == 3.0 and tanh_gelu_cube(m.root):
            return IN_GELU
        return reason

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        x = m.value("x")
        value = float(m["e"].reshape(-1)[0])
        pow_node = m.root
        if value == 1.0:
            return [x]
        if value == 2.0:
            return [b.op("Mul", [x, x], like=pow_node)]
        if value == 3.0:
            return [_cube(x, pow_node, b)]
        return [b.op("Reciprocal", [x], like=pow_node)]


def _cube(x: ir.Value, pow_node: ir.Node, b: Builder) -> ir.Value:
    square = b.op("Mul", [x, x], name=_name(pow_node, "square"))
    return b.op("Mul", [square, x], like=pow_node)


class PowToMulInGeluRule(_PowRule):
    """Pow(x, 3) that is the x^3 of a tanh GELU ==> Mul(Mul(x, x), x)"""

    name = "pow_to_mul_in_gelu"
    exponents = (3.0,)

    def check(self, m: Match, ctx: PassContext) -> str | None:
        reason = super().check(m, ctx)
        if reason is None and not tanh_gelu_cube(m.root):
            return "not the x^3 of a tanh GELU (PowToMulFusionPass rewrites it)"
        return reason

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [_cube(m.value("x"), m.root, b)]


class PowToSqrtRule(_PowRule):
    """Pow(x, 0.5) ==> Sqrt(x); Pow(x, -0.5) ==> Reciprocal(Sqrt(x))"""

    name = "pow_to_sqrt"
    exponents = SQRT_EXPONENTS

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        x = m.value("x")
        pow_node = m.root
        if float(m["e"].reshape(-1)[0]) == 0.5:
            return [b.op("Sqrt", [x], like=pow_node)]
        root = b.op("Sqrt", [x], name=_name(pow_node, "sqrt"))
        return [b.op("Reciprocal", [root], like=pow_node)]


register(
    PassInfo(
        "PowToMulFusionPass",
        "Replace Pow with a constant exponent 2, 3, 1, -1 by Mul, Reciprocal or nothing",
        rules=(PowToMulRule(),),
        note="exponent -1: Reciprocal is correctly rounded where onnxruntime's pow is "
        "sometimes 1 ulp off. A Pow(x, 3) that is the x^3 of a tanh GELU (GPT-2's) is left "
        "alone: onnxruntime fuses that GELU into FastGelu only while x^3 is a Pow "
        "(PowToMulInGeluFusionPass rewrites it)",
    )
)

register(
    PassInfo(
        "PowToMulInGeluFusionPass",
        "Replace the Pow(x, 3) of a tanh GELU (GPT-2's) by Mul(Mul(x, x), x)",
        default=False,
        rules=(PowToMulInGeluRule(),),
        note="off by default: onnxruntime fuses 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + "
        "0.044715 * x^3))) into one FastGelu kernel only while x^3 is a Pow (at ORT_ENABLE_ALL "
        "and in its transformers optimizer: a 4-layer GPT-2 export's FastGelu 4 -> 0 with it); for "
        "a runtime without that fusion, where a measurement says it pays (opfuse tune tries "
        "it); optimize --benchmark names the FastGelu it costs",
    )
)

register(
    PassInfo(
        "PowToSqrtFusionPass",
        "Replace Pow with a constant exponent 0.5 or -0.5 by Sqrt or Reciprocal(Sqrt)",
        default=False,
        rules=(PowToSqrtRule(),),
        note="not exact on special values: Pow(-inf, 0.5) is +inf where Sqrt gives NaN, "
        "Pow(-0, 0.5) is +0 where Sqrt gives -0; Pow(-inf, -0.5) is +0 where "
        "1/Sqrt(-inf) is NaN, Pow(-0, -0.5) is +inf where 1/Sqrt(-0) is -inf; "
        "-0.5 rounds twice (about 1 ulp)",
    )
)
