"""Shape arithmetic on static dims, for models exported with dynamic dims.

    Shape(x)                 x's dims all static      ==> constant
    Gather(Shape(x), i)      the gathered dims static  ==> constant
    Slice(Shape(x), ...)     the sliced dims static    ==> constant
    Reshape(x, Concat(Unsqueeze(Gather(Shape(v), i)), ..., c))
                                                      ==> Reshape(x, constant)

The Reshape shape is rebuilt element by element: static dims become numbers, a dim that
copies x's dim at the same position becomes 0 (Reshape's "copy" with allowzero=0), and at
most one other run-time dim becomes -1. The last is exact unless the tensor is empty (a
run-time 0 with allowzero=0 copies the input dim where -1 cannot be inferred).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, Op, PassContext, Rule, Var
from opfuse.rewrite.builder import constant_value
from opfuse.rewrite.evaluate import EvaluationError, evaluate_op
from opfuse.rewrite.pattern import const_array
from opfuse.rules._util import DEFAULT_DOMAINS, attr

# an element of a shape vector: ("const", n) | ("dim", value, index) | ("unknown",)
Element = tuple


def _shape_dims(node: ir.Node) -> list[object] | None:
    """The dims a Shape node returns (ints or symbolic dims), or None when x's rank is
    unknown."""
    positions = _shape_positions(node)
    if positions is None:
        return None
    x = node.inputs[0]
    assert x is not None
    return [dim_of(x, i) for i in positions]


def _select(positions: list[int], op: str, arrays: list[np.ndarray | None], **attrs) -> list[int]:
    """Gather or Slice of a vector of positions, by the ONNX evaluator."""
    picked = evaluate_op(op, [np.array(positions, dtype=np.int64), *arrays], **attrs)
    return [int(p) for p in picked.reshape(-1)]


def _shape_positions(node: ir.Node) -> list[int] | None:
    """Positions into x's shape that a Shape node returns (its start and end slice them
    as Slice does)."""
    x = node.inputs[0]
    if x is None or x.shape is None:
        return None
    positions = list(range(len(x.shape)))
    start, end = attr(node, "start", 0), attr(node, "end", None)
    if start == 0 and end is None:
        return positions
    bounds: list[np.ndarray | None] = [
        np.array([start]),
        np.array([len(positions) if end is None else end]),
    ]
    try:
        return _select(positions, "Slice", bounds)
    except EvaluationError:
        return None


def _shape_producer(value: ir.Value | None) -> ir.Node | None:
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Shape" or node.domain not in DEFAULT_DOMAINS:
        return None
    return node


def _gathered_positions(node: ir.Node) -> tuple[ir.Node, list[int], bool] | None:
    """Gather(Shape(x), const) as (Shape node, positions into x's shape, scalar?)."""
    shape = _shape_producer(node.inputs[0])
    if shape is None or attr(node, "axis", 0) != 0 or len(node.inputs) < 2:
        return None
    idx = const_array(node.inputs[1])
    positions = _shape_positions(shape)
    if idx is None or positions is None or idx.ndim > 1 or idx.dtype.kind not in "iu":
        return None
    try:  # an index out of range fails here
        return shape, _select(positions, "Gather", [idx], axis=0), idx.ndim == 0
    except EvaluationError:
        return None


def _sliced_positions(node: ir.Node) -> tuple[ir.Node, list[int]] | None:
    """Slice(Shape(x), const starts, ends, axes, steps) as (Shape node, positions)."""
    shape = _shape_producer(node.inputs[0])
    if shape is None:
        return None
    positions = _shape_positions(shape)
    consts = [const_array(v) if v is not None else None for v in node.inputs[1:]]
    if (
        positions is None
        or len(consts) < 2
        or any(c is None for c, v in zip(consts, node.inputs[1:], strict=True) if v is not None)
    ):
        return None
    try:  # a bad axis or a zero step fails here
        return shape, _select(positions, "Slice", consts)
    except EvaluationError:
        return None


def dim_of(value: ir.Value, i: int, depth: int = 8) -> object:
    """Dim ``i`` of ``value``: its inferred dim, or, where inference lost it, the dim of a
    Slice's input on an axis the Slice does not touch (onnx's inference drops every dim
    of a Slice with run-time bounds)."""
    d = value.shape[i] if value.shape is not None and i < len(value.shape) else None
    if isinstance(d, int) or depth == 0:
        return d
    node = value.producer()
    if node is None or node.op_type != "Slice" or len(node.inputs) < 4 or node.inputs[0] is None:
        return d
    data, axes_value = node.inputs[0], node.inputs[3]
    axes = const_array(axes_value) if axes_value is not None else None
    r = len(data.shape) if data.shape is not None else None
    if axes is None or r is None or (value.shape is not None and len(value.shape) != r):
        return d
    if i in {int(a) % r for a in axes.reshape(-1)}:
        return d
    inner = dim_of(data, i, depth - 1)
    return inner if isinstance(inner, int) else d


def _static_positions(shape: ir.Node, positions: list[int]) -> list[int] | None:
    x = shape.inputs[0]
    assert x is not None and x.shape is not None
    dims = [dim_of(x, p) for p in positions]
    static = [d for d in dims if isinstance(d, int)]
    return static if len(static) == len(dims) else None


class ComputedMatch(Match):
    computed: np.ndarray  # the int64 constant the check worked out


class ShapeStaticRule(Rule):
    """Shape(x) with x's (selected) dims all static ==> constant"""

    name = "shape_static"
    pattern = Op("Shape", variadic=True)
    exclusive = False

    def check(self, m: Match, ctx: PassContext) -> str | None:
        dims = _shape_dims(m.root)
        if dims is None:
            return "input rank unknown"
        if not all(isinstance(d, int) for d in dims):
            return "input has dynamic dims"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):

        dims = np.array(_shape_dims(m.root), dtype=np.int64)
        return [constant_value(dims, b, m.root.outputs[0], m.root)]


