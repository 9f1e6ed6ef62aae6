"""Constant folding: a node whose inputs are all constants becomes its value, computed by
the engine's evaluator (``opfuse.rewrite.evaluate``: onnx's reference evaluator, onnxruntime
when that fails), and Constant nodes become initializers. The shape rules of _shape_arith
run in the same pass.

Size rule: a fold whose result is no larger than the constant inputs only it reads (which
go with it) always happens (a transposed weight); otherwise the result must fit
``--fold-size-limit`` and grow the model by at most FOLD_GROWTH_ALLOWANCE (4 KiB) bytes.
The result is sized before it is evaluated (inferred shapes, else onnx's shape inference
on the constant inputs), so a result refused for its size is never built; an op whose
output size is set by input values (Expand, Tile, Range, ConstantOfShape, Pad, ...) is
not evaluated at all when its size cannot be inferred.

Never folded: nondeterministic ops (Random*, Multinomial, Bernoulli, Dropout that may be
in training mode: the set CSE never merges either), DequantizeLinear
(folding it would store quantized weights as floats, four times the size), ops with
subgraphs that read non-constant values from the enclosing graph.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import onnx
import onnx_ir as ir

from opfuse.model.constants import SHARED_CONSTANT_BYTES
from opfuse.model.graphs import all_graphs, node_graphs
from opfuse.rewrite import Builder, Match, Op, PassContext, Rule
from opfuse.rewrite.builder import constant_value
from opfuse.rewrite.evaluate import EvaluationError, evaluate, output_bytes
from opfuse.rewrite.pattern import const_array, use_count
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._shape_arith import SHAPE_RULES
from opfuse.rules._util import FOLD_GROWTH_ALLOWANCE, nondeterministic

# ops whose output size is set by input values, not input shapes: never evaluated before
# shape inference has sized their result
# fmt: off
SIZED_BY_VALUES = frozenset({
    "BlackmanWindow", "CenterCropPad", "Col2Im", "ConstantOfShape", "DFT", "Expand",
    "HammingWindow", "HannWindow", "MaxUnpool", "MelWeightMatrix", "OneHot", "Pad", "Range",
    "Resize", "STFT", "Tile", "Upsample",
})
# fmt: on

# ops whose output has as many elements as their first input: sized without inference
# fmt: off
ELEMENTS_KEPT = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Cast",
    "CastLike", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp", "Flatten", "Floor",
    "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log",
    "LogSoftmax", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Reshape", "Round", "Selu",
    "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Squeeze",
    "Tan", "Tanh", "ThresholdedRelu", "Transpose", "Unsqueeze",
})
# fmt: on

NEVER_FOLD = {  # besides the nondeterministic ops (_util.NONDETERMINISTIC, Dropout)
    "DequantizeLinear": "DequantizeLinear of a constant stays (quantized weights stay small)",
}


@cache
def foldable_op_types() -> tuple[str, ...]:
    """Every default-domain op type except Constant (its own rule)."""
    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    return tuple(sorted(names - {"Constant"}))


def _outer_values(node: ir.Node) -> list[ir.Value]:
    """Values of enclosing graphs that the node's subgraphs read (implicit inputs)."""
    inner: set[int] = set()
    used: list[ir.Value] = []
    for graph in node_graphs(node):
        for sub in all_graphs(graph):
            inner.update(id(v) for v in sub.inputs)
            inner.update(id(v) for v in sub.initializers.values())
            for n in sub:
                inner.update(id(v) for v in n.outputs)
                used.extend(v for v in n.inputs if v is not None)
    seen: set[int] = set()
    outer = []
    for v in used:
        if id(v) not in inner and id(v) not in seen:
            seen.add(id(v))
            outer.append(v)
    return outer


def _freed_bytes(node: ir.Node, arrays: list[np.ndarray | None]) -> int:
    """Bytes of the constant inputs that only this node reads (folding drops them). A
    constant of at most SHARED_CONSTANT_BYTES counts for each reader: the loader and the
    rewrites share equal ones, so how many read it says nothing of the copies it stands
    for."""
    total = 0
    seen: set[int] = set()
    for v, array in zip(node.inputs, arrays, strict=True):
        if v is None or array is None or id(v) in seen:
            continue
        seen.add(id(v))
        if v.is_graph_output():
            continue
        if array.nbytes <= SHARED_CONSTANT_BYTES:
            total += array.nbytes
            continue
        # only this node reads it: its reads are all the value's uses (counted, not listed)
        if use_count(v) == sum(1 for x in node.inputs if x is v):
            total += array.nbytes
    return total


def _static_bytes(value: ir.Value) -> int | None:
    if value.shape is None or value.dtype is None:
        return None
    dims = [d for d in value.shape.dims if isinstance(d, int)]
    if len(dims) != len(value.shape):
        return None
    return math.ceil(math.prod(dims) * value.dtype.itemsize)


def _kept_bytes(node: ir.Node, arrays: list[np.ndarray | None]) -> int | None:
    """The output bytes of an op that keeps its first input's element count."""
    if node.op_type not in ELEMENTS_KEPT or len(node.outputs) != 1 or not arrays:
        return None
    first, out = arrays[0], node.outputs[0]
    if first is None:
        return None
    itemsize = out.dtype.itemsize if out.dtype is not None else 8
    return int(np.ceil(first.size * itemsize))


class FoldMatch(Match):
    arrays: list[np.ndarray | None]
    results: list[np.ndarray]


