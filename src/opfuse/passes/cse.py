"""Common subexpressions and duplicate constants.

Identical initializers (same dtype and shape, then same hash, then same bytes) become one;
then nodes with the same op, attributes and inputs become one (onnx-ir's
CommonSubexpressionEliminationPass: one hash-keyed sweep in topological order, so chains of
duplicates merge in the same sweep). Both are linear in the size of the graph.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import defaultdict

import onnx_ir as ir
from onnx_ir.passes.common import CommonSubexpressionEliminationPass

from opfuse.registry import PassInfo, register
from opfuse.rewrite import PassContext
from opfuse.rewrite.pattern import const_array

CSE_CONSTANT_NODE_LIMIT = 64  # elements: Constant nodes up to this size are merged too


CHUNK = 1 << 24  # bytes hashed or compared at a time: large weights are never copied whole


def _chunks(value: ir.Value):
    """The constant's bytes in bounded chunks (a memory-mapped weight is not copied)."""
    array = const_array(value)
    if array is None or array.dtype == object:
        return None
    flat = array.reshape(-1)
    step = max(1, CHUNK // max(1, array.itemsize))
    return (flat[i : i + step].tobytes() for i in range(0, max(1, flat.size), step))


def _release(value: ir.Value) -> None:
    """Unmap an external weight once read, so its pages leave the process's memory."""
    tensor = value.const_value
    if isinstance(tensor, ir.ExternalTensor):
        with contextlib.suppress(BufferError):
            tensor.release()


def _digest(value: ir.Value) -> str | None:
    chunks = _chunks(value)
    if chunks is None:
        return None
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    del chunks
    _release(value)
    return h.hexdigest()


def _same_bytes(a: ir.Value, b: ir.Value) -> bool:
    ca, cb = _chunks(a), _chunks(b)
    same = ca is not None and cb is not None and all(x == y for x, y in zip(ca, cb, strict=True))
    del ca, cb
    _release(a)
    _release(b)
    return same


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
        kept: dict[str, list[ir.Value]] = defaultdict(list)
        for value in values:
            digest = _digest(value)
            if digest is None:
                continue
            same = next((k for k in kept[digest] if _same_bytes(k, value)), None)
            if same is None:
                kept[digest].append(value)
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
