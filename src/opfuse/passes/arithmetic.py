"""Grappler's arithmetic optimizer: constants pushed together, neutral elements removed.

    Add(Add(x, c2), c1)  ==> Add(x, c1 + c2)       and every Add/Sub mix
    Mul(Mul(x, c2), c1)  ==> Mul(x, c1 * c2)       and every Mul/Div mix (float only)
    Sum(c1, x, c2, y)    ==> Sum(c1 + c2, x, y)
    Concat(a, c1, c2, b) ==> Concat(a, [c1 c2], b)
    x + 0, x - 0, x * 1, x / 1 ==> x (Expand when the constant broadcasts x)
    0 - y ==> Neg(y)     1 / y ==> Reciprocal(y)
    x * 0 ==> 0          (MulByZeroFusionPass, off: wrong for inf and NaN)

Float reassociation rounds differently from the original order (within the verifier's
tolerance, as Grappler's constant push-down does); integer Add/Sub/Mul chains are exact
(two's complement wraps the same way in any order). Integer division never reassociates.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.passes._util import attr, static_shape
from opfuse.registry import PassInfo, register
from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import const_array

# (the non-constant operand, its sign/exponent, the constant, its sign/exponent)
Term = tuple[ir.Value, int, np.ndarray, int]


def _binary_const(node: ir.Node) -> tuple[ir.Value, np.ndarray, int] | None:
    """(x, c, position of c) for a binary node with exactly one constant operand."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    ca, cb = const_array(node.inputs[0]), const_array(node.inputs[1])
    if (ca is None) == (cb is None):
        return None
    if ca is not None:
        return node.inputs[1], ca, 0
    assert cb is not None
    return node.inputs[0], cb, 1


def _term(node: ir.Node) -> Term | None:
    """Add/Sub as x*sx + c*sc; Mul/Div as x^sx * c^sc."""
    found = _binary_const(node)
    if found is None:
        return None
    x, c, pos = found
    if node.op_type in ("Add", "Mul"):
        return x, 1, c, 1
    return (x, -1, c, 1) if pos == 0 else (x, 1, c, -1)


def _operand_grows(x: ir.Value, c: np.ndarray) -> bool | None:
    """Whether broadcasting with ``c`` makes the result larger than x (None: unknown)."""
    if x.shape is None:
        return None
    if c.ndim > len(x.shape):
        return True
    for cd, xd in zip(reversed(c.shape), reversed(list(x.shape)), strict=False):
        if cd == 1:
            continue
        if not isinstance(xd, int):
            return None
        if cd != xd:
            return True
    return False


class ChainMatch(Match):
    inner: ir.Node
    outer: Term
    first: Term


class _ChainRule(Rule):
    ops: tuple[str, str]

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        outer = _term(node)
        if outer is None:
            return None
        inner = outer[0].producer()
        if inner is None or inner.op_type not in self.ops or inner.domain not in ("", "ai.onnx"):
            return None
        first = _term(inner)
        if first is None:
            return None
        m = ChainMatch(node)
        m.nodes += [node, inner]
        m.inner, m.outer, m.first = inner, outer, first
        m.consts["c_outer"], m.consts["c_inner"] = outer[2], first[2]
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.root.outputs[0].dtype
        if dtype is None:
            return "output dtype unknown"
        assert isinstance(m, ChainMatch)
        if any(c.dtype != dtype.numpy() for c in (m.outer[2], m.first[2])):
            return "constants differ from the output dtype"
        return None


class AddSubChainRule(_ChainRule):
    """(x ± k) ± c, c - (x ± k), ... ==> x ± K or K - x"""

    name = "add_sub_chain"
    roots = ("Add", "Sub")
    ops = ("Add", "Sub")

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        assert isinstance(m, ChainMatch)
        _, so, c, sc = m.outer
        x, sx, k, sk = m.first
        # sign of k in the result, sign of x; k and c cannot both be negated while x is,
        # since the outer constant is negated only in Sub(t, c), where t keeps its sign
        p, s = so * sk, so * sx
        if p > 0:
            total, sign = (k + c if sc > 0 else k - c), 1
        else:
            total, sign = (c - k, 1) if sc > 0 else (k + c, -1)
        return [self._build(b, m, x, s, sign, total)]

    @staticmethod
    def _build(b: Builder, m: Match, x: ir.Value, s: int, sign: int, total: np.ndarray):
        k = b.const(np.asarray(total), f"{m.root.name or 'add'}_const")
        if s > 0:
            return b.op("Add" if sign > 0 else "Sub", [x, k], like=m.root)
        return b.op("Sub", [k, x], like=m.root)


