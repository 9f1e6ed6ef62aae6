"""Common subexpressions and duplicate constants.

Identical initializers (same dtype and shape, then same hash, then same bytes) become one;
then nodes with the same op, attributes and inputs become one (onnx-ir's
CommonSubexpressionEliminationPass: one hash-keyed sweep in topological order, so chains of
duplicates merge in the same sweep). Both are linear in the size of the graph.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

import onnx_ir as ir
from onnx_ir.passes.common import CommonSubexpressionEliminationPass

from opfuse.registry import PassInfo, register
from opfuse.rewrite import PassContext
from opfuse.rewrite.pattern import const_array

CSE_CONSTANT_NODE_LIMIT = 64  # elements: Constant nodes up to this size are merged too


def _digest(value: ir.Value) -> tuple[str, bytes] | None:
    array = const_array(value)
    if array is None or array.dtype == object:
        return None
    data = array.tobytes()
    return hashlib.sha256(data).hexdigest(), data


def dedupe_initializers(graph: ir.Graph) -> int:
    """Make every reader of a duplicate initializer read the first copy; return how many
    duplicates were dropped. Only same-dtype same-shape groups are hashed."""
    groups: dict[tuple[object, tuple[object, ...]], list[ir.Value]] = defaultdict(list)
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is None or value.is_graph_input() or value.is_graph_output():
            continue
        groups[(tensor.dtype, tuple(tensor.shape))].append(value)
    dropped = 0
    for values in groups.values():
        if len(values) < 2:
            continue
        kept: dict[str, list[tuple[bytes, ir.Value]]] = defaultdict(list)
        for value in values:
            found = _digest(value)
            if found is None:
                continue
            digest, data = found
            same = next((k for b, k in kept[digest] if b == data), None)
            if same is None:
                kept[digest].append((data, value))
                continue
            value.replace_all_uses_with(same)
            assert value.name is not None
            graph.initializers.pop(value.name)
            dropped += 1
    return dropped


def eliminate_common_subexpressions(ctx: PassContext) -> None:
    dropped = sum(dedupe_initializers(g) for g in ctx.graphs())
    if dropped:
        ctx.record("duplicate_initializers", dropped, dropped)
    before = len(ctx.model.graph)  # onnx-ir's pass works on the main graph only
    CommonSubexpressionEliminationPass(size_limit=CSE_CONSTANT_NODE_LIMIT)(ctx.model)
    merged = before - len(ctx.model.graph)
    if merged:
        ctx.record("common_subexpression", merged, merged)


register(
    PassInfo(
        "CommonSubexpressionFusionPass",
        "Merge nodes with the same op, attributes and inputs; deduplicate identical "
        "initializers (hash first, bytes compared after)",
        run=eliminate_common_subexpressions,
    )
)
