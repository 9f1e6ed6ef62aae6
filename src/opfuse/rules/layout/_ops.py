"""How each layout-agnostic operator is computed on a tensor stored in another axis order.

A value ``v`` of a transpose region is stored as ``v'`` with ``v = transpose(v', s)``:
logical axis ``k`` is stored axis ``s[k]``. For every operator the layout pass may move
into a region this module says which inputs carry the layout (``data``), and how the
operator's axis attributes and parameter inputs change under ``s`` (``remap``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from opfuse.rewrite.pattern import const_array
from opfuse.rules._util import DEFAULT_DOMAINS, attr, rank, static_shape

Perm = tuple[int, ...]

UNARY = frozenset(
    {
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cast", "Ceil", "Celu",
        "Clip", "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
        "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not",
        "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus",
        "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
    }
)  # fmt: skip
BROADCAST = frozenset(
    {
        "Add", "And", "BitShift", "Div", "Equal", "Greater", "GreaterOrEqual", "Less",
        "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum",
        "Where", "Xor",
    }
)  # fmt: skip
REDUCE = frozenset(
    {
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    }
)  # fmt: skip
ARG = frozenset({"ArgMax", "ArgMin"})
SOFTMAX = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
# opset from which a Reduce op takes its axes as an input instead of an attribute
AXES_INPUT_FROM = {op: 18 for op in REDUCE} | {"ReduceSum": 13}


def inverse(p: Sequence[int]) -> Perm:
    q = [0] * len(p)
    for i, pi in enumerate(p):
        q[pi] = i
    return tuple(q)


def compose(s: Sequence[int], q: Sequence[int]) -> Perm:
    """The one permutation equal to transpose(transpose(x, s), q)."""
    return tuple(s[k] for k in q)


def is_identity(p: Sequence[int]) -> bool:
    return all(i == k for i, k in enumerate(p))


def stored_constant(array: np.ndarray, s: Perm) -> np.ndarray:
    """A broadcast operand in stored order: right-aligned to the rank, permuted, leading
    unit axes dropped again down to the operand's own rank."""
    n = len(s)
    full = array.reshape((1,) * (n - array.ndim) + array.shape)
    out = np.transpose(full, inverse(s))
    while out.ndim > array.ndim and out.shape[0] == 1:
        out = out.reshape(out.shape[1:])
    return np.ascontiguousarray(out)


@dataclass
class Remap:
    """What changes when a node runs on stored tensors."""

    attrs: dict[str, ir.Attr] = field(default_factory=dict)
    params: dict[int, np.ndarray] = field(default_factory=dict)  # new constant inputs
    gathers: dict[int, np.ndarray] = field(default_factory=dict)  # input -> Gather(input, idx)
    out_perms: list[Perm | None] = field(default_factory=list)  # None: not layout-carrying


def data_inputs(node: ir.Node, n: int, opset: int) -> list[int] | None:
    """Indices of the inputs that carry the layout, or None when the node cannot join a
    region of rank ``n`` whatever the permutation."""
    op = node.op_type
    if node.domain not in DEFAULT_DOMAINS or not node.inputs or node.inputs[0] is None:
        return None
    if op not in BROADCAST and rank(node.inputs[0]) != n:
        return None
    if op in UNARY:
        return [0]
    if op in BROADCAST:
        idx = [i for i, v in enumerate(node.inputs) if v is not None]
        for i in idx:
            r = rank(node.inputs[i])
            if r == n:
                continue
            array = const_array(node.inputs[i])
            if array is None or array.ndim > n:
                return None  # a lower-rank tensor that is not a constant
        if all(rank(node.inputs[i]) != n for i in idx):
            return None
        return idx
    if op == "Concat":
        if any(v is None or rank(v) != n for v in node.inputs):
            return None
        return list(range(len(node.inputs)))
    if op == "Split":
        return [0]
    if op in REDUCE:
        axes = node.inputs[1] if opset >= AXES_INPUT_FROM[op] and len(node.inputs) > 1 else None
        if axes is not None and const_array(axes) is None:
            return None
        return [0]
    if op in ARG:
        return [0]
    if op in SOFTMAX:
        return [0] if opset >= 13 else None
    if op == "LayerNormalization":
        return [0]
    if op == "Pad":
        return _pad_inputs(node, opset)
    if op == "Resize":
        for i in (1, 2, 3):
            if len(node.inputs) > i and node.inputs[i] is not None:
                dims = static_shape(node.inputs[i])
                if dims is not None and 0 in dims:
                    continue  # an empty roi / scales placeholder
                if const_array(node.inputs[i]) is None:
                    return None
        return [0]
    return None


def _pad_inputs(node: ir.Node, opset: int) -> list[int] | None:
    if attr(node, "mode", "constant") not in ("constant", "reflect", "edge", "wrap"):
        return None
    axes = node.inputs[3] if opset >= 18 and len(node.inputs) > 3 else None
    if axes is not None and const_array(axes) is None:
        return None  # axes computed at run time
    if opset >= 11 and (len(node.inputs) < 2 or node.inputs[1] is None):
        return None
    return [0]


