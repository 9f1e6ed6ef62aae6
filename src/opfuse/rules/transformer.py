"""Transformer blocks written out in small ops, folded into the standard ops that newer
opsets have: LayerNormalization (17), Gelu (20), RMSNormalization (23).

    d = x - ReduceMean(x);  y = d / Sqrt(ReduceMean(d^2) + eps)     ==> LayerNormalization(x, 1)
    y = x / Sqrt(ReduceMean(x^2) + eps)                             ==> RMSNormalization(x, 1)
    then Norm(x, 1) * gamma ==> Norm(x, gamma);  LayerNorm(x, s) + beta ==> LayerNorm(x, s, beta)
    0.5 * x * (1 + Erf(x / sqrt(2)))                                ==> Gelu(x)
    0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))         ==> Gelu(x, approximate="tanh")

``d^2`` is Pow(d, 2) or Mul(d, d); ``1 / Sqrt(v)`` may also be written Reciprocal(Sqrt(v)),
Div(1, Sqrt(v)) or Pow(v, -0.5), then multiplied. The reductions must keep their dims and
reduce the same trailing axes. Each pass runs only where the model's opset has its op:
opfuse never raises the opset unless ``--target-opset`` asks.

The fused ops compute the same formulas, but the runtime rounds in its own order (and
may compute the variance as E[x^2] - E[x]^2): results differ in the last ulps, more when
a row's mean is far larger than its spread (mean 1000, std 1: both forms are ~1e-4 off a
float64 reference in float32, the fused one measured closer, and they differ by that).
stash_type sets the type the statistics are computed in: float32 (the default) for a
float32 chain, double (stash_type 11) for a float64 RMSNorm chain, which computed them in
double. LayerNormalization's stash_type can only be float32 or bfloat16 (onnx builds no
function body for double, and its Mean/InvStdDev type excludes it), so a float64 LayerNorm
chain is left alone: fused, a runtime following the spec would compute it in float32.
Only float32 (and for RMSNorm float64) inputs are fused: a float16 chain would become
more precise, not the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, Op, Optional, PassContext, Rule, Var
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr, producer, rank, reduce_axes, scalar_value

FUSED_DTYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)
SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CONST_RTOL = 1e-5  # a float32 constant carries ~1e-7 relative error


def const_scalar(value: ir.Value | None) -> float | None:
    """The single value of a constant whose elements are all equal, else None."""
    array = const_array(value)
    return None if array is None else scalar_value(array)


def close(value: ir.Value | None, target: float) -> bool:
    c = const_scalar(value)
    return c is not None and abs(c - target) <= CONST_RTOL * abs(target)


def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other operand of a two-input node that reads ``value``."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is value else a if b is value else None


def squared(value: ir.Value | None, base: ir.Value) -> ir.Node | None:
    """The node computing base^2 as Pow(base, 2) or Mul(base, base) that makes ``value``."""
    node = producer(value, "Pow")
    if node is not None and node.inputs[0] is base and const_scalar(node.inputs[1]) == 2.0:
        return node
    node = producer(value, "Mul")
    if node is not None and node.inputs[0] is base and node.inputs[1] is base:
        return node
    return None


def inverse_root(root: ir.Node) -> tuple[ir.Value, ir.Node, list[ir.Node]] | None:
    """Split ``num / Sqrt(v)`` (or ``num * 1/Sqrt(v)`` in its spellings) into
    (num, the Add making v, the nodes of the root path)."""
    if root.op_type == "Div":
        sqrt = producer(root.inputs[1], "Sqrt")
        if sqrt is None:
            return None
        add = producer(sqrt.inputs[0], "Add")
        return (root.inputs[0], add, [sqrt]) if add is not None and root.inputs[0] else None
    for i in (0, 1):
        num, inv = root.inputs[i], root.inputs[1 - i]
        if num is None:
            continue
        pw = producer(inv, "Pow")
        add = producer(pw.inputs[0], "Add") if pw is not None else None
        if pw is not None and add is not None and close(pw.inputs[1], -0.5):
            return num, add, [pw]
        rec = producer(inv, "Reciprocal")
        div = producer(inv, "Div")
        path: list[ir.Node] = []
        if rec is not None:
            sqrt, path = producer(rec.inputs[0], "Sqrt"), [rec]
        elif div is not None and close(div.inputs[0], 1.0):
            sqrt, path = producer(div.inputs[1], "Sqrt"), [div]
        else:
            continue
        if sqrt is not None and (add := producer(sqrt.inputs[0], "Add")) is not None:
            return num, add, [*path, sqrt]
    return None


def bind_constants(m: Match) -> None:
    """Bind every float constant input of the matched nodes (so the engine checks their
    dtype); integer ones are reduction axes."""
    for node in m.nodes:
        for i, value in enumerate(node.inputs):
            if value is not None and (value.producer() not in m.nodes):
                array = const_array(value)
                if array is not None and np.issubdtype(array.dtype, np.floating):
                    m.values.setdefault(f"{node.op_type}{id(node)}_{i}", value)
                    m.consts.setdefault(f"{node.op_type}{id(node)}_{i}", array)


def broadcast_reason(m: Match, x: ir.Value) -> str | None:
    """Why a constant of the match could broadcast the output beyond x's shape."""
    x_rank = None if x.shape is None else len(x.shape)
    for array in m.consts.values():
        if array.size != 1:
            return "a constant is not a scalar"
        if array.ndim > 0 and (x_rank is None or array.ndim > x_rank):
            return "a constant's rank may broadcast the output"
    return None


