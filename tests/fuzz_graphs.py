"""A hypothesis strategy for random valid ONNX graphs built from the operators opfuse's
passes touch, with static or dynamic (symbolic batch) input shapes.

The builder tracks every value's concrete shape, so each operator it adds is valid by
construction: Conv with random groups/pads/strides/dilations (weights plain or through
DequantizeLinear), BatchNormalization, MatMul/Gemm, elementwise and broadcast ops with
constants, Transpose/Reshape/Flatten/Squeeze/Unsqueeze/Concat/Split/Slice/Pad/Cast,
Reduce*, pooling, Clip/Relu/Sigmoid and friends, Q/DQ pairs. Besides single operators it
draws motifs, the multi-node shapes the passes look for (Conv+BN, Pad+Conv, MatMul+bias,
decomposed Softmax/LayerNorm/GELU/RMSNorm/BatchNorm, sibling Convs, NHWC transposes...),
because a random sequence of single operators rarely forms them.

Discontinuous operators (QuantizeLinear, a float16 round trip) are only applied to
values that are bit-exact whatever the optimizer does upstream (graph inputs and values
computed from them by data-movement ops), so a 1-ulp difference from a legal
reassociation upstream can never flip a rounding step and fake a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSETS = (13, 17, 18, 20, 21, 23)
MAX_ELEMENTS = 4096  # keep every tensor small: the fuzz runs thousands of graphs


@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    exact: bool = False  # bit-identical whatever rewrites happen upstream


@dataclass
class Builder:
    draw: Callable
    opset: int
    dynamic: bool
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    count: int = 0
    focus: Value | None = None

    # -- helpers ---------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.fresh(prefix)
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)  # every float tensor here is float32
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def ints(self, values, prefix: str = "i") -> str:
        return self.const(np.asarray(values, dtype=np.int64), prefix)

    def node(self, op: str, inputs: list[str], shape, exact=False, n_out=1, **attrs) -> Value:
        outs = [self.fresh("v") for _ in range(n_out)]
        self.nodes.append(
            helper.make_node(op, inputs, outs, name=self.fresh(op.lower() + "_"), **attrs)
        )
        value = Value(outs[0], tuple(shape), exact)
        self.values.append(value)
        return value

    def floats(self, shape, low=-1.0, high=1.0) -> np.ndarray:
        seed = self.draw(st.integers(0, 2**31 - 1))
        rng = np.random.default_rng(seed)
        return rng.uniform(low, high, shape).astype(np.float32)

    def pick(self, rank_ok: Callable[[int], bool] = lambda r: True) -> Value | None:
        focus, self.focus = self.focus, None
        if focus is not None and rank_ok(len(focus.shape)):
            return focus  # a motif asked the next operator to read this value
        choices = [v for v in self.values if rank_ok(len(v.shape))]
        if not choices:
            return None
        # prefer recent values so chains form, but let any value fan out
        index = self.draw(st.integers(0, len(choices) - 1))
        if self.draw(st.booleans()):
            index = len(choices) - 1
        return choices[index]

    def axes_input(self) -> bool:
        return self.opset >= 18

    def reduce(self, op: str, x: Value, axes: list[int], keepdims: int) -> Value:
        rank = len(x.shape)
        norm = sorted(a % rank for a in axes)
        shape = [(1 if keepdims else None) if i in norm else d for i, d in enumerate(x.shape)]
        shape = [d for d in shape if d is not None]
        if self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13):
            return self.node(op, [x.name, self.ints(axes)], shape, keepdims=keepdims)
        return self.node(op, [x.name], shape, axes=axes, keepdims=keepdims)


def size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# -- single operators ----------------------------------------------------------------------


def conv_weight(b: Builder, shape) -> str:
    """A float weight, or int8 + scale through DequantizeLinear (the QDQ model form)."""
    fan_in = max(1, size(shape[1:]))
    w = b.floats(shape) / np.sqrt(fan_in)
    if b.draw(st.integers(0, 4)) != 0:
        return b.const(w, "w")
    scale = np.float32(max(float(np.abs(w).max()), 1e-3) / 127)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    dq = b.node("DequantizeLinear", [b.const(q, "wq"), b.const(scale, "ws")], shape)
    b.values.remove(dq)  # a weight, not an activation to build on
    return dq.name


def conv(b: Builder, x: Value | None = None, **fixed) -> Value | None:
    x = x or b.pick(lambda r: r == 4)
    if x is None:
        return None
    n, c, h, w = x.shape
    groups = fixed.get("groups") or b.draw(st.sampled_from(sorted({1, c, *divisors(c)})))
    cout = fixed.get("cout") or groups * b.draw(st.integers(1, max(1, 8 // groups) or 1))
    k = fixed.get("k") or (b.draw(st.integers(1, 3)), b.draw(st.integers(1, 3)))
    s = fixed.get("s") or (b.draw(st.integers(1, 2)), b.draw(st.integers(1, 2)))
    dil = fixed.get("dil") or (b.draw(st.sampled_from([1, 1, 2])),) * 2
    pads = fixed.get("pads") or [b.draw(st.integers(0, 1)) for _ in range(4)]
    oh = (h + pads[0] + pads[2] - dil[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w + pads[1] + pads[3] - dil[1] * (k[1] - 1) - 1) // s[1] + 1
    if oh < 1 or ow < 1 or n * cout * oh * ow > MAX_ELEMENTS:
        return None
    inputs = [x.name, conv_weight(b, (cout, c // groups, *k))]
    if fixed.get("bias", b.draw(st.booleans())):
        inputs.append(b.const(b.floats(cout), "b"))
    return b.node(
        "Conv",
        inputs,
        (n, cout, oh, ow),
        group=groups,
        kernel_shape=list(k),
        strides=list(s),
        dilations=list(dil),
        pads=pads,
    )


def batchnorm(b: Builder, x: Value | None = None) -> Value | None:
    x = x or b.pick(lambda r: r >= 2)
    if x is None:
        return None
    c = x.shape[1]
    params = [b.floats(c), b.floats(c), b.floats(c), b.floats(c, 0.5, 2.0)]
    eps = b.draw(st.sampled_from([1e-5, 1e-3, 0.1]))
    names = [b.const(p, n) for p, n in zip(params, ("gamma", "beta", "mean", "var"), strict=True)]
    return b.node("BatchNormalization", [x.name, *names], x.shape, epsilon=eps)


def matmul(b: Builder, x: Value | None = None) -> Value | None:
    x = x or b.pick(lambda r: r >= 2)
    if x is None:
        return None
    k, m = x.shape[-1], b.draw(st.integers(1, 8))
    if size(x.shape[:-1]) * m > MAX_ELEMENTS:
        return None
    return b.node("MatMul", [x.name, conv_weight(b, (k, m))], (*x.shape[:-1], m))


def gemm(b: Builder, x: Value | None = None) -> Value | None:
    x = x or b.pick(lambda r: r == 2)
    if x is None:
        return None
    trans_a = b.draw(st.integers(0, 3)) == 0
    if trans_a:
        x = b.node("Transpose", [x.name], x.shape[::-1], perm=[1, 0])
        b.values.remove(x)
    k, m = x.shape[1 - trans_a], b.draw(st.integers(1, 8))
    trans_b = b.draw(st.integers(0, 1))
    inputs = [x.name, conv_weight(b, (m, k) if trans_b else (k, m))]
    bias = b.draw(st.sampled_from(["none", "vector", "row", "scalar"]))
    if bias != "none":
        shape = {"vector": (m,), "row": (1, m), "scalar": ()}[bias]
        inputs.append(b.const(b.floats(shape), "gb"))
    alpha = b.draw(st.sampled_from([1.0, 0.5, 2.0]))
    beta = b.draw(st.sampled_from([1.0, 0.5]))
    rows = x.shape[1] if trans_a else x.shape[0]
    return b.node(
        "Gemm", inputs, (rows, m), transA=int(trans_a), transB=trans_b, alpha=alpha, beta=beta
    )


def broadcast_shape(b: Builder, shape) -> tuple[int, ...]:
    """A constant's shape that broadcasts to ``shape`` without growing it."""
    rank = len(shape)
    kind = b.draw(st.sampled_from(["scalar", "one", "channel", "last", "full", "keep"]))
    if kind == "scalar":
        return ()
    if kind == "one":
        return (1,)
    if kind == "channel" and rank >= 2:
        return (shape[1],) + (1,) * (rank - 2)
    if kind == "last":
        return (shape[-1],)
    if kind == "full":
        return tuple(shape[1:])
    if kind == "keep" or b.draw(st.integers(0, 2)):
        return tuple(d if b.draw(st.booleans()) else 1 for d in shape)
    # a constant that grows the output: 2 where the value has 1, or a new leading axis
    grown = tuple(2 if d == 1 and b.draw(st.booleans()) else d for d in shape)
    return (2, *grown) if rank < 4 and b.draw(st.booleans()) else grown