class MulDivChainRule(_ChainRule):
    """(x * k) * c, (x / k) * c, c / (x * k), ... ==> x * K, x / K or K / x"""

    name = "mul_div_chain"
    roots = ("Mul", "Div")
    ops = ("Mul", "Div")

    def check(self, m: Match, ctx: PassContext) -> str | None:
        reason = super().check(m, ctx)
        if reason:
            return reason
        assert isinstance(m, ChainMatch)
        dtype = m.root.outputs[0].dtype
        assert dtype is not None
        divides = "Div" in (m.root.op_type, m.inner.op_type)
        if not dtype.is_floating_point():
            return "integer division does not reassociate" if divides else None
        k, c = m.first[2], m.outer[2]
        if not (np.all(np.isfinite(k)) and np.all(np.isfinite(c))):
            return "a constant is not finite"
        if divides and (np.any(k == 0) or np.any(c == 0)):
            return "a divisor constant has zeros"
        with np.errstate(all="ignore"):
            total, _ = self._total(m)
        if not np.all(np.isfinite(total)):
            return "the combined constant overflows"
        return None

    @staticmethod
    def _total(m: ChainMatch) -> tuple[np.ndarray, int]:
        _, so, c, sc = m.outer
        _, _, k, sk = m.first
        p = so * sk
        if p > 0:
            return (k * c if sc > 0 else k / c), 1
        return (c / k, 1) if sc > 0 else (k * c, -1)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        assert isinstance(m, ChainMatch)
        total, sign = self._total(m)
        x, s = m.first[0], m.outer[1] * m.first[1]
        k = b.const(np.asarray(total).astype(m.outer[2].dtype), f"{m.root.name or 'mul'}_const")
        if s > 0:
            return [b.op("Mul" if sign > 0 else "Div", [x, k], like=m.root)]
        return [b.op("Div", [k, x], like=m.root)]


class SumConstantsRule(Rule):
    """Sum(c1, x, c2, y) ==> Sum(c1 + c2, x, y)"""

    name = "sum_constants"
    roots = ("Sum",)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        arrays = [const_array(v) for v in node.inputs]
        if sum(a is not None for a in arrays) < 2 or all(a is not None for a in arrays):
            return None
        m = Match(node)
        m.nodes.append(node)
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.root.outputs[0].dtype
        arrays = [a for a in map(const_array, m.root.inputs) if a is not None]
        if dtype is None or any(a.dtype != dtype.numpy() for a in arrays):
            return "constants differ from the output dtype"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        arrays = [a for a in map(const_array, m.root.inputs) if a is not None]
        total = arrays[0]
        for a in arrays[1:]:
            total = total + a
        k = b.const(np.asarray(total, dtype=arrays[0].dtype), f"{m.root.name or 'sum'}_const")
        rest = [v for v in m.root.inputs if const_array(v) is None]
        return [b.op("Sum", [k, *rest], like=m.root)]


class ConcatConstantsRule(Rule):
    """Concat(a, c1, c2, b) ==> Concat(a, concat(c1, c2), b)"""

    name = "concat_constants"
    roots = ("Concat",)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        arrays = [const_array(v) for v in node.inputs]
        if all(a is not None for a in arrays):
            return None  # constant folding's job
        if not any(
            a is not None and b is not None for a, b in zip(arrays, arrays[1:], strict=False)
        ):
            return None
        m = Match(node)
        m.nodes.append(node)
        return m

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        axis = attr(m.root, "axis", 0)
        inputs: list[ir.Value | None] = []
        run: list[np.ndarray] = []

        def flush() -> None:
            if len(run) == 1:
                inputs.append(pending[0])
            elif run:
                merged = np.concatenate(run, axis=axis)
                inputs.append(b.const(merged, f"{m.root.name or 'concat'}_const"))
            run.clear()
            pending.clear()

        pending: list[ir.Value] = []
        for v in m.root.inputs:
            a = const_array(v)
            if a is None:
                flush()
                inputs.append(v)
            else:
                assert v is not None
                run.append(a)
                pending.append(v)
        flush()
        return [b.op("Concat", inputs, {"axis": axis}, like=m.root)]


class NeutralMatch(Match):
    x: ir.Value
    c: np.ndarray


NEUTRAL = {"Add": (0, (0, 1)), "Sub": (0, (1,)), "Mul": (1, (0, 1)), "Div": (1, (1,))}