def suffix_axis(axes: Sequence[int], x_rank: int | None) -> int | None:
    """The first axis when ``axes`` are the trailing dims (negative as given when the
    rank is unknown), else None."""
    if not axes:
        return None
    if x_rank is not None:
        norm = sorted(a % x_rank for a in axes)
        return norm[0] - x_rank if norm == list(range(x_rank - len(axes), x_rank)) else None
    neg = sorted(axes)
    return neg[0] if neg == list(range(-len(axes), 0)) else None


class NormRule(Rule):
    """The normalization core: y = num / Sqrt(ReduceMean(num^2) + eps), with num = x
    (RMSNorm) or x - ReduceMean(x) (LayerNorm), into the op with scale 1."""

    roots = ("Div", "Mul")
    constants = ("eps",)
    op_type: str
    centered: bool
    stash_double: bool  # whether the op's stash_type may be double

    # imperative: num / Sqrt(v) has five spellings (inverse_root), the square two, and
    # the constants bound for the dtype check are every float input the nodes read
    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        found = inverse_root(node)
        if found is None:
            return None
        num, add, path = found
        for i in (0, 1):
            var = producer(add.inputs[i], "ReduceMean")
            if var is not None:
                break
        else:
            return None
        sq = squared(var.inputs[0], num)
        if sq is None:
            return None
        m = Match(node)
        m.nodes += [node, *path, add, var, sq]
        m.node_names.update(add=add, var=var)
        eps = add.inputs[1 - i]
        if eps is None:
            return None
        m.values["eps"] = eps
        if self.centered:
            sub = producer(num, "Sub")
            mean = producer(sub.inputs[1], "ReduceMean") if sub is not None else None
            if sub is None or mean is None or mean.inputs[0] is not sub.inputs[0]:
                return None
            centered = sub.inputs[0]
            if centered is None:
                return None
            m.nodes += [sub, mean]
            m.node_names.update(mean=mean)
            m.values["x"] = centered
        else:
            m.values["x"] = num
        bind_constants(m)
        return m

    def axis(self, m: Match) -> tuple[int | None, str | None]:
        x = m.value("x")
        x_rank = None if x.shape is None else len(x.shape)
        reductions = [m.node("var")] + ([m.node("mean")] if self.centered else [])
        axes = [reduce_axes(n) for n in reductions]
        if any(a is None for a in axes):
            return None, "ReduceMean axes are not constant"
        if any(not attr(n, "keepdims", 1) for n in reductions):
            return None, "ReduceMean drops the reduced axes (keepdims=0)"
        first = [suffix_axis(a, x_rank) for a in axes if a is not None]
        if any(f is None for f in first):
            return None, "ReduceMean does not reduce the trailing axes"
        if len(set(first)) != 1:
            return None, "the two ReduceMeans reduce different axes"
        return first[0], None

    def check(self, m: Match, ctx: PassContext) -> str | None:
        x = m.value("x")
        if x.dtype not in FUSED_DTYPES:
            return f"input is {x.dtype}, not float32/float64"
        if x.dtype == ir.DataType.DOUBLE and not self.stash_double:
            return (
                f"input is DOUBLE: {self.op_type} would compute its statistics in float32 "
                "(its stash_type cannot be double)"
            )
        if m["eps"].size != 1:
            return "epsilon is not a scalar"
        reason = broadcast_reason(m, x)
        if reason:
            return reason
        axis, reason = self.axis(m)
        if reason or axis is None:
            return reason
        if x.shape is None or not all(isinstance(d, int) for d in list(x.shape)[axis:]):
            return "normalized dims are not static"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        x = m.value("x")
        axis, _ = self.axis(m)
        assert axis is not None and x.shape is not None and x.dtype is not None
        norm_shape = tuple(d for d in list(x.shape)[axis:] if isinstance(d, int))  # all are
        eps = float(m["eps"].reshape(-1)[0])
        ones = b.const(np.ones(norm_shape, x.dtype.numpy()), f"{m.root.name or self.name}.scale")
        attrs: dict[str, object] = {"axis": axis, "epsilon": eps}
        if x.dtype != ir.DataType.FLOAT:
            # the chain computed its statistics in double: stash_type defaults to float32
            attrs["stash_type"] = int(x.dtype)
        return [b.op(self.op_type, [x, ones], attrs, like=m.root)]