def binary_const(b: Builder, x: Value | None = None, op: str | None = None, cshape=None):
    x = x or b.pick()
    if x is None:
        return None
    op = op or b.draw(st.sampled_from(["Add", "Sub", "Mul", "Div"]))
    cshape = cshape if cshape is not None else broadcast_shape(b, x.shape)
    out = tuple(np.broadcast_shapes(tuple(x.shape), tuple(cshape)))
    if size(out) > MAX_ELEMENTS:
        cshape, out = (), x.shape
    c = b.floats(cshape, 0.5, 2.0) * np.where(b.floats(cshape) < 0, -1, 1).astype(np.float32)
    if b.draw(st.integers(0, 5)) == 0:  # a neutral element (x*1, x/1, x+0, x-0, -0.0)
        neutral = {"Mul": 1.0, "Div": 1.0}.get(op, b.draw(st.sampled_from([0.0, -0.0])))
        c = np.full(cshape, neutral, np.float32)
    cname = b.const(c.astype(np.float32), op.lower())
    if op != "Div" and b.draw(st.integers(0, 3)) == 0:
        return b.node(op, [cname, x.name], out)  # constant first
    return b.node(op, [x.name, cname], out)


def binary_values(b: Builder) -> Value | None:
    x = b.pick()
    if x is None:
        return None
    same = [v for v in b.values if v.shape == x.shape]
    y = same[b.draw(st.integers(0, len(same) - 1))]
    op = b.draw(st.sampled_from(["Add", "Sub", "Mul", "Max", "Min"]))
    return b.node(op, [x.name, y.name], x.shape, exact=op in ("Max", "Min") and x.exact and y.exact)