def _neutral_check(m: NeutralMatch) -> str | None:
    grows = _operand_grows(m.x, m.c)
    if grows is None:
        return "x's shape is unknown where the constant broadcasts"
    if grows and static_shape(m.root.outputs[0]) is None:
        return "the constant broadcasts x to a shape that is not static"
    return None


class NeutralElementRule(Rule):
    """x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 ==> x (Expand(x) when c broadcasts x)"""

    name = "neutral_element"
    roots = tuple(NEUTRAL)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        found = _binary_const(node)
        if found is None:
            return None
        x, c, pos = found
        neutral, positions = NEUTRAL[node.op_type]
        if pos not in positions or c.size == 0 or not np.all(c == neutral):
            return None
        m = NeutralMatch(node)
        m.nodes.append(node)
        m.x, m.c = x, c
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        assert isinstance(m, NeutralMatch)
        return _neutral_check(m)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        assert isinstance(m, NeutralMatch)
        if _operand_grows(m.x, m.c):
            shape = static_shape(m.root.outputs[0])
            dims = b.const(np.array(shape, dtype=np.int64), f"{m.root.name or 'expand'}_shape")
            return [b.op("Expand", [m.x, dims], like=m.root)]
        return [m.x]


class ConstantOperandRule(Rule):
    """0 - y ==> Neg(y); 1 / y ==> Reciprocal(y)"""

    name = "zero_minus_one_div"
    roots = ("Sub", "Div")

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        found = _binary_const(node)
        if found is None:
            return None
        y, c, pos = found
        value = 0 if node.op_type == "Sub" else 1
        if pos != 0 or c.size == 0 or not np.all(c == value):
            return None
        m = NeutralMatch(node)
        m.nodes.append(node)
        m.x, m.c = y, c
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        assert isinstance(m, NeutralMatch)
        dtype = m.x.dtype
        if dtype is None:
            return "input dtype unknown"
        if m.root.op_type == "Div" and not dtype.is_floating_point():
            return "Reciprocal needs a float input"
        if m.root.op_type == "Sub" and not (dtype.is_floating_point() or dtype.is_signed()):
            return "Neg needs a signed input"
        grows = _operand_grows(m.x, m.c)
        if grows is None:
            return "y's shape is unknown where the constant broadcasts"
        return "the constant broadcasts y to a larger shape" if grows else None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        assert isinstance(m, NeutralMatch)
        op = "Neg" if m.root.op_type == "Sub" else "Reciprocal"
        return [b.op(op, [m.x], like=m.root)]


class MulByZeroRule(Rule):
    """x * 0 ==> zeros of the output's shape (wrong when x holds inf or NaN)"""

    name = "mul_by_zero"
    roots = ("Mul",)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        found = _binary_const(node)
        if found is None or found[1].size == 0 or np.any(found[1] != 0):
            return None
        m = NeutralMatch(node)
        m.nodes.append(node)
        m.x, m.c = found[0], found[1]
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        assert isinstance(m, NeutralMatch)
        return _neutral_check(m)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        assert isinstance(m, NeutralMatch)
        zero = ir.tensor(np.zeros(1, dtype=m.c.dtype))
        shape = static_shape(m.root.outputs[0])
        if shape is not None:
            dims = b.const(np.array(shape, dtype=np.int64), f"{m.root.name or 'zeros'}_shape")
        else:
            dims = b.op("Shape", [m.x])
        return [b.op("ConstantOfShape", [dims], {"value": zero}, like=m.root)]


register(
    PassInfo(
        "ConstantPushDownFusionPass",
        "Grappler's constant push-down: Add/Sub and Mul/Div chains with constants combine "
        "their constants; Sum and Concat merge their constant inputs",
        rules=(AddSubChainRule(), MulDivChainRule(), SumConstantsRule(), ConcatConstantsRule()),
        note="Float chains are reassociated (rounding differs within the verifier's "
        "tolerance); integer division is never reassociated.",
    )
)
register(
    PassInfo(
        "NeutralElementFusionPass",
        "Remove x+0, x-0, x*1, x/1 (Expand when the constant broadcasts x); 0-y becomes "
        "Neg(y), 1/y becomes Reciprocal(y)",
        rules=(NeutralElementRule(), ConstantOperandRule()),
    )
)
register(
    PassInfo(
        "MulByZeroFusionPass",
        "Replace x*0 by zeros of the output's shape",
        default=False,
        rules=(MulByZeroRule(),),
        note="Off by default: inf*0 and NaN*0 are NaN, not 0, so the rewrite changes results "
        "for inputs holding inf or NaN.",
    )
)