class LayerNormRule(NormRule):
    name = "layer_norm"
    op_type = "LayerNormalization"
    centered = True
    stash_double = False


class RMSNormRule(NormRule):
    name = "rms_norm"
    op_type = "RMSNormalization"
    centered = False
    stash_double = True


def broadcast_param(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``array`` as a tensor of ``shape`` (the normalized dims) when, multiplied into or
    added to the normalized output, it only varies along those dims; else None. (Its
    rank against the norm's input is checked apart.)"""
    k = len(shape)
    lead = array.shape[: max(0, array.ndim - k)]
    if any(d != 1 for d in lead):
        return None
    tail = array.reshape(array.shape[len(lead) :])
    try:
        return np.broadcast_to(tail, shape).copy()
    except ValueError:
        return None


class NormAffineRule(Rule):
    """Norm(x, 1 [, 0]) * gamma ==> Norm(x, gamma [, 0]);  LayerNorm(x, s [, 0]) + beta
    ==> LayerNorm(x, s, beta), when gamma/beta vary only along the normalized dims."""

    constants = ("scale", "bias", "p")

    def __init__(self, name: str, op_type: str, root: str) -> None:
        self.name = name
        self.op_type = op_type
        self.pattern = Op(
            root,
            Op(op_type, Var("x"), Var("scale"), Optional(Var("bias")), name="norm"),
            Var("p"),
        )

    def check(self, m: Match, ctx: PassContext) -> str | None:
        # the engine refuses a norm whose statistics outputs are used (another consumer)
        if "bias" in m and np.any(m["bias"]):
            return f"{self.op_type} already has a bias"
        if m.root.op_type == "Mul" and not np.all(m["scale"] == 1):
            return f"{self.op_type} scale is not all ones"
        # the norm's output has x's shape: a constant of higher rank broadcasts the
        # Mul/Add output up, which the fused norm would not
        p, x_rank = m["p"], rank(m.value("x"))
        if p.ndim > m["scale"].ndim and (x_rank is None or p.ndim > x_rank):
            return (
                f"the {m.root.op_type} constant has a higher rank than the {self.op_type} "
                "input (it broadcasts the output up)"
            )
        if broadcast_param(p, m["scale"].shape) is None:
            return f"the {m.root.op_type} constant varies outside the normalized dims"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        norm = m.node("norm")
        p = broadcast_param(m["p"], m["scale"].shape)
        assert p is not None
        base = norm.name or self.op_type
        if m.root.op_type == "Mul":
            inputs = [m.value("x"), b.const(p, f"{base}.scale")]
            if "bias" in m:
                inputs.append(m.value("bias"))
        else:
            inputs = [m.value("x"), m.value("scale"), b.const(p, f"{base}.bias")]
        attrs = {k: a for k, a in norm.attributes.items()}
        return [b.op(self.op_type, inputs, attrs, like=norm)]


def product_leaves(root: ir.Node) -> list[tuple[list[ir.Value], ir.Node]]:
    """The ways to read a Mul as a product of three factors, one of its inputs being a
    Mul itself: [(factors, inner Mul)]."""
    ways = []
    for i in (0, 1):
        inner = producer(root.inputs[i], "Mul")
        other = root.inputs[1 - i]
        if inner is not None and other is not None:
            factors = [other, *(v for v in inner.inputs if v is not None)]
            if len(factors) == 3:
                ways.append((factors, inner))
    return ways


def cubed(value: ir.Value | None, x: ir.Value) -> list[ir.Node] | None:
    """The nodes computing x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x)."""
    pw = producer(value, "Pow")
    if pw is not None and pw.inputs[0] is x and const_scalar(pw.inputs[1]) == 3.0:
        return [pw]
    mul = producer(value, "Mul")
    if mul is None:
        return None
    other = other_input(mul, x)
    square = squared(other, x) if other is not None else None
    return [mul, square] if square is not None else None


def gelu_inner(act: ir.Node, x: ir.Value) -> tuple[str, list[ir.Node]] | None:
    """The nodes between x and the Erf/Tanh of a Gelu, and its approximation."""
    if act.op_type == "Erf":
        z = act.inputs[0]
        div = producer(z, "Div")
        if div is not None and div.inputs[0] is x and close(div.inputs[1], SQRT2):
            return "none", [div]
        mul = producer(z, "Mul")
        if mul is not None and close(other_input(mul, x), 1 / SQRT2):
            return "none", [mul]
        return None
    scale = producer(act.inputs[0], "Mul")
    if scale is None:
        return None
    for i in (0, 1):
        if not close(scale.inputs[i], SQRT_2_OVER_PI):
            continue
        add = producer(scale.inputs[1 - i], "Add")
        if add is None:
            continue
        term = producer(other_input(add, x), "Mul")
        if term is None:
            continue
        for j in (0, 1):
            if close(term.inputs[j], 0.044715):
                cube = cubed(term.inputs[1 - j], x)
                if cube is not None:
                    return "tanh", [scale, add, term, *cube]
    return None


class GeluRule(Rule):
    """0.5 * x * (1 + Erf(x / sqrt 2)) and the tanh form ==> Gelu(x)"""

    name = "gelu"
    roots = ("Mul",)

    # imperative: 0.5 * x * (...) is a three-factor product in any grouping and order,
    # with two inner forms (erf, tanh) and three spellings of x^3; as Or alternatives
    # that is dozens of near-copies
    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        for factors, inner in product_leaves(node):
            half = next((f for f in factors if close(f, 0.5)), None)
            if half is None:
                continue
            rest = list(factors)
            rest.remove(half)
            for k in (0, 1):
                x, act_sum = rest[k], rest[1 - k]
                add = producer(act_sum, "Add")
                if add is None:
                    continue
                act = next(
                    (
                        a
                        for v in add.inputs
                        for op in ("Erf", "Tanh")
                        if (a := producer(v, op)) is not None
                    ),
                    None,
                )
                if act is None or not close(other_input(add, act.outputs[0]), 1.0):
                    continue
                found = gelu_inner(act, x)
                if found is None:
                    continue
                m = Match(node)
                m.nodes += [node, inner, add, act, *found[1]]
                m.values["x"] = x
                m.node_names["act"] = act
                bind_constants(m)
                return m
        return None

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.value("x").dtype
        if dtype is None or not dtype.is_floating_point():
            return "input is not a float tensor"
        return broadcast_reason(m, m.value("x"))

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        approximate = "tanh" if m.node("act").op_type == "Tanh" else "none"
        return [b.op("Gelu", [m.value("x")], {"approximate": approximate}, like=m.root)]


register(
    PassInfo(
        "LayerNormFusionPass",
        "Fold ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div (and the Mul/Add after it) into "
        "LayerNormalization",
        opset_min=17,
        rules=(
            LayerNormRule(),
            NormAffineRule("layer_norm_scale", "LayerNormalization", "Mul"),
            NormAffineRule("layer_norm_bias", "LayerNormalization", "Add"),
        ),
    )
)
register(
    PassInfo(
        "GeluFusionPass",
        "Fold the erf and tanh forms of GELU into Gelu",
        opset_min=20,
        rules=(GeluRule(),),
    )
)
register(
    PassInfo(
        "RMSNormFusionPass",
        "Fold x / Sqrt(ReduceMean(x^2) + eps) (and the Mul after it) into RMSNormalization",
        opset_min=23,
        rules=(RMSNormRule(), NormAffineRule("rms_norm_scale", "RMSNormalization", "Mul")),
    )
)