def _axis(node: ir.Node, name: str, default: int, n: int, s: Perm) -> ir.Attr:
    a = int(attr(node, name, default))
    return ir.AttrInt64(name, s[a % n])


def remap(node: ir.Node, s: Perm, opset: int) -> Remap | None:
    """The node's attributes and parameters for inputs stored in order ``s``, or None
    when the node's meaning cannot follow the permutation."""
    op, n = node.op_type, len(s)
    r = Remap()
    outs = len(node.outputs)
    if op in UNARY or op in BROADCAST:
        r.out_perms = [s]  # constant operands are permuted by the region (stored_constant)
        return r
    if op == "Concat":
        r.attrs["axis"] = _axis(node, "axis", 0, n, s)
        r.out_perms = [s]
        return r
    if op == "Split":
        r.attrs["axis"] = _axis(node, "axis", 0, n, s)
        r.out_perms = [s] * outs
        return r
    if op in SOFTMAX:
        r.attrs["axis"] = _axis(node, "axis", -1, n, s)
        r.out_perms = [s]
        return r
    if op == "LayerNormalization":
        axis = int(attr(node, "axis", -1)) % n
        if any(s[k] != k for k in range(axis, n)):
            return None  # the normalized axes would change order or place
        r.out_perms = [s] * outs
        return r
    if op in REDUCE or op in ARG:
        return _remap_reduce(node, s, opset, r)
    if op == "Pad":
        return _remap_pad(node, s, opset, r)
    if op == "Resize":
        return _remap_resize(node, s, r)
    return None


def _remap_reduce(node: ir.Node, s: Perm, opset: int, r: Remap) -> Remap | None:
    op, n = node.op_type, len(s)
    keepdims = int(attr(node, "keepdims", 1))
    if op in ARG:
        axes = [int(attr(node, "axis", 0)) % n]
        r.attrs["axis"] = ir.AttrInt64("axis", s[axes[0]])
    else:
        from_input = opset >= AXES_INPUT_FROM[op]
        if from_input:
            v = node.inputs[1] if len(node.inputs) > 1 else None
            array = const_array(v) if v is not None else None
            axes_list = [] if array is None else [int(a) for a in array.reshape(-1)]
        else:
            axes_list = list(attr(node, "axes", []) or [])
        if not axes_list:
            if from_input and int(attr(node, "noop_with_empty_axes", 0)):
                r.out_perms = [s]
                return r  # the identity: layout unchanged
            axes_list = list(range(n))  # reduce over everything
            if not keepdims:
                r.out_perms = [None]
                return r  # a scalar: no layout left
        axes = sorted({a % n for a in axes_list})
        stored = np.array([s[a] for a in axes], dtype=np.int64)
        if from_input:
            if len(node.inputs) > 1 and node.inputs[1] is not None:
                r.params[1] = stored
        else:
            r.attrs["axes"] = ir.AttrInt64s("axes", [int(a) for a in stored])
    if keepdims:
        r.out_perms = [s]
        return r
    logical_left = [k for k in range(n) if k not in axes]
    stored_axes = {s[a] for a in axes}
    stored_left = [j for j in range(n) if j not in stored_axes]
    t = tuple(stored_left.index(s[k]) for k in logical_left)
    r.out_perms = [t]
    return r


def _remap_pad(node: ir.Node, s: Perm, opset: int, r: Remap) -> Remap | None:
    n = len(s)
    inv = np.array(inverse(s), dtype=np.int64)
    if opset < 11:
        old = list(attr(node, "pads"))
        r.attrs["pads"] = ir.AttrInt64s("pads", [old[i] for i in inv] + [old[n + i] for i in inv])
        r.out_perms = [s]
        return r
    axes_value = node.inputs[3] if opset >= 18 and len(node.inputs) > 3 else None
    if axes_value is not None:
        pad_axes = const_array(axes_value)
        assert pad_axes is not None
        r.params[3] = np.array([s[int(a) % n] for a in pad_axes.reshape(-1)], dtype=np.int64)
        r.out_perms = [s]
        return r
    pads_value = node.inputs[1]
    assert pads_value is not None
    pads = const_array(pads_value)
    index = np.concatenate([inv, inv + n])
    if pads is not None:
        r.params[1] = pads.reshape(-1)[index]
    else:
        r.gathers[1] = index  # pads computed at run time: gather them into stored order
    r.out_perms = [s]
    return r


def _remap_resize(node: ir.Node, s: Perm, r: Remap) -> Remap | None:
    n = len(s)
    inv = list(inverse(s))
    axes = attr(node, "axes")
    if axes is not None:
        r.attrs["axes"] = ir.AttrInt64s("axes", [s[int(a) % n] for a in axes])
        r.out_perms = [s]
        return r
    for i in (1, 2, 3):
        v = node.inputs[i] if len(node.inputs) > i else None
        array = const_array(v) if v is not None else None
        if array is None or array.size == 0:
            continue
        flat = array.reshape(-1)
        if i == 1:  # roi: starts then ends
            r.params[i] = np.concatenate([flat[:n][inv], flat[n:][inv]])
        else:
            r.params[i] = flat[inv]
    r.out_perms = [s]
    return r
