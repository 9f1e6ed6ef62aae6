"""Removal of operators that compute nothing: Identity, inference Dropout, and no-op
Cast, Reshape, Transpose, Slice, Expand, Pad, Concat and Split; chains of Casts,
Transposes and Reshapes merged, Squeeze/Unsqueeze pairs cancelled."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Const, Match, Op, Optional, Or, PassContext, Rule, Var
from opfuse.rewrite.builder import forward, needs_identity
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr, axes_of, perm_of, rank, static_shape

INT64_BIG = 2**31 - 1  # Slice ends at or past this cover any real dim


class IdentityRule(Rule):
    """Identity(x) ==> x"""

    name = "identity"
    pattern = Op("Identity", Var("x"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        if needs_identity(m.value("x"), m.root):
            return (
                "the output is a graph output and the input a graph input, initializer, "
                "graph output or a value of an enclosing graph"
            )
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [m.value("x")]


class DropoutRule(Rule):
    """Dropout(x) in inference mode ==> x (its mask output unused)"""

    name = "dropout"
    pattern = Op("Dropout", Var("x"), Optional(Var("ratio")), Optional(Var("training")))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        if "training" in m.values:
            training = const_array(m.values["training"])
            if training is None:
                return "training_mode is not a constant"
            if bool(training.reshape(-1)[0]):
                return "Dropout is in training mode"
        if attr(m.root, "is_test", 1) == 0 and ctx.opset < 7:
            return "Dropout is in training mode (is_test=0)"
        if len(m.root.outputs) > 1 and (
            m.root.outputs[1].uses() or m.root.outputs[1].is_graph_output()
        ):
            return "the Dropout mask is used"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class CastSameTypeRule(Rule):
    """Cast(x, to=dtype(x)) ==> x"""

    name = "cast_same_type"
    pattern = Op("Cast", Var("x"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.value("x").dtype
        if dtype is None:
            return "input dtype unknown"
        if dtype != ir.DataType(attr(m.root, "to")):
            return "Cast changes the dtype"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class ReshapeNoOpRule(Rule):
    """Reshape(x, shape) where the result has x's static shape ==> x"""

    name = "reshape_noop"
    pattern = Op("Reshape", Var("x"), Const("shape"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        shape_in = static_shape(m.value("x"))
        if shape_in is None:
            return "input shape not static"
        target = [int(d) for d in m["shape"].reshape(-1)]
        if len(target) != len(shape_in):
            return "Reshape changes the rank"
        allowzero = attr(m.root, "allowzero", 0)
        resolved = [shape_in[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
        known = [d for d in resolved if d != -1]
        if resolved.count(-1) == 1:
            # the -1 dim is what is left; it equals the input's when all others do
            same = all(d == s for d, s in zip(resolved, shape_in, strict=True) if d != -1)
            return None if same else "Reshape changes the shape"
        return None if known == list(shape_in) else "Reshape changes the shape"

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class TransposeNoOpRule(Rule):
    """Transpose with the identity permutation, or of a rank-1 tensor ==> x"""

    name = "transpose_noop"
    pattern = Op("Transpose", Var("x"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        perm = attr(m.root, "perm")
        if perm is None:
            shape = m.value("x").shape
            if shape is not None and len(shape) <= 1:
                return None
            return "default permutation reverses the axes"
        return None if list(perm) == sorted(perm) else "permutation is not the identity"

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class SliceNoOpRule(Rule):
    """Slice that keeps every element (starts 0, steps 1, ends past the dims) ==> x"""

    name = "slice_noop"
    pattern = Op(
        "Slice",
        Var("x"),
        Const("starts"),
        Const("ends"),
        Optional(Const("axes")),
        Optional(Const("steps")),
    )

    def check(self, m: Match, ctx: PassContext) -> str | None:
        starts = m["starts"].reshape(-1)
        ends = m["ends"].reshape(-1)
        shape = m.value("x").shape
        if shape is None:
            return "input rank unknown"
        axes = m.get("axes")
        axes = list(range(len(starts))) if axes is None else [int(a) for a in axes.reshape(-1)]
        steps = m.get("steps")
        steps = [1] * len(starts) if steps is None else [int(s) for s in steps.reshape(-1)]
        for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
            dim = shape[axis % len(shape)]
            if step != 1 or start != 0:
                return "Slice drops elements"
            if end >= INT64_BIG or (isinstance(dim, int) and end >= dim):
                continue
            return "Slice may drop elements"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class ExpandNoOpRule(Rule):
    """Expand(x, shape) where broadcasting leaves x's static shape ==> x"""

    name = "expand_noop"
    pattern = Op("Expand", Var("x"), Const("shape"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        shape_in = static_shape(m.value("x"))
        if shape_in is None:
            return "input shape not static"
        try:
            out = np.broadcast_shapes(shape_in, tuple(int(d) for d in m["shape"].reshape(-1)))
        except ValueError:
            return "shapes do not broadcast"
        return None if tuple(out) == shape_in else "Expand grows the tensor"

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class PadNoOpRule(Rule):
    """Pad with all pads zero ==> x"""

    name = "pad_noop"
    # the pads: an input since opset 11, an attribute before
    pattern = Or(
        Op("Pad", Var("x"), attrs={"pads": lambda p: p is not None}, variadic=True),
        Op("Pad", Var("x"), Var("pads"), variadic=True),
    )
    constants = ("pads",)

    def check(self, m: Match, ctx: PassContext) -> str | None:
        pads = m["pads"] if "pads" in m else m.root.attributes["pads"].value
        return None if not np.any(pads) else "pads are not zero"

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


class SingleInputRule(Rule):
    """Concat of one input, Split into one output ==> x"""

    name = "single_input"
    pattern = Or(
        Op(("Concat", "Sum", "Max", "Min", "Mean"), Var("x"), where=lambda n: len(n.inputs) == 1),
        Op("Split", Var("x"), variadic=True, where=lambda n: len(n.outputs) == 1),
    )

    def check(self, m: Match, ctx: PassContext) -> str | None:
        x, y = m.value("x"), m.root.outputs[0]
        if x.dtype is not None and y.dtype is not None and x.dtype != y.dtype:
            return "dtype differs"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


# every value of the first type is exactly a value of the second
LOSSLESS_CASTS: dict[ir.DataType, frozenset[ir.DataType]] = {
    k: frozenset(v)
    for k, v in {
        ir.DataType.BOOL: [
            ir.DataType.UINT8,
            ir.DataType.INT8,
            ir.DataType.UINT16,
            ir.DataType.INT16,
            ir.DataType.UINT32,
            ir.DataType.INT32,
            ir.DataType.UINT64,
            ir.DataType.INT64,
            ir.DataType.FLOAT16,
            ir.DataType.BFLOAT16,
            ir.DataType.FLOAT,
            ir.DataType.DOUBLE,
        ],
        ir.DataType.UINT8: [
            ir.DataType.UINT16,
            ir.DataType.INT16,
            ir.DataType.UINT32,
            ir.DataType.INT32,
            ir.DataType.UINT64,
            ir.DataType.INT64,
            ir.DataType.FLOAT16,
            ir.DataType.BFLOAT16,
            ir.DataType.FLOAT,
            ir.DataType.DOUBLE,
        ],
        ir.DataType.INT8: [
            ir.DataType.INT16,
            ir.DataType.INT32,
            ir.DataType.INT64,
            ir.DataType.FLOAT16,
            ir.DataType.BFLOAT16,
            ir.DataType.FLOAT,
            ir.DataType.DOUBLE,
        ],
        ir.DataType.UINT16: [
            ir.DataType.UINT32,
            ir.DataType.INT32,
            ir.DataType.UINT64,
            ir.DataType.INT64,
            ir.DataType.FLOAT,
            ir.DataType.DOUBLE,
        ],
        ir.DataType.INT16: [
            ir.DataType.INT32,
            ir.DataType.INT64,
            ir.DataType.FLOAT,
            ir.DataType.DOUBLE,
        ],
        ir.DataType.UINT32: [ir.DataType.UINT64, ir.DataType.INT64, ir.DataType.DOUBLE],
        ir.DataType.INT32: [ir.DataType.INT64, ir.DataType.DOUBLE],
        ir.DataType.FLOAT16: [ir.DataType.FLOAT, ir.DataType.DOUBLE],
        ir.DataType.BFLOAT16: [ir.DataType.FLOAT, ir.DataType.DOUBLE],
        ir.DataType.FLOAT: [ir.DataType.DOUBLE],
    }.items()
}


class CastChainRule(Rule):
    """Cast(Cast(x, T1), T2) where x's type converts to T1 losslessly ==> Cast(x, T2),
    or x when T2 is x's type (f32->f64->f32 goes; f32->f16->f32 rounds and stays)"""

    name = "cast_chain"
    pattern = Op("Cast", Op("Cast", Var("x"), name="inner"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dtype = m.value("x").dtype
        if dtype is None:
            return "input dtype unknown"
        middle = ir.DataType(m.attr("inner", "to"))
        if middle != dtype and middle not in LOSSLESS_CASTS.get(dtype, ()):
            return f"the first Cast ({dtype.name} to {middle.name}) loses information"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        x = m.value("x")
        if ir.DataType(attr(m.root, "to")) == x.dtype:
            return [forward(m, b, x)]
        attrs = {k: a.value for k, a in m.root.attributes.items()}
        return [b.op("Cast", [x], attrs, like=m.root)]


class TransposeChainRule(Rule):
    """Transpose(Transpose(x, p1), p2) ==> Transpose(x, p1[p2]), or x when that is the
    identity"""

    name = "transpose_chain"
    pattern = Op("Transpose", Op("Transpose", Var("x"), name="inner"))

    def check(self, m: Match, ctx: PassContext) -> str | None:
        r = rank(m.value("x"))
        for name in ("inner",):
            p = attr(m.node(name), "perm")
            r = len(p) if p is not None else r
        p = attr(m.root, "perm")
        r = len(p) if p is not None else r
        if perm_of(m.node("inner"), r) is None or perm_of(m.root, r) is None:
            return "default permutation of unknown rank"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        r = rank(m.value("x"))
        for node in (m.node("inner"), m.root):
            p = attr(node, "perm")
            r = len(p) if p is not None else r
        p1, p2 = perm_of(m.node("inner"), r), perm_of(m.root, r)
        assert p1 is not None and p2 is not None
        perm = [p1[i] for i in p2]
        if perm == sorted(perm):
            return [forward(m, b, m.value("x"))]
        return [b.op("Transpose", [m.value("x")], {"perm": perm}, like=m.root)]


class ReshapeChainRule(Rule):
    """Reshape(Reshape(x, s1), s2) ==> Reshape(x, s2) (a 0 in s2 that copies a dim of
    the middle tensor is resolved from its static shape)"""

    name = "reshape_chain"
    pattern = Op("Reshape", Op("Reshape", Var("x"), Var("s1"), name="inner"), Var("s2"))
    constants = ("s2",)

    def check(self, m: Match, ctx: PassContext) -> str | None:
        if self._target(m) is None:
            return "the outer shape copies a dim of the middle tensor that is not static"
        return None

    @staticmethod
    def _target(m: Match) -> list[int] | None:
        target = [int(d) for d in m["s2"].reshape(-1)]
        if attr(m.root, "allowzero", 0) or 0 not in target:
            return target
        middle = m.node("inner").outputs[0].shape
        for j, d in enumerate(target):
            if d == 0:
                dim = middle[j] if middle is not None and j < len(middle) else None
                if not isinstance(dim, int) or dim == 0:
                    return None
                target[j] = dim
        return target

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        target = self._target(m)
        shape = b.const(np.array(target, dtype=np.int64), f"{m.root.name or 'reshape'}_shape")
        attrs = {"allowzero": attr(m.root, "allowzero", 0)} if ctx.opset >= 14 else {}
        return [b.op("Reshape", [m.value("x"), shape], attrs, like=m.root)]


def _normalized(axes: list[int], r: int | None) -> set[int] | None:
    if r is None:
        return None if any(a < 0 for a in axes) else set(axes)
    return {a % r for a in axes} if r > 0 else set(axes)


class SqueezeUnsqueezeRule(Rule):
    """Squeeze(Unsqueeze(x, a), a) ==> x; Unsqueeze(Squeeze(x, a), a) ==> x"""

    name = "squeeze_unsqueeze"
    pattern = Op(
        ("Squeeze", "Unsqueeze"),
        Op(("Squeeze", "Unsqueeze"), Var("x"), Optional(Var("a1")), name="inner"),
        Optional(Var("a2")),
    )

    def check(self, m: Match, ctx: PassContext) -> str | None:
        inner = m.node("inner")
        if inner.op_type == m.root.op_type:
            return "both are " + inner.op_type
        x = m.value("x")
        a1, a2 = axes_of(inner), axes_of(m.root)
        if a2 is None:
            return "axes are not constant"
        r = rank(x)
        if inner.op_type == "Squeeze" and a1 is None:
            shape = static_shape(x)
            if shape is None:
                return "Squeeze without axes of a tensor whose shape is not static"
            a1 = [i for i, d in enumerate(shape) if d == 1]
        if a1 is None:
            return "axes are not constant"
        # the middle tensor's rank, against which both sets of axes are normalized
        middle = None if r is None else (r + len(a1) if inner.op_type == "Unsqueeze" else r)
        if inner.op_type == "Squeeze":
            n1, n2 = _normalized(a1, r), _normalized(a2, r)
        else:
            n1, n2 = _normalized(a1, middle), _normalized(a2, middle)
        if n1 is None or n2 is None:
            return "negative axes of unknown rank"
        return None if n1 == n2 else "the axes differ"

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [forward(m, b, m.value("x"))]


register(
    PassInfo(
        "IdentityRemovalFusionPass",
        "Remove Identity nodes (the output takes the input's place)",
        rules=(IdentityRule(),),
    )
)
register(
    PassInfo(
        "DropoutRemovalFusionPass",
        "Remove Dropout in inference mode (Grappler's remove training nodes)",
        rules=(DropoutRule(),),
    )
)
register(
    PassInfo(
        "NoOpRemovalFusionPass",
        "Remove no-op Cast, Reshape, Transpose, Slice, Expand, Pad, one-input Concat/Split/Sum",
        rules=(
            CastSameTypeRule(),
            ReshapeNoOpRule(),
            TransposeNoOpRule(),
            SliceNoOpRule(),
            ExpandNoOpRule(),
            PadNoOpRule(),
            SingleInputRule(),
        ),
    )
)
register(
    PassInfo(
        "RedundantChainFusionPass",
        "Merge Cast chains that round-trip losslessly, consecutive Transposes and Reshapes; "
        "cancel Squeeze/Unsqueeze pairs",
        rules=(CastChainRule(), TransposeChainRule(), ReshapeChainRule(), SqueezeUnsqueezeRule()),
    )
)