UNARY_EXACT = ("Relu", "Identity", "Dropout", "Neg", "Abs")


def unary(b: Builder) -> Value | None:
    x = b.pick()
    if x is None:
        return None
    op = b.draw(
        st.sampled_from(
            [
                "Relu",
                "Sigmoid",
                "Tanh",
                "Identity",
                "Dropout",
                "Neg",
                "Abs",
                "LeakyRelu",
                "Clip",
                "Softmax",
                "Pow",
                "Sqrt",
                "Reciprocal",
            ]
        )
    )
    if op in ("Pow", "Sqrt", "Reciprocal"):  # keep the base positive and away from zero
        x = b.node("Sigmoid", [x.name], x.shape)
        if op == "Pow":
            e = b.draw(st.sampled_from([2.0, 3.0, 1.0, 0.5, -1.0, -0.5, 0.0, 1.5]))
            return b.node("Pow", [x.name, b.const(np.float32(e), "e")], x.shape)
    if op == "Clip":
        inputs = [x.name]
        lo = b.draw(st.sampled_from([None, -1.0, 0.0]))
        hi = b.draw(st.sampled_from([None, 1.0, 6.0]))
        inputs.append(b.const(np.float32(lo), "lo") if lo is not None else "")
        if hi is not None:
            inputs.append(b.const(np.float32(hi), "hi"))
        while inputs[-1] == "":
            inputs.pop()
        return b.node("Clip", inputs, x.shape, exact=x.exact)
    if op == "Softmax":
        axis = b.draw(st.integers(-len(x.shape), len(x.shape) - 1)) if x.shape else 0
        return b.node("Softmax", [x.name], x.shape, axis=axis)
    if op == "LeakyRelu":
        return b.node(op, [x.name], x.shape, alpha=0.1)
    return b.node(op, [x.name], x.shape, exact=x.exact and op in UNARY_EXACT)


