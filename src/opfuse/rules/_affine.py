"""Per-channel affine maps ``y = s * x + t`` and the linear layers they fold into.

A linear layer here is Conv, ConvTranspose, Gemm, or MatMul with a constant weight
(optionally followed by a bias Add, and optionally by one Transpose that moves the
channel axis, as NHWC exports put after every Conv). Its output channels are one axis
of the value the affine map reads; folding scales the weight along that axis and turns
the bias into ``bias * s + t``, in float64 cast back once, or (``native_arithmetic``) in
the weight's dtype as onnxruntime's own Conv+Mul/Add fusions compute it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import FLOATING, const_array
from opfuse.rules._util import DEFAULT_DOMAINS, attr, producer, rank

LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def scale_out_channels(w: np.ndarray, s: np.ndarray, transposed: bool, group: int) -> np.ndarray:
    """Multiply a Conv (or ConvTranspose) weight by s along its output channels."""
    if not transposed:
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))
    c_in, m_per_group = w.shape[0], w.shape[1]
    grouped = w.reshape((group, c_in // group, m_per_group) + w.shape[2:])
    factors = s.reshape((group, 1, m_per_group) + (1,) * (w.ndim - 2))
    return (grouped * factors).reshape(w.shape)


def out_channels(w: np.ndarray, transposed: bool, group: int) -> int:
    return int(w.shape[1] * group) if transposed else int(w.shape[0])


@dataclass
class Linear:
    """A linear layer whose output (through an optional Transpose) is ``value``."""

    node: ir.Node
    weight: np.ndarray
    bias: np.ndarray | None  # Conv bias, Gemm's C (times beta), or the bias Add's constant
    bias_add: ir.Node | None  # MatMul followed by Add(constant)
    transpose: ir.Node | None
    axis: int  # the output-channel axis in ``value``
    channels: int
    rank: int
    nodes: list[ir.Node] = field(default_factory=list)  # every node the fold replaces

    def bind(self, m: Match) -> None:
        """Record the layer's nodes and constants on a match (for the engine's checks)."""
        m.nodes += [n for n in self.nodes if n not in m.nodes]
        m.node_names["linear"] = self.node
        m.consts["weight"] = self.weight
        if self.bias is not None:
            m.consts["linear_bias"] = self.bias


def find_linear(value: ir.Value, kinds: tuple[str, ...] = LINEAR_OPS) -> Linear | str | None:
    """The linear layer that makes ``value``, why it cannot take a fold, or None when
    no linear layer makes it."""
    nodes: list[ir.Node] = []
    transpose = producer(value, "Transpose")
    if transpose is not None:
        nodes.append(transpose)
        if (source := transpose.inputs[0]) is None:
            return None
        value = source
    bias_add = producer(value, "Add")
    bias = None
    if bias_add is not None:
        a, b = bias_add.inputs
        if producer(b, "MatMul") is not None:
            a, b = b, a
        if a is None or producer(a, "MatMul") is None:
            return None
        if (bias := const_array(b)) is None:
            return "the MatMul's bias is not a constant"
        nodes.append(bias_add)
        value = a
    node = producer(value, *kinds)
    if node is None:
        return None
    nodes.append(node)
    if node.outputs[0] is not value:
        return "input is not made by a linear layer"
    weight = const_array(node.inputs[1])
    if weight is None:
        return f"{node.op_type} weight is not a constant"
    if not np.issubdtype(weight.dtype, np.floating):
        return f"{node.op_type} weight is not floating point"
    op = node.op_type
    if op in ("Conv", "ConvTranspose"):
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = const_array(node.inputs[2])
            if bias is None:
                return f"{op} bias is not a constant"
        group = int(attr(node, "group", 1))
        axis, channels, out_rank = (
            1,
            out_channels(weight, op == "ConvTranspose", group),
            weight.ndim,
        )
    elif op == "Gemm":
        if weight.ndim != 2:
            return "Gemm weight is not 2-D"
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            c = const_array(node.inputs[2])
            if c is None:
                return "Gemm C is not a constant"
            bias = c.astype(np.float64) * float(attr(node, "beta", 1.0))
        channels = weight.shape[0] if attr(node, "transB", 0) else weight.shape[1]
        axis, out_rank = 1, 2
    else:  # MatMul
        if weight.ndim < 2:
            return "MatMul weight is a vector (no output-channel axis)"
        out_rank = rank(node.outputs[0]) or 0
        x_rank = rank(node.inputs[0])
        if not out_rank and x_rank is not None:
            out_rank = max(x_rank, weight.ndim)
        if not out_rank:
            return "MatMul output rank is unknown"
        axis, channels = out_rank - 1, int(weight.shape[-1])
        if bias is not None and bias.ndim > out_rank:
            return "the MatMul's bias has a higher rank than its output"
    if transpose is not None:
        perm = [int(p) for p in attr(transpose, "perm", [])]
        if sorted(perm) != list(range(out_rank)):
            return "Transpose has no explicit permutation of the layer's rank"
        axis = perm.index(axis)
    return Linear(node, weight, bias, bias_add, transpose, axis, int(channels), out_rank, nodes)


def channel_axis(shapes: list[tuple[int, ...]]) -> tuple[int, int] | str:
    """For constants that broadcast per channel: (negative axis, length), (0, 1) when all
    are scalars, else why they are not per-channel."""
    found: tuple[int, int] | None = None
    for shape in shapes:
        for i, d in enumerate(shape):
            if d == 1:
                continue
            here = (i - len(shape), int(d))
            if found is not None and found != here:
                return "constants do not broadcast along one channel axis"
            found = here
    return found or (0, 1)


def per_channel(shapes: list[tuple[int, ...]], x_rank: int, axis: int, channels: int) -> str | None:
    """Why constants of ``shapes`` do not broadcast per channel of axis ``axis`` of a
    rank-``x_rank`` value with ``channels`` channels (without growing it), or None."""
    if any(len(s) > x_rank for s in shapes):
        return "a constant has a higher rank than the value it applies to"
    found = channel_axis(shapes)
    if isinstance(found, str):
        return found
    neg, length = found
    if length == 1:
        return None
    if x_rank + neg != axis:
        return f"constants vary along axis {x_rank + neg}, the channels are on axis {axis}"
    if length != channels:
        return f"constants have {length} channels, the layer has {channels}"
    return None


def as_vector(array: np.ndarray, channels: int) -> np.ndarray:
    """A per-channel (or scalar) constant as a float64 vector of length ``channels``."""
    return np.broadcast_to(array.astype(np.float64).reshape(-1), (channels,)).copy()


def native_arithmetic(dtype: np.dtype, s: np.ndarray, t: np.ndarray) -> bool:
    """Whether to fold in the weight's own dtype, step by step, as onnxruntime's load-time
    Conv+Mul and Conv+Add fusions do: for float32/float64 weights when s and t are exact
    in that dtype (a model's own constants). Then ``W * s`` and ``b * s + t`` round as
    onnxruntime's do, so both give the same bits; otherwise float64, rounded once."""
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return False
    return all(np.array_equal(v.astype(dtype).astype(v.dtype), v) for v in (s, t))


def fold(lin: Linear, b: Builder, s: np.ndarray, t: np.ndarray) -> ir.Value:
    """Build ``s * lin(x) + t`` as one linear layer (and its Transpose); s, t per channel."""
    node, w = lin.node, lin.weight
    dtype = w.dtype
    name = node.name or node.op_type.lower()
    if native_arithmetic(dtype, s, t) and (lin.bias is None or lin.bias.dtype == dtype):
        s, t = s.astype(dtype), t.astype(dtype)
        w64 = w  # "64": the working precision, here the weight's own
    else:
        w64 = w.astype(np.float64)
    inputs: list[ir.Value | None]
    attrs = dict(node.attributes.items())
    if node.op_type in ("Conv", "ConvTranspose"):
        group = int(attr(node, "group", 1))
        new_w = scale_out_channels(w64, s, node.op_type == "ConvTranspose", group)
        bias = lin.bias.astype(w64.dtype) if lin.bias is not None else None
        new_b = bias * s + t if bias is not None else t
        inputs = [node.inputs[0], b.const(new_w.astype(dtype), f"{name}.weight_affine")]
        inputs.append(b.const(new_b.astype(dtype), f"{name}.bias_affine"))
        out = b.op(node.op_type, inputs, attrs, like=node)
    elif node.op_type == "Gemm":
        new_w = w64 * (s[:, None] if attr(node, "transB", 0) else s[None, :])
        new_c = (lin.bias * s if lin.bias is not None else 0.0) + t
        attrs.pop("beta", None)
        inputs = [node.inputs[0], b.const(new_w.astype(dtype), f"{name}.weight_affine")]
        inputs.append(b.const(np.asarray(new_c).astype(dtype), f"{name}.bias_affine"))
        out = b.op("Gemm", inputs, attrs, like=node)
    else:  # MatMul (+ bias Add)
        new_w = w64 * s
        inputs = [node.inputs[0], b.const(new_w.astype(dtype), f"{name}.weight_affine")]
        out = b.op("MatMul", inputs, attrs, like=node)
        if lin.bias is not None:
            new_b = lin.bias.astype(w64.dtype) * s + t
        else:
            new_b = t if np.any(t) else None
        if new_b is not None:
            like = lin.bias_add
            bias_value = b.const(np.asarray(new_b).astype(dtype), f"{name}.bias_affine")
            out = b.op("Add", [out, bias_value], like=like)
    if lin.transpose is not None:
        out = b.op("Transpose", [out], dict(lin.transpose.attributes.items()), like=lin.transpose)
    return out


AFFINE_OPS = ("Add", "Sub", "Mul", "Div")


@dataclass
class Step:
    """One elementwise op with a constant operand: ``kind`` is add, sub (x - c),
    rsub (c - x), mul or div (x / c)."""

    node: ir.Node
    x: ir.Value
    const: np.ndarray
    kind: str


def affine_step(node: ir.Node) -> Step | None:
    """The node as ``x op c`` with a finite constant ``c``, else None."""
    if node.op_type not in AFFINE_OPS or node.domain not in DEFAULT_DOMAINS:
        return None
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    dtype = node.outputs[0].dtype
    if dtype is not None and dtype not in FLOATING:
        return None
    a, b = node.inputs
    ca, cb = const_array(a), const_array(b)
    if (ca is None) == (cb is None):  # both constant is constant folding's job
        return None
    const = cb if cb is not None else ca
    assert const is not None
    # numpy's own floats (kind "f"; bfloat16 and the float8s are not numpy floating)
    if const.dtype.kind != "f" or not np.isfinite(const).all():
        return None
    x = a if cb is not None else b
    assert x is not None
    op = node.op_type
    if op == "Div":
        if cb is None or (const == 0).any():
            return None
        return Step(node, x, const, "div")
    if op == "Sub":
        return Step(node, x, const, "sub" if cb is not None else "rsub")
    return Step(node, x, const, op.lower())


def apply_step(step: Step, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, t) of ``step(s * x + t)`` as ``s' * x + t'``, in float64."""
    c = step.const.astype(np.float64)
    if step.kind == "add":
        return s, t + c
    if step.kind == "sub":
        return s, t - c
    if step.kind == "rsub":
        return -s, c - t
    if step.kind == "mul":
        return s * c, t * c
    return s / c, t / c


@dataclass
class Chain:
    """Consecutive affine steps, input side first; intermediate outputs feed only the
    next step. ``s * x + t`` (float64, in the constants' broadcast shape) is the map."""

    steps: list[Step]
    x: ir.Value
    s: np.ndarray
    t: np.ndarray
    shapes: list[tuple[int, ...]]

    @property
    def nodes(self) -> list[ir.Node]:
        return [step.node for step in self.steps]


def _single_use(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def continues_chain(node: ir.Node, shapes: list[tuple[int, ...]] | None = None) -> bool:
    """Whether the one consumer of ``node`` (an affine step with constants of
    ``shapes``) is an affine step that continues its chain."""
    if shapes is None:
        step = affine_step(node)
        if step is None:
            return False
        shapes = [tuple(step.const.shape)]
    consumer = _single_use(node.outputs[0])
    nxt = affine_step(consumer) if consumer is not None else None
    return nxt is not None and not isinstance(channel_axis([*shapes, nxt.const.shape]), str)


def chain_ending_at(node: ir.Node, max_len: int = 32) -> Chain | None:
    """The longest per-channel affine chain ending at ``node``, or None when ``node`` is
    not an affine step or its one consumer continues the chain (the chain is matched
    once, at its end)."""
    last = affine_step(node)
    if last is None:
        return None
    steps = [last]
    shapes = [tuple(last.const.shape)]
    if isinstance(channel_axis(shapes), str):
        return None
    while len(steps) < max_len:
        x = steps[0].x
        prev_node = x.producer()
        if prev_node is None or _single_use(x) is not steps[0].node:
            break
        prev = affine_step(prev_node)
        if prev is None or isinstance(channel_axis([*shapes, prev.const.shape]), str):
            break
        steps.insert(0, prev)
        shapes.append(tuple(prev.const.shape))
    if continues_chain(node, shapes):
        return None  # match there
    s, t = np.asarray(1.0), np.asarray(0.0)
    for step in steps:
        s, t = apply_step(step, s, t)
    return Chain(steps, steps[0].x, np.asarray(s), np.asarray(t), shapes)


class ChainMatch(Match):
    """A match of an affine chain, with the linear layer before it when there is one."""

    chain: Chain
    linear: Linear | str | None

    def covered(self) -> list[ir.Node]:
        lin = self.linear
        extra = [lin.node, *lin.nodes] if isinstance(lin, Linear) else []
        return list(dict.fromkeys([*super().covered(), *extra]))


C = TypeVar("C", bound=ChainMatch)


def _visit_once(
    ctx: PassContext, kind: str, node: ir.Node, compute: Callable[[ir.Node], object]
) -> object:
    """``compute(node)``, once per visit of ``node`` (``PassContext.visit_memo``)."""
    key = (kind, id(node))
    if key not in ctx.visit_memo:
        ctx.visit_memo[key] = compute(node)
    return ctx.visit_memo[key]


class AffineChainRule(Rule[C]):
    """A rule rooted at the last op of a per-channel affine chain; ``accepts`` says
    which chains it takes. Subclasses set ``match_type`` (ChainMatch or a subclass)."""

    roots = AFFINE_OPS

    # imperative: a chain of any length (chain_ending_at), with the linear layer before
    # it found through a Transpose or bias Add (find_linear): no fixed-size pattern
    def match(self, node: ir.Node, ctx: PassContext) -> C | None:
        # the chain and the layer before it are the same for every chain rule tried here
        chain = cast(Chain | None, _visit_once(ctx, "affine_chain", node, chain_ending_at))
        if chain is None:
            return None
        m = cast(C, self.match_type(node))
        m.chain = chain
        m.nodes += chain.nodes
        for i, step in enumerate(chain.steps):
            m.consts[f"c{i}"] = step.const
        m.values["x"] = chain.x
        linear = _visit_once(ctx, "affine_linear", node, lambda _: find_linear(chain.x))
        m.linear = cast(Linear | str | None, linear)
        return m if self.accepts(m) else None

    def accepts(self, m: C) -> bool:
        return True


def body_of(m: ChainMatch) -> list[Step]:
    """The chain without a leading Add that is the bias of the MatMul before it."""
    steps = m.chain.steps
    if steps[0].kind == "add" and producer(m.chain.x, "MatMul") is not None:
        return steps[1:]
    return steps


def exclusive_reason(nodes: list[ir.Node], inside: list[ir.Node]) -> str | None:
    """Why some of ``nodes`` feed something outside ``inside`` (or a graph output)."""
    ids = set(map(id, inside))
    for node in nodes:
        for out in node.outputs:
            if out.is_graph_output():
                return f"{node.op_type} {node.name!r} output is a graph output"
            if any(id(user) not in ids for user, _ in out.uses()):
                return f"{node.op_type} {node.name!r} output has another consumer"
    return None


def linear_reason(m: Match, lin: Linear | str | None, shapes: list[tuple[int, ...]]) -> str | None:
    """Why constants of ``shapes`` applied to the linear layer's output cannot fold into
    it, or None; when they can, the layer's nodes join the match (the driver removes
    them once they are dead)."""
    if lin is None:
        return "input is not made by a linear layer"
    if isinstance(lin, str):
        return lin
    reason = per_channel(shapes, lin.rank, lin.axis, lin.channels)
    if reason:
        return reason
    dtype = m.root.outputs[0].dtype
    if dtype is not None and lin.weight.dtype != dtype.numpy():
        return f"{lin.node.op_type} weight is {lin.weight.dtype}, the output is {dtype}"
    reason = exclusive_reason(lin.nodes, [*m.nodes, *lin.nodes])
    if reason:
        return reason
    lin.bind(m)
    return None


def fold_chain(m: ChainMatch, b: Builder) -> ir.Value:
    lin = m.linear
    assert isinstance(lin, Linear)
    s = as_vector(m.chain.s, lin.channels)
    t = as_vector(m.chain.t, lin.channels)
    return fold(lin, b, s, t)