class ConstantNodeRule(Rule):
    """Constant node ==> initializer (what onnxsim and onnxslim do too)"""

    name = "constant_node"
    # a graph output stays a node: it cannot be an initializer
    pattern = Op("Constant", where=lambda node: not node.outputs[0].is_graph_output())

    def check(self, m: Match, ctx: PassContext) -> str | None:
        if (ctx.model.ir_version or 0) < 4:
            return "IR version below 4: initializers must also be graph inputs"
        if _dense_tensor(m.root) is None and const_array(m.root.outputs[0]) is None:
            return "sparse or unreadable Constant"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        name = m.root.outputs[0].name or "constant"
        tensor = _dense_tensor(m.root)
        if tensor is not None:  # the attribute's tensor itself: no numpy round trip
            return [b.const_tensor(tensor, name)]
        array = const_array(m.root.outputs[0])
        assert array is not None
        return [b.const(array, name)]


def _dense_tensor(node: ir.Node) -> ir.TensorProtocol | None:
    """The tensor of a Constant's ``value`` attribute (other forms: None)."""
    attr = node.attributes.get("value")
    if len(node.attributes) != 1 or attr is None or attr.type != ir.AttributeType.TENSOR:
        return None
    return attr.value


class FoldRule(Rule[FoldMatch]):
    """op(c1, c2, ...) ==> its value, evaluated by onnx's reference evaluator"""

    name = "fold"
    exclusive = False  # the constant inputs may have other readers; they stay for them

    def root_types(self) -> tuple[str, ...]:
        return foldable_op_types()

    # imperative: any op type (the whole default domain) whose present inputs are all
    # constant, whatever its arity; the arrays read here are the check's inputs
    def match(self, node: ir.Node, ctx: PassContext) -> FoldMatch | None:
        arrays: list[np.ndarray | None] = []
        for v in node.inputs:
            if v is None:
                arrays.append(None)
                continue
            array = const_array(v)
            if array is None:
                return None
            arrays.append(array)
        m = FoldMatch(node)
        m.nodes.append(node)
        m.arrays = arrays
        return m

    def check(self, m: FoldMatch, ctx: PassContext) -> str | None:
        node = m.root
        random = nondeterministic(node, ctx.opset)
        if random:
            return random
        if node.op_type in NEVER_FOLD:
            return NEVER_FOLD[node.op_type]
        if node_graphs(node) and any(const_array(v) is None for v in _outer_values(node)):
            return "a subgraph reads non-constant values"
        limit = ctx.options.fold_size_limit
        freed = _freed_bytes(node, m.arrays)
        sizes = [_static_bytes(out) for out in node.outputs]
        if all(s is not None for s in sizes):
            size: int | None = sum(s or 0 for s in sizes)
        else:  # sized before evaluating: a huge result is refused before it is built
            size = _kept_bytes(node, m.arrays)
            if size is None:
                size = output_bytes(node, m.arrays, ctx.model)
        if size is not None:
            reason = _size_reason(size, freed, limit)
            if reason:
                return reason
        elif node.op_type in SIZED_BY_VALUES:
            return "result size unknown before evaluation"
        try:
            m.results = evaluate(node, m.arrays, ctx.model, _outer_arrays(node))
        except EvaluationError as exc:
            return f"cannot evaluate: {exc}"
        return _size_reason(sum(r.nbytes for r in m.results), freed, limit)

    def rewrite(self, m: FoldMatch, b: Builder, ctx: PassContext):
        return [
            constant_value(r, b, out, m.root) if (out.uses() or out.is_graph_output()) else None
            for r, out in zip(m.results, m.root.outputs, strict=True)
        ]


def _outer_arrays(node: ir.Node) -> dict[str, np.ndarray]:
    arrays = {}
    for v in _outer_values(node):
        array = const_array(v)
        if array is not None and v.name:
            arrays[v.name] = array
    return arrays


def _size_reason(out_bytes: int, freed: int, limit: int) -> str | None:
    """Fold when the result is no larger than the constant inputs it frees, or when it
    fits --fold-size-limit and grows the model by at most FOLD_GROWTH_ALLOWANCE bytes."""
    if out_bytes <= freed:
        return None
    if out_bytes > limit:
        return f"result of {out_bytes} bytes exceeds --fold-size-limit {limit}"
    if out_bytes - freed > FOLD_GROWTH_ALLOWANCE:
        return (
            f"result of {out_bytes} bytes would grow the model by {out_bytes - freed} bytes "
            f"(more than {FOLD_GROWTH_ALLOWANCE})"
        )
    return None


register(
    PassInfo(
        "ConstantFoldingFusionPass",
        "Replace nodes whose inputs are all constants by their value (onnx reference "
        "evaluator); Constant nodes become initializers; Shape arithmetic on static dims "
        "folds and Shape->Gather->Unsqueeze->Concat->Reshape chains become a constant shape",
        rules=(ConstantNodeRule(), FoldRule(), *SHAPE_RULES),
        note="Size rule (a fold never makes the model meaningfully bigger): a result no larger "
        "than the constant inputs only its node reads always folds; any other result must fit "
        "--fold-size-limit (default 1 MiB) and grow the model by at most 4 KiB per node; "
        "results are sized before they are evaluated. Never folded: Random*, Multinomial, "
        "Bernoulli, Dropout that may be in training mode, DequantizeLinear (keeps quantized "
        "weights small), ops whose subgraphs read non-constant values. A Reshape shape "
        "rebuilt with -1 differs from the original only on empty tensors.",
    )
)
