"""Stripping the graph to the requested inputs and outputs (Grappler's strip_unused_nodes)."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from opfuse.errors import OpfuseError
from opfuse.rewrite import PassContext
from opfuse.rewrite.registry import PassInfo, register


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values: dict[str, ir.Value] = {v.name: v for v in graph.inputs if v.name}
    values.update({name: v for name, v in graph.initializers.items()})
    for node in graph:
        values.update({v.name: v for v in node.outputs if v.name})
    return values


def strip_unused(ctx: PassContext) -> None:
    """Keep only what the requested outputs need, fed from the requested inputs."""
    keep_in, keep_out = ctx.options.keep_inputs, ctx.options.keep_outputs
    if not keep_in and not keep_out:
        ctx.record("strip_unused_nodes")
        return
    graph = ctx.model.graph
    values = _values_by_name(graph)
    for name in (keep_in or []) + (keep_out or []):
        if name not in values:
            raise OpfuseError(
                f"tensor {name!r} given to --keep-inputs/--keep-outputs is not in the model"
            )
    before = len(graph)
    if keep_out:
        graph.outputs.clear()
        graph.outputs.extend(values[n] for n in keep_out)
    if keep_in:
        new_inputs: list[ir.Value] = []
        for name in keep_in:
            value = values[name]
            if value.is_graph_input():
                new_inputs.append(value)
                continue
            fresh = ir.Value(name=None, type=value.type, shape=value.shape)
            was_output = value.is_graph_output()
            value.replace_all_uses_with(fresh, replace_graph_outputs=True)
            value.name, fresh.name = None, name
            if was_output:
                pass  # the graph output now reads the new input directly
            new_inputs.append(fresh)
        old_inputs = [v for v in graph.inputs if v not in new_inputs]
        graph.inputs.clear()
        graph.inputs.extend(new_inputs)
        RemoveUnusedNodesPass()(ctx.model)
        for value in old_inputs:
            if value.uses():
                raise OpfuseError(
                    f"the requested outputs need input {value.name!r}, which --inputs leaves out"
                )
    RemoveUnusedNodesPass()(ctx.model)
    removed = before - len(graph)
    ctx.record("strip_unused_nodes", removed, removed)


register(
    PassInfo(
        "StripUnusedFusionPass",
        "Keep only the nodes the --keep-inputs/--keep-outputs need (Grappler's strip_unused_nodes)",
        run=strip_unused,
    )
)
