"""Dead-code removal: nodes nothing needs and unused initializers (mandatory)."""

from __future__ import annotations

import contextlib

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from opfuse.rewrite import PassContext
from opfuse.rewrite.registry import PassInfo, register


def _initializers(graphs: list[ir.Graph]) -> int:
    return sum(len(g.initializers) for g in graphs)


def _release_removed(values: list[ir.Value]) -> None:
    """Unmap the external weights of removed initializers (a weight a fold replaced):
    their pages would otherwise stay in the process's memory until the model is freed."""
    for value in values:
        tensor = value.const_value
        if value.graph is None and isinstance(tensor, ir.ExternalTensor):
            with contextlib.suppress(BufferError):
                tensor.release()


def _slots(graphs: list[ir.Graph]) -> dict[int, tuple[int, int]]:
    return {id(n): (len(n.inputs), len(n.outputs)) for g in graphs for n in g}


def remove_dead_code(ctx: PassContext) -> None:
    """Remove nodes whose outputs no graph output needs, and unused initializers; onnx-ir's
    pass also drops the unused optional outputs and trailing absent inputs of the nodes it
    keeps (counted: two nodes can become alike for CSE)."""
    graphs = ctx.graphs()
    inits = _initializers(graphs)
    before = [v for g in graphs for v in g.initializers.values()]
    slots = _slots(graphs)  # its size is the node count
    RemoveUnusedNodesPass()(ctx.model)
    graphs = ctx.graphs()
    new_inits = _initializers(graphs)
    if new_inits < inits:
        _release_removed(before)
    after = _slots(graphs)
    trimmed = sum(1 for key, kept in after.items() if slots.get(key, kept) != kept)
    removed = len(slots) - len(after)
    ctx.record("dead_nodes", removed, removed)
    ctx.record("unused_initializers", inits - new_inits, inits - new_inits)
    ctx.record("unused_optional_slots", trimmed, trimmed)


register(
    PassInfo(
        "DeadCodeFusionPass",
        "Remove nodes no output needs and unused initializers",
        mandatory=True,
        run=remove_dead_code,
        # removals can leave nothing new to remove, and shapes do not decide what is dead
        reads=frozenset({"rewrites"}),
        removes_only=True,
        complete=True,  # in reverse order, subgraphs included: one walk removes every dead node
    )
)