class ShapeGatherRule(Rule[ComputedMatch]):
    """Gather(Shape(x), i) or Slice(Shape(x), ...) of static dims ==> constant"""

    name = "shape_gather"
    # the Shape is tested, not matched: it is not part of what the rewrite replaces
    pattern = Op(
        ("Gather", "Slice"),
        variadic=True,
        where=lambda n: _shape_producer(n.inputs[0] if n.inputs else None) is not None,
    )
    exclusive = False
    match_type = ComputedMatch

    def check(self, m: ComputedMatch, ctx: PassContext) -> str | None:
        node = m.root
        if node.op_type == "Gather":
            found = _gathered_positions(node)
            if found is None:
                return "indices are not constant or the rank is unknown"
            shape, positions, scalar = found
        else:
            sliced = _sliced_positions(node)
            if sliced is None:
                return "slice bounds are not constant or the rank is unknown"
            shape, positions = sliced
            scalar = False
        dims = _static_positions(shape, positions)
        if dims is None:
            return "the selected dims are dynamic"
        m.computed = np.array(dims[0] if scalar else dims, dtype=np.int64)
        return None

    def rewrite(self, m: ComputedMatch, b: Builder, ctx: PassContext):
        return [constant_value(m.computed, b, m.root.outputs[0], m.root)]


def _scalar_element(value: ir.Value) -> Element:
    array = const_array(value)
    if array is not None:
        return ("const", int(array.reshape(-1)[0])) if array.size == 1 else ("unknown",)
    node = value.producer()
    if node is not None and node.op_type == "Gather":
        found = _gathered_positions(node)
        if found is not None and len(found[1]) == 1:
            x = found[0].inputs[0]
            return ("dim", x, found[1][0])
    return ("unknown",)


