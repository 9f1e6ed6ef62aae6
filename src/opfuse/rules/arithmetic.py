"""Grappler's arithmetic optimizer: constants pushed together, neutral elements removed.

    Add(Add(x, c2), c1)  ==> Add(x, c1 + c2)       and every Add/Sub mix
    Mul(Mul(x, c2), c1)  ==> Mul(x, c1 * c2)       and every Mul/Div mix (float only)
    Sum(c1, x, c2, y)    ==> Sum(c1 + c2, x, y)
    Concat(a, c1, c2, b) ==> Concat(a, [c1 c2], b)
    x + 0, x - 0, x * 1, x / 1 ==> x (Expand when the constant broadcasts x; Identity(x)
                               when x is a graph input and the result a graph output)
    0 - y ==> Neg(y)     1 / y ==> Reciprocal(y)
    x * 0 ==> 0          (MulByZeroFusionPass, off: wrong for inf and NaN)

Float reassociation rounds differently from the original order (within the verifier's
tolerance, as Grappler's constant push-down does); integer Add/Sub/Mul chains are exact
(two's complement wraps the same way in any order). Integer division never reassociates.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.builder import forward
from opfuse.rewrite.evaluate import EvaluationError, evaluate_op
from opfuse.rewrite.pattern import Const, Op, Or, Var, const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import DEFAULT_DOMAINS, FOLD_GROWTH_ALLOWANCE, attr, static_shape

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


def _growth_reason(arrays: list[np.ndarray]) -> str | None:
    """Why combining the constants would grow the model (a broadcast result larger than
    its parts by more than folding's allowance), or None."""
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        return "the constants do not broadcast together"
    size = int(np.prod(shape, dtype=np.int64)) * arrays[0].itemsize
    if size - sum(a.nbytes for a in arrays) > FOLD_GROWTH_ALLOWANCE:
        return "the combined constant would be larger than its parts"
    return None


class ConstantPairMatch(Match):
    """Two nested ops with a constant operand each (the chain rules' match)."""

    inner: ir.Node
    outer: Term
    first: Term
    total: np.ndarray  # the combined constant, computed in the check
    sign: int


class _ChainRule(Rule[ConstantPairMatch]):
    ops: tuple[str, str]  # the operation and its inverse: (Add, Sub) or (Mul, Div)

    # imperative: "exactly one operand constant, on either side of a non-commuting op"
    # reads the node's operands as a signed term, which no declaration says shorter
    def match(self, node: ir.Node, ctx: PassContext) -> ConstantPairMatch | None:
        outer = _term(node)
        if outer is None:
            return None
        inner = outer[0].producer()
        if inner is None or inner.op_type not in self.ops or inner.domain not in DEFAULT_DOMAINS:
            return None
        first = _term(inner)
        if first is None:
            return None
        m = ConstantPairMatch(node)
        m.nodes += [node, inner]
        m.inner, m.outer, m.first = inner, outer, first
        m.consts["c_outer"], m.consts["c_inner"] = outer[2], first[2]
        return m

    def check(self, m: ConstantPairMatch, ctx: PassContext) -> str | None:
        dtype = m.root.outputs[0].dtype
        if dtype is None:
            return "output dtype unknown"
        if any(c.dtype != dtype.numpy() for c in (m.outer[2], m.first[2])):
            return "constants differ from the output dtype"
        reason = self.check_constants(m, dtype) or _growth_reason([m.first[2], m.outer[2]])
        if reason:
            return reason
        try:
            with np.errstate(all="ignore"):
                m.total, m.sign = self.combine(m, ctx)
        except EvaluationError as exc:
            return f"cannot combine the constants: {exc}"
        return self.check_total(m, dtype)

    def check_constants(self, m: ConstantPairMatch, dtype: ir.DataType) -> str | None:
        return None

    def check_total(self, m: ConstantPairMatch, dtype: ir.DataType) -> str | None:
        return None

    def combine(self, m: ConstantPairMatch, ctx: PassContext) -> tuple[np.ndarray, int]:
        """The combined constant (by the ONNX evaluator) and its sign in the result.

        The sign of k in the result: k and c cannot both be inverted while x is, since
        the outer constant is inverted only in Sub(t, c) / Div(t, c), where t keeps its sign.
        """
        same, inverse = self.ops
        _, so, c, sc = m.outer
        _, _, k, sk = m.first
        if so * sk > 0:
            return evaluate_op(same if sc > 0 else inverse, (k, c), ctx.opset), 1
        if sc > 0:
            return evaluate_op(inverse, (c, k), ctx.opset), 1
        return evaluate_op(same, (k, c), ctx.opset), -1


class AddSubChainRule(_ChainRule):
    """(x ± k) ± c, c - (x ± k), ... ==> x ± K or K - x"""

    name = "add_sub_chain"
    roots = ("Add", "Sub")
    ops = ("Add", "Sub")

    def rewrite(self, m: ConstantPairMatch, b: Builder, ctx: PassContext):
        x, s = m.first[0], m.outer[1] * m.first[1]  # x's sign in the result
        k = b.const(m.total, f"{m.root.name or 'add'}_const")
        if s > 0:
            return [b.op("Add" if m.sign > 0 else "Sub", [x, k], like=m.root)]
        return [b.op("Sub", [k, x], like=m.root)]


class MulDivChainRule(_ChainRule):
    """(x * k) * c, (x / k) * c, c / (x * k), ... ==> x * K, x / K or K / x"""

    name = "mul_div_chain"
    roots = ("Mul", "Div")
    ops = ("Mul", "Div")

    def check_constants(self, m: ConstantPairMatch, dtype: ir.DataType) -> str | None:
        divides = "Div" in (m.root.op_type, m.inner.op_type)
        if not dtype.is_floating_point():
            return "integer division does not reassociate" if divides else None
        k, c = m.first[2], m.outer[2]
        if not (np.all(np.isfinite(k)) and np.all(np.isfinite(c))):
            return "a constant is not finite"
        if divides and (np.any(k == 0) or np.any(c == 0)):
            return "a divisor constant has zeros"
        return None

    def check_total(self, m: ConstantPairMatch, dtype: ir.DataType) -> str | None:
        if dtype.is_floating_point() and not np.all(np.isfinite(m.total)):
            return "the combined constant overflows"
        return None

    def rewrite(self, m: ConstantPairMatch, b: Builder, ctx: PassContext):
        x, s = m.first[0], m.outer[1] * m.first[1]
        k = b.const(m.total, f"{m.root.name or 'mul'}_const")
        if s > 0:
            return [b.op("Mul" if m.sign > 0 else "Div", [x, k], like=m.root)]
        return [b.op("Div", [k, x], like=m.root)]


def _constants_to_sum(node: ir.Node) -> bool:
    """Two constant inputs or more, and not all of them (that is folding's job)."""
    arrays = [const_array(v) for v in node.inputs]
    return sum(a is not None for a in arrays) >= 2 and not all(a is not None for a in arrays)


class SumMatch(Match):
    total: np.ndarray  # the constants' sum, computed in the check


class SumConstantsRule(Rule[SumMatch]):
    """Sum(c1, x, c2, y) ==> Sum(c1 + c2, x, y)"""

    name = "sum_constants"
    pattern = Op("Sum", variadic=True, where=_constants_to_sum)
    match_type = SumMatch

    def check(self, m: SumMatch, ctx: PassContext) -> str | None:
        dtype = m.root.outputs[0].dtype
        arrays = [a for a in map(const_array, m.root.inputs) if a is not None]
        if dtype is None or any(a.dtype != dtype.numpy() for a in arrays):
            return "constants differ from the output dtype"
        reason = _growth_reason(arrays)
        if reason:
            return reason
        try:
            m.total = evaluate_op("Sum", arrays, ctx.opset)
        except EvaluationError as exc:
            return f"cannot combine the constants: {exc}"
        return None

    def rewrite(self, m: SumMatch, b: Builder, ctx: PassContext):
        k = b.const(m.total, f"{m.root.name or 'sum'}_const")
        rest = [v for v in m.root.inputs if const_array(v) is None]
        return [b.op("Sum", [k, *rest], like=m.root)]


class ConcatMatch(Match):
    pieces: list[ir.Value | np.ndarray]  # kept inputs and merged runs of constants


def _adjacent_constants(node: ir.Node) -> bool:
    """Two constant inputs side by side, and not all constant (folding's job)."""
    arrays = [const_array(v) for v in node.inputs]
    if all(a is not None for a in arrays):
        return False
    return any(a is not None and b is not None for a, b in zip(arrays, arrays[1:], strict=False))


class ConcatConstantsRule(Rule[ConcatMatch]):
    """Concat(a, c1, c2, b) ==> Concat(a, concat(c1, c2), b)"""

    name = "concat_constants"
    pattern = Op("Concat", variadic=True, where=_adjacent_constants)
    match_type = ConcatMatch

    def check(self, m: ConcatMatch, ctx: PassContext) -> str | None:
        axis = attr(m.root, "axis", 0)
        m.pieces = []
        run: list[tuple[ir.Value, np.ndarray]] = []
        try:
            for v in [*m.root.inputs, None]:  # None: the end, flushes the last run
                a = const_array(v)
                if a is not None:
                    assert v is not None
                    run.append((v, a))
                    continue
                if len(run) == 1:
                    m.pieces.append(run[0][0])
                elif run:
                    arrays = [r[1] for r in run]
                    m.pieces.append(evaluate_op("Concat", arrays, ctx.opset, axis=axis))
                run = []
                if v is not None:
                    m.pieces.append(v)
        except EvaluationError as exc:
            return f"cannot combine the constants: {exc}"
        return None

    def rewrite(self, m: ConcatMatch, b: Builder, ctx: PassContext):
        name = f"{m.root.name or 'concat'}_const"
        inputs = [b.const(p, name) if isinstance(p, np.ndarray) else p for p in m.pieces]
        return [b.op("Concat", inputs, {"axis": attr(m.root, "axis", 0)}, like=m.root)]


X = Var("x", constant=False)  # the operand that is not a constant


def _neutral_check(m: Match) -> str | None:
    grows = _operand_grows(m.value("x"), m["c"])
    if grows is None:
        return "x's shape is unknown where the constant broadcasts"
    if grows and static_shape(m.root.outputs[0]) is None:
        return "the constant broadcasts x to a shape that is not static"
    return None


class NeutralElementRule(Rule):
    """x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 ==> x (Expand(x) when c broadcasts x)"""

    name = "neutral_element"
    pattern = Or(
        Op("Add", X, Const("c", value=0)),  # either order
        Op("Sub", X, Const("c", value=0)),
        Op("Mul", X, Const("c", value=1)),  # either order
        Op("Div", X, Const("c", value=1)),
    )

    def check(self, m: Match, ctx: PassContext) -> str | None:
        return _neutral_check(m)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        x = m.value("x")
        if _operand_grows(x, m["c"]):
            shape = static_shape(m.root.outputs[0])
            dims = b.const(np.array(shape, dtype=np.int64), f"{m.root.name or 'expand'}_shape")
            return [b.op("Expand", [x, dims], like=m.root)]
        return [forward(m, b, x)]


class ConstantOperandRule(Rule):
    """0 - y ==> Neg(y); 1 / y ==> Reciprocal(y)"""

    name = "zero_minus_one_div"
    pattern = Or(Op("Sub", Const("c", value=0), X), Op("Div", Const("c", value=1), X))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.value("x").dtype
        if dtype is None:
            return "input dtype unknown"
        if m.root.op_type == "Div" and not dtype.is_floating_point():
            return "Reciprocal needs a float input"
        if m.root.op_type == "Sub" and not (dtype.is_floating_point() or dtype.is_signed()):
            return "Neg needs a signed input"
        grows = _operand_grows(m.value("x"), m["c"])
        if grows is None:
            return "y's shape is unknown where the constant broadcasts"
        return "the constant broadcasts y to a larger shape" if grows else None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        op = "Neg" if m.root.op_type == "Sub" else "Reciprocal"
        return [b.op(op, [m.value("x")], like=m.root)]


class MulByZeroRule(Rule):
    """x * 0 ==> zeros of the output's shape (wrong when x holds inf or NaN)"""

    name = "mul_by_zero"
    pattern = Op("Mul", X, Const("c", value=0))  # either order

    def check(self, m: Match, ctx: PassContext) -> str | None:
        return _neutral_check(m)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        zero = ir.tensor(np.zeros(1, dtype=m["c"].dtype))
        shape = static_shape(m.root.outputs[0])
        if shape is not None:
            dims = b.const(np.array(shape, dtype=np.int64), f"{m.root.name or 'zeros'}_shape")
        else:
            dims = b.op("Shape", [m.value("x")])
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
