"""Dead-code removal: nodes nothing needs and unused initializers (mandatory)."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from opfuse.registry import PassInfo, register
from opfuse.rewrite import PassContext


def _count(model: ir.Model) -> tuple[int, int]:
    graphs = (model.graph, *model.graph.subgraphs())
    return sum(len(g) for g in graphs), sum(len(g.initializers) for g in graphs)


def remove_dead_code(ctx: PassContext) -> None:
    """Remove nodes whose outputs no graph output needs, and unused initializers."""
    nodes, inits = _count(ctx.model)
    RemoveUnusedNodesPass()(ctx.model)
    new_nodes, new_inits = _count(ctx.model)
    ctx.record("dead_nodes", nodes - new_nodes, nodes - new_nodes)
    ctx.record("unused_initializers", inits - new_inits, inits - new_inits)


register(
    PassInfo(
        "DeadCodeFusionPass",
        "Remove nodes no output needs and unused initializers",
        mandatory=True,
        run=remove_dead_code,
    )
)