def shape_elements(value: ir.Value) -> list[Element] | None:
    """The elements of a 1-D int64 shape vector, or None when its length is unknown."""
    array = const_array(value)
    if array is not None:
        return [("const", int(v)) for v in array.reshape(-1)]
    node = value.producer()
    if node is not None and node.domain in DEFAULT_DOMAINS:
        if node.op_type == "Concat" and attr(node, "axis", 0) in (0, -1):
            parts = [shape_elements(v) if v is not None else None for v in node.inputs]
            if all(p is not None for p in parts):
                return [e for p in parts for e in p or ()]
            return None
        if node.op_type == "Unsqueeze" and node.inputs[0] is not None:
            scalar = node.inputs[0]
            if scalar.shape is not None and len(scalar.shape) == 0:
                return [_scalar_element(scalar)]
        if node.op_type == "Shape":
            positions = _shape_positions(node)
            if positions is not None:
                return [("dim", node.inputs[0], p) for p in positions]
        if node.op_type == "Gather":
            found = _gathered_positions(node)
            if found is not None and not found[2]:
                return [("dim", found[0].inputs[0], p) for p in found[1]]
        if node.op_type == "Slice":
            sliced = _sliced_positions(node)
            if sliced is not None:
                return [("dim", sliced[0].inputs[0], p) for p in sliced[1]]
    if value.shape is not None and len(value.shape) == 1 and isinstance(value.shape[0], int):
        return [("unknown",)] * value.shape[0]
    return None


def _same_dim(v: ir.Value, i: int, x: ir.Value, j: int) -> bool:
    """Whether v's dim i is x's dim j: the same value, or the same named symbolic dim."""
    if x.shape is None or j >= len(x.shape):
        return False
    if v is x:
        return i == j
    if v.shape is None:
        return False
    a, b = v.shape[i], x.shape[j]
    return isinstance(a, ir.SymbolicDim) and a.value is not None and a == b


class ReshapeShapeChainRule(Rule[ComputedMatch]):
    """Reshape(x, Concat(Unsqueeze(Gather(Shape(x), i)), ..., c)) ==> Reshape(x, const)
    with 0 for dims copied from x, -1 for the one other run-time dim"""

    name = "reshape_shape_chain"
    # the shape is computed by a node (not a graph input), which is tested, not matched
    pattern = Op(
        "Reshape",
        Var("x"),
        Var("shape", constant=False),
        variadic=True,
        where=lambda n: (
            len(n.inputs) > 1 and n.inputs[1] is not None and n.inputs[1].producer() is not None
        ),
    )
    exclusive = False  # the shape arithmetic dies on its own once nothing reads it
    match_type = ComputedMatch

    def check(self, m: ComputedMatch, ctx: PassContext) -> str | None:
        node = m.root
        x, shape = node.inputs[0], node.inputs[1]
        assert x is not None and shape is not None
        if attr(node, "allowzero", 0):
            return "allowzero is set"
        elements = shape_elements(shape)
        if elements is None:
            return "shape length unknown"
        target: list[int] = []
        dynamic = 0
        for j, e in enumerate(elements):
            if e[0] == "const":
                target.append(e[1])
                dynamic += e[1] == -1
                continue
            if e[0] == "dim":
                v, i = e[1], e[2]
                d = dim_of(v, i)
                if isinstance(d, int):
                    target.append(d)
                    continue
                if _same_dim(v, i, x, j):
                    target.append(0)
                    continue
            target.append(-1)
            dynamic += 1
        if dynamic > 1:
            return "more than one dim is known only at run time"
        m.computed = np.array(target, dtype=np.int64)
        return None

    def rewrite(self, m: ComputedMatch, b: Builder, ctx: PassContext):
        shape = b.const(m.computed, f"{m.root.name or 'reshape'}_shape")
        x = m.root.inputs[0]
        attrs = {k: a.value for k, a in m.root.attributes.items()}  # allowzero=0 if set
        return [b.op("Reshape", [x, shape], attrs, like=m.root)]


SHAPE_RULES = (ShapeStaticRule(), ShapeGatherRule(), ReshapeShapeChainRule())