def transpose(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    perm = b.draw(st.permutations(range(len(x.shape))))
    return b.node("Transpose", [x.name], [x.shape[p] for p in perm], exact=x.exact, perm=perm)


def reshape(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    rest = x.shape[1:]
    kind = b.draw(st.sampled_from(["flatten", "merge", "split", "same"]))
    if kind == "flatten" or len(rest) < 2 and kind == "merge":
        target, shape = [0, -1], (x.shape[0], size(rest))
    elif kind == "merge":
        i = b.draw(st.integers(0, len(rest) - 2))
        dims = [*rest[:i], rest[i] * rest[i + 1], *rest[i + 2 :]]
        target, shape = [0, *dims], (x.shape[0], *dims)
    elif kind == "split":
        i = b.draw(st.integers(0, len(rest) - 1))
        f = b.draw(st.sampled_from(divisors(rest[i])))
        dims = [*rest[:i], f, rest[i] // f, *rest[i + 1 :]]
        if len(dims) > 5:
            return None
        target, shape = [0, *dims], (x.shape[0], *dims)
    else:
        target, shape = [0, *rest], x.shape  # a no-op reshape
    return b.node("Reshape", [x.name, b.ints(target, "shape")], shape, exact=x.exact)


def flatten(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    axis = b.draw(st.integers(1, len(x.shape)))
    shape = (size(x.shape[:axis]), size(x.shape[axis:]))
    return b.node("Flatten", [x.name], shape, exact=x.exact, axis=axis)


def unsqueeze(b: Builder) -> Value | None:
    x = b.pick(lambda r: 1 <= r <= 4)
    if x is None:
        return None
    axis = b.draw(st.integers(1, len(x.shape)))
    shape = (*x.shape[:axis], 1, *x.shape[axis:])
    return b.node("Unsqueeze", [x.name, b.ints([axis], "axes")], shape, exact=x.exact)


def squeeze(b: Builder) -> Value | None:
    ones = [
        (v, [i for i, d in enumerate(v.shape) if d == 1 and i > 0])
        for v in b.values
        if len(v.shape) >= 2
    ]
    ones = [(v, a) for v, a in ones if a]
    if not ones:
        return None
    x, axes = ones[b.draw(st.integers(0, len(ones) - 1))]
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return b.node("Squeeze", [x.name, b.ints(axes, "axes")], shape, exact=x.exact)


def concat(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    axis = b.draw(st.integers(1, len(x.shape) - 1))
    others = [
        v
        for v in b.values
        if len(v.shape) == len(x.shape)
        and all(d == e for i, (d, e) in enumerate(zip(v.shape, x.shape, strict=True)) if i != axis)
    ]
    parts = [x, others[b.draw(st.integers(0, len(others) - 1))]]
    names = [p.name for p in parts]
    exact = all(p.exact for p in parts)
    one_input = b.draw(st.integers(0, 9)) == 0
    if not one_input and b.draw(st.integers(0, 2)) == 0:  # a constant part
        cshape = list(x.shape)
        cshape[axis] = b.draw(st.integers(1, 3))
        names.append(b.const(b.floats(cshape), "cat"))
        parts.append(Value("", tuple(cshape)))
    total = sum(p.shape[axis] for p in parts)
    shape = list(x.shape)
    shape[axis] = total
    if size(shape) > MAX_ELEMENTS:
        return None
    if one_input:
        names, shape = [x.name], list(x.shape)  # a one-input Concat
    return b.node(
        "Concat", names, shape, exact=exact, axis=axis - len(x.shape) * b.draw(st.integers(0, 1))
    )


def split(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    axes = [i for i in range(1, len(x.shape)) if x.shape[i] >= 2]
    if not axes:
        return None
    axis = b.draw(st.sampled_from(axes))
    first = b.draw(st.integers(1, x.shape[axis] - 1))
    sizes = [first, x.shape[axis] - first]
    out = b.node("Split", [x.name, b.ints(sizes, "split")], (), exact=x.exact, n_out=2, axis=axis)
    b.values.remove(out)
    names = list(b.nodes[-1].output)
    for name, s in zip(names, sizes, strict=True):
        shape = list(x.shape)
        shape[axis] = s
        b.values.append(Value(name, tuple(shape), x.exact))
    return b.values[-1]


def slice_(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 1)
    if x is None:
        return None
    rank = len(x.shape)
    axes = sorted(b.draw(st.sets(st.integers(1 if rank > 1 else 0, rank - 1), min_size=1)))
    starts, ends, steps, shape = [], [], [], list(x.shape)
    for a in axes:
        d = x.shape[a]
        step = b.draw(st.sampled_from([1, 1, 2, -1]))
        if b.draw(st.integers(0, 4)) == 0:  # the whole axis (a no-op for step 1)
            start, end = (0, 2**62) if step > 0 else (-1, -(2**62))
        else:
            lo, hi = sorted(b.draw(st.lists(st.integers(0, d), min_size=2, max_size=2)))
            if lo == hi:
                hi = min(d, lo + 1)
                lo = hi - 1
            start, end = (lo, hi) if step > 0 else (hi - 1, lo - 1 if lo > 0 else -(d + 1))
        count = len(range(d)[slice(start, end if abs(end) < 2**61 else None, step)])
        if count == 0:
            return None
        starts.append(start)
        ends.append(end)
        steps.append(step)
        shape[a] = count
    axes_out = [a - rank if b.draw(st.booleans()) else a for a in axes]
    inputs = [x.name, b.ints(starts), b.ints(ends), b.ints(axes_out), b.ints(steps)]
    return b.node("Slice", inputs, shape, exact=x.exact)


def pad(b: Builder, x: Value | None = None, spatial: bool = False) -> Value | None:
    x = x or b.pick(lambda r: r >= 2)
    if x is None:
        return None
    rank = len(x.shape)
    pads = [
        0 if i % rank in ((0, 1) if spatial else (0,)) else b.draw(st.integers(0, 2))
        for i in range(2 * rank)
    ]
    shape = [d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape)]
    if size(shape) > MAX_ELEMENTS:
        return None
    mode = b.draw(st.sampled_from(["constant", "constant", "edge", "reflect"]))
    if mode == "reflect" and any(max(pads[i], pads[i + rank]) >= x.shape[i] for i in range(rank)):
        mode = "constant"
    inputs = [x.name, b.ints(pads, "pads")]
    if mode == "constant" and b.draw(st.booleans()):
        inputs.append(b.const(np.float32(b.draw(st.sampled_from([0.0, 1.5]))), "pv"))
    return b.node("Pad", inputs, shape, exact=x.exact, mode=mode)


def cast(b: Builder) -> Value | None:
    x = b.pick()
    if x is None:
        return None
    kind = b.draw(st.sampled_from(["double", "same", "half", "int"]))
    if kind in ("half", "int") and not x.exact:
        kind = "double"
    if kind == "same":
        return b.node("Cast", [x.name], x.shape, exact=x.exact, to=TensorProto.FLOAT)
    to = {"double": TensorProto.DOUBLE, "half": TensorProto.FLOAT16, "int": TensorProto.INT32}[
        kind
    ]  # float -> int32 -> float truncates: never a no-op pair
    mid = b.node("Cast", [x.name], x.shape, to=to)
    b.values.remove(mid)
    return b.node("Cast", [mid.name], x.shape, exact=x.exact, to=TensorProto.FLOAT)


def reduce_(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    op = b.draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"]))
    rank = len(x.shape)
    axes = sorted(b.draw(st.sets(st.integers(1, rank - 1), min_size=1)))
    keep = b.draw(st.integers(0, 1))
    if not keep and len(axes) == rank - 1:
        keep = 1
    axes = [a - rank if b.draw(st.booleans()) else a for a in axes]
    return b.reduce(op, x, axes, keep)


def pool(b: Builder, x: Value | None = None) -> Value | None:
    x = x or b.pick(lambda r: r == 4)
    if x is None:
        return None
    n, c, h, w = x.shape
    op = b.draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    if op.startswith("Global"):
        return b.node(op, [x.name], (n, c, 1, 1), exact=op == "GlobalMaxPool" and x.exact)
    k = (b.draw(st.integers(1, 3)), b.draw(st.integers(1, 3)))
    s = (b.draw(st.integers(1, 2)),) * 2
    pads = [b.draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
    oh = (h + pads[0] + pads[2] - k[0]) // s[0] + 1
    ow = (w + pads[1] + pads[3] - k[1]) // s[1] + 1
    if oh < 1 or ow < 1:
        return None
    attrs = {"kernel_shape": list(k), "strides": list(s), "pads": pads}
    if op == "AveragePool":
        attrs["count_include_pad"] = b.draw(st.integers(0, 1))
    return b.node(op, [x.name], (n, c, oh, ow), exact=op == "MaxPool" and x.exact, **attrs)


def qdq(b: Builder) -> Value | None:
    exact = [v for v in b.values if v.exact]
    if not exact:
        return None
    x = exact[b.draw(st.integers(0, len(exact) - 1))]
    signed = b.draw(st.booleans())
    scale = np.float32(b.draw(st.sampled_from([0.01, 0.05, 0.2])))
    zp = np.array(
        b.draw(st.integers(-5, 5)) if signed else b.draw(st.integers(100, 150)),
        np.int8 if signed else np.uint8,
    )
    sc, z = b.const(scale, "qs"), b.const(zp, "qz")
    q = b.node("QuantizeLinear", [x.name, sc, z], x.shape)
    b.values.remove(q)
    return b.node("DequantizeLinear", [q.name, sc, z], x.shape, exact=True)


# -- motifs: the multi-node shapes the passes look for ----------------------------------


def conv_bn(b: Builder) -> Value | None:
    c = conv(b)
    return batchnorm(b, c) if c else None


def pad_conv(b: Builder) -> Value | None:
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    p = pad(b, x, spatial=True)
    if p is None:
        return None
    return conv(b, p) if b.draw(st.booleans()) else pool(b, p)


def matmul_bias(b: Builder) -> Value | None:
    mm = matmul(b) if b.draw(st.booleans()) else gemm(b)
    if mm is None:
        return None
    kind = b.draw(st.sampled_from(["add", "bn", "mul"]))
    if kind == "bn" and len(mm.shape) == 2:
        return batchnorm(b, mm)
    op = "Mul" if kind == "mul" else "Add"
    return binary_const(b, mm, op, (mm.shape[-1],) if b.draw(st.booleans()) else ())


def conv_affine(b: Builder) -> Value | None:
    c = conv(b)
    if c is None:
        return None
    for _ in range(b.draw(st.integers(1, 3))):
        op = b.draw(st.sampled_from(["Mul", "Add", "Sub", "Div"]))
        shape = b.draw(st.sampled_from([(c.shape[1], 1, 1), (), (1, c.shape[1], 1, 1)]))
        c = binary_const(b, c, op, shape)
    return c


def bn_small_ops(b: Builder) -> Value | None:
    """(x - mean) / sqrt(var + eps) * gamma + beta with per-channel constants."""
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    if b.draw(st.booleans()):
        x = conv(b, x) or x
    shape = (x.shape[1], 1, 1)
    y = binary_const(b, x, "Sub", shape)
    y = binary_const(b, y, b.draw(st.sampled_from(["Div", "Mul"])), shape)
    y = binary_const(b, y, "Mul", shape)
    return binary_const(b, y, "Add", shape)


def softmax_parts(b: Builder) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    axis = b.draw(st.integers(1, len(x.shape) - 1))
    if b.draw(st.booleans()):
        mx = b.reduce("ReduceMax", x, [axis], 1)
        x = b.node("Sub", [x.name, mx.name], x.shape)
    else:
        x = b.node("Tanh", [x.name], x.shape)  # bounded: no overflow without the max
    e = b.node("Exp", [x.name], x.shape)
    s = b.reduce("ReduceSum", e, [axis], 1)
    return b.node("Div", [e.name, s.name], x.shape)


def layernorm_parts(b: Builder, rms: bool = False) -> Value | None:
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    d = x
    if not rms:
        mean = b.reduce("ReduceMean", x, [-1], 1)
        d = b.node("Sub", [x.name, mean.name], x.shape)
    if b.draw(st.booleans()):
        sq = b.node("Pow", [d.name, b.const(np.float32(2.0), "two")], x.shape)
    else:
        sq = b.node("Mul", [d.name, d.name], x.shape)
    var = b.reduce("ReduceMean", sq, [-1], 1)
    eps = b.node("Add", [var.name, b.const(np.float32(1e-5), "eps")], var.shape)
    std = b.node("Sqrt", [eps.name], var.shape)
    y = b.node("Div", [d.name, std.name], x.shape)
    if b.draw(st.booleans()):
        y = binary_const(b, y, "Mul", (x.shape[-1],))
        y = binary_const(b, y, "Add", (x.shape[-1],))
    return y


def gelu_parts(b: Builder) -> Value | None:
    x = b.pick()
    if x is None:
        return None
    half = b.const(np.float32(0.5), "half")
    one = b.const(np.float32(1.0), "one")
    if b.draw(st.booleans()):
        t = b.node("Div", [x.name, b.const(np.float32(np.sqrt(2.0)), "sqrt2")], x.shape)
        t = b.node("Erf", [t.name], x.shape)
    else:
        cube = b.node("Pow", [x.name, b.const(np.float32(3.0), "three")], x.shape)
        t = b.node("Mul", [cube.name, b.const(np.float32(0.044715), "k")], x.shape)
        t = b.node("Add", [x.name, t.name], x.shape)
        t = b.node("Mul", [t.name, b.const(np.float32(np.sqrt(2 / np.pi)), "c")], x.shape)
        t = b.node("Tanh", [t.name], x.shape)
    t = b.node("Add", [t.name, one], x.shape)
    t = b.node("Mul", [x.name, t.name], x.shape)
    return b.node("Mul", [t.name, half], x.shape)


def sibling_convs(b: Builder) -> Value | None:
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    fixed = {
        "k": (b.draw(st.integers(1, 3)),) * 2,
        "s": (1, 1),
        "dil": (1, 1),
        "groups": 1,
    }
    fixed["pads"] = [fixed["k"][0] // 2] * 4
    convs = [conv(b, x, **fixed) for _ in range(b.draw(st.integers(2, 3)))]
    convs = [c for c in convs if c is not None]
    if len(convs) >= 2 and b.draw(st.booleans()):
        shape = list(convs[0].shape)
        shape[1] = sum(c.shape[1] for c in convs)
        return b.node("Concat", [c.name for c in convs], shape, axis=1)
    return convs[-1] if convs else None


def conv_fc(b: Builder) -> Value | None:
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    g = b.node("GlobalAveragePool", [x.name], (x.shape[0], x.shape[1], 1, 1))
    c = conv(b, g, k=(1, 1), s=(1, 1), dil=(1, 1), pads=[0, 0, 0, 0], groups=1)
    if c is None:
        return None
    if b.draw(st.booleans()):
        return b.node("Flatten", [c.name], (c.shape[0], c.shape[1]), axis=1)
    return b.node("Reshape", [c.name, b.ints([0, -1], "shape")], (c.shape[0], c.shape[1]))


def affine_conv(b: Builder) -> Value | None:
    """Mul/Add/BN by per-channel constants, then a Conv (with or without pads): only a
    Mul folds exactly into the Conv after it; an Add or BN shift does not at padded borders."""
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    kind = b.draw(st.sampled_from(["Mul", "Add", "bn"]))
    if kind == "bn":
        y = batchnorm(b, x)
    else:
        y = binary_const(b, x, kind, b.draw(st.sampled_from([(x.shape[1], 1, 1), ()])))
    return conv(b, y) if y is not None else None


def shape_arith(b: Builder) -> Value | None:
    """Reshape by a shape computed from Shape/Gather/Unsqueeze/Concat (what exporters
    write for dynamic dims): foldable only where the dims are static."""
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    shape = b.node("Shape", [x.name], (len(x.shape),))
    b.values.remove(shape)
    keep = b.draw(st.integers(1, len(x.shape) - 1))  # keep dims [0, keep), flatten the rest
    parts = []
    for i in range(keep):
        g = b.node("Gather", [shape.name, b.ints(i, "idx")], (), axis=0)
        u = b.node("Unsqueeze", [g.name, b.ints([0], "axes")], (1,))
        b.values.remove(g)
        b.values.remove(u)
        parts.append(u.name)
    cat = b.node("Concat", [*parts, b.ints([-1], "minus1")], (keep + 1,), axis=0)
    b.values.remove(cat)
    out = (*x.shape[:keep], size(x.shape[keep:]))
    return b.node("Reshape", [x.name, cat.name], out, exact=x.exact)


def const_expr(b: Builder) -> Value | None:
    """An operand computed from constants only (Transpose/Reshape/Add/Cast/Concat of
    initializers): constant folding's input."""
    x = b.pick()
    if x is None:
        return None
    target = broadcast_shape(b, x.shape)
    if size(np.broadcast_shapes(tuple(x.shape), tuple(target))) > MAX_ELEMENTS:
        target = ()
    kind = b.draw(st.sampled_from(["transpose", "reshape", "add", "cast", "concat"]))
    if kind == "transpose" and len(target) >= 2:
        c = b.const(b.floats(target[::-1]), "ct")
        v = b.node("Transpose", [c], target, perm=list(range(len(target)))[::-1])
    elif kind == "reshape":
        c = b.const(b.floats((size(target),)), "cr")
        v = b.node("Reshape", [c, b.ints(list(target), "shape")], target)
    elif kind == "cast":
        c = b.const(b.floats(target).astype(np.float64), "cc")
        b.inits[-1] = numpy_helper.from_array(b.floats(target).astype(np.float64), c)
        v = b.node("Cast", [c], target, to=TensorProto.FLOAT)
    elif kind == "concat" and len(target) >= 1 and target[-1] >= 2:
        first = target[-1] // 2
        c1 = b.const(b.floats((*target[:-1], first)), "cc1")
        c2 = b.const(b.floats((*target[:-1], target[-1] - first)), "cc2")
        v = b.node("Concat", [c1, c2], target, axis=len(target) - 1)
    else:
        v = b.node(
            "Add", [b.const(b.floats(target), "ca"), b.const(b.floats(target), "cb")], target
        )
    b.values.remove(v)
    op = b.draw(st.sampled_from(["Add", "Mul", "Sub"]))
    out = tuple(np.broadcast_shapes(tuple(x.shape), tuple(target)))
    return b.node(op, [x.name, v.name], out)


def redundant_chain(b: Builder) -> Value | None:
    """The same or the inverse operator twice: Relu/Relu, Neg/Neg, Abs/Abs, Transpose and
    its inverse or another perm, Reshape/Reshape, Unsqueeze/Squeeze, Cast pairs."""
    x = b.pick(lambda r: r >= 2)
    if x is None:
        return None
    kind = b.draw(
        st.sampled_from(["Relu", "Neg", "Abs", "Sigmoid", "transpose", "reshape", "unsq", "cast"])
    )
    if kind in ("Relu", "Neg", "Abs", "Sigmoid"):
        y = b.node(kind, [x.name], x.shape, exact=x.exact and kind != "Sigmoid")
        return b.node(kind, [y.name], x.shape, exact=y.exact)
    if kind == "transpose":
        perm = b.draw(st.permutations(range(len(x.shape))))
        y = b.node("Transpose", [x.name], [x.shape[p] for p in perm], exact=x.exact, perm=perm)
        back = (
            list(np.argsort(perm))
            if b.draw(st.booleans())
            else b.draw(st.permutations(range(len(x.shape))))
        )
        back = [int(p) for p in back]
        return b.node("Transpose", [y.name], [y.shape[p] for p in back], exact=x.exact, perm=back)
    if kind == "reshape":
        y = b.node(
            "Reshape",
            [x.name, b.ints([0, -1], "shape")],
            (x.shape[0], size(x.shape[1:])),
            exact=x.exact,
        )
        return b.node(
            "Reshape", [y.name, b.ints([0, *x.shape[1:]], "shape")], x.shape, exact=x.exact
        )
    if kind == "unsq":
        axis = b.draw(st.integers(1, len(x.shape)))
        y = b.node(
            "Unsqueeze",
            [x.name, b.ints([axis], "axes")],
            (*x.shape[:axis], 1, *x.shape[axis:]),
            exact=x.exact,
        )
        return b.node("Squeeze", [y.name, b.ints([axis], "axes")], x.shape, exact=x.exact)
    b.focus = x
    return cast(b)


def nhwc_region(b: Builder) -> Value | None:
    """Transpose to NHWC, a few layout-agnostic operators, Transpose back (or not)."""
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    n, c, h, w = x.shape
    t = b.node("Transpose", [x.name], (n, h, w, c), exact=x.exact, perm=[0, 2, 3, 1])
    ops = [binary_const, unary, pad, reduce_, concat, split, slice_, binary_values]
    for _ in range(b.draw(st.integers(1, 3))):
        b.focus = t
        t = b.draw(st.sampled_from(ops))(b) or t
        if len(t.shape) != 4:
            return t
    if b.draw(st.integers(0, 3)) == 0:
        return t
    n, h, w, c = t.shape
    return b.node("Transpose", [t.name], (n, c, h, w), exact=t.exact, perm=[0, 3, 1, 2])


def nhwc_sandwich(b: Builder) -> Value | None:
    """Transpose to NHWC, per-channel work, Transpose back (the layout pass's target)."""
    x = b.pick(lambda r: r == 4)
    if x is None:
        return None
    n, c, h, w = x.shape
    t = b.node("Transpose", [x.name], (n, h, w, c), exact=x.exact, perm=[0, 2, 3, 1])
    for _ in range(b.draw(st.integers(1, 2))):
        t = binary_const(b, t, b.draw(st.sampled_from(["Mul", "Add"])), (c,))
    if b.draw(st.booleans()):
        t = b.node("Relu", [t.name], t.shape)
    return b.node("Transpose", [t.name], (n, c, h, w), perm=[0, 3, 1, 2])


SINGLE = [
    conv, batchnorm, matmul, gemm, binary_const, binary_values, unary, transpose, reshape,
    flatten, unsqueeze, squeeze, concat, split, slice_, pad, cast, reduce_, pool, qdq,
]  # fmt: skip
MOTIFS = [
    conv_bn, pad_conv, matmul_bias, conv_affine, bn_small_ops, softmax_parts, layernorm_parts,
    gelu_parts, sibling_convs, conv_fc, nhwc_sandwich, affine_conv, shape_arith, const_expr,
    redundant_chain, nhwc_region,
]  # fmt: skip


def rms_parts(b: Builder) -> Value | None:
    return layernorm_parts(b, rms=True)


MOTIFS.append(rms_parts)


def value_info(name: str, shape, dynamic_dims: set[int]) -> onnx.ValueInfoProto:
    dims: list[int | str] = [f"d{i}" if i in dynamic_dims else d for i, d in enumerate(shape)]
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


@st.composite
def graphs(draw, max_steps: int = 16) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A random valid model and the seeded feeds to run it with."""
    opset = draw(st.sampled_from(OPSETS))
    dynamic = draw(st.booleans())
    b = Builder(draw, opset, dynamic)
    image = draw(st.booleans())
    n = draw(st.integers(1, 2))
    if image:
        shape = (n, draw(st.sampled_from([1, 2, 3, 4, 6])), draw(st.integers(1, 7)),
                 draw(st.integers(1, 7)))  # fmt: skip
    else:
        shape = (n, *draw(st.lists(st.integers(1, 8), min_size=1, max_size=2)))
    x = Value("x", shape, exact=True)
    b.inputs.append(x)
    b.values.append(x)
    if draw(st.integers(0, 3)) == 0:  # a second input of the same shape
        y = Value("y", shape, exact=True)
        b.inputs.append(y)
        b.values.append(y)
    steps = draw(st.integers(1, max_steps))
    for _ in range(steps):
        table = MOTIFS if draw(st.integers(0, 2)) == 0 else SINGLE
        op = draw(st.sampled_from(table))
        op(b)
    produced = [v for v in b.values if v not in b.inputs]
    if not produced:
        produced = [b.node("Relu", [x.name], x.shape)]
    # every leaf is an output (so no node is dead), plus now and then an inner value
    used = {name for node in b.nodes for name in node.input}
    outputs = [v for v in produced if v.name not in used] or [produced[-1]]
    outputs += [v for v in produced if v not in outputs and draw(st.integers(0, 5)) == 0][:2]
    dynamic_dims = {0} if dynamic else set()
    if dynamic and draw(st.booleans()):
        dynamic_dims |= {len(shape) - 1}  # a symbolic inner dim too
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in b.inputs}
    # now and then a float constant is also a graph input (a default the caller may
    # override): no pass may fold it, and the feeds override it with other values
    overridable = []
    if draw(st.integers(0, 3)) == 0:
        floats = [t for t in b.inits if t.data_type == TensorProto.FLOAT]
        for t in (
            draw(st.lists(st.sampled_from(floats), max_size=2, unique_by=lambda t: t.name))
            if floats
            else []
        ):
            value = numpy_helper.to_array(t)
            feeds[t.name] = (value * rng.uniform(0.5, 1.5, value.shape)).astype(np.float32)
            overridable.append(value_info(t.name, value.shape, set()))
    graph = helper.make_graph(
        b.nodes,
        "fuzz",
        [value_info(v.name, v.shape, dynamic_dims) for v in b.inputs] + overridable,
        [
            helper.make_tensor_value_info(
                v.name, TensorProto.FLOAT, [f"{v.name}_{i}" for i in range(len(v.shape))]
            )
            if dynamic
            else value_info(v.name, v.shape, set())
            for v in outputs
        ],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset <= 21 else 11
    return model, feeds
