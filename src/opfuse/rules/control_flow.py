"""If nodes whose condition is a constant (or folds to one) are replaced by the branch
that runs: its nodes move into the enclosing graph, its initializers with them, and the
If's outputs become the branch's. Ifs inside the inlined branch are inlined in turn, so
a nest of constant conditions leaves no If. Exactly equivalent: the other branch never
runs."""

from __future__ import annotations

import onnx_ir as ir

from opfuse.model.graphs import all_graphs, node_graphs
from opfuse.rewrite import PassContext
from opfuse.rewrite.builder import NameScope
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import DEFAULT_DOMAINS

PATTERN = "if_constant_condition"


def _condition(node: ir.Node) -> bool | None:
    array = const_array(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    if array is None or array.size != 1:
        return None
    return bool(array.reshape(-1)[0])


def _inline(graph: ir.Graph, node: ir.Node, branch: ir.Graph, names: NameScope) -> list[ir.Node]:
    """Move ``branch`` into ``graph`` in place of the If ``node``; return the moved nodes."""
    moved = list(branch)
    for inner in moved:
        branch.remove(inner)
    graph.insert_before(node, moved)
    for name in list(branch.initializers):
        value = branch.initializers.pop(name)
        if name in graph.initializers:
            value.name = names.value(name)
        graph.register_initializer(value)
    results = list(branch.outputs)
    branch.outputs.clear()
    for out, result in zip(node.outputs, results, strict=True):
        out_name = out.name
        made_here = result.producer() is not None and result.producer() in moved
        if out.is_graph_output() and (not made_here or result.is_graph_output()):
            # a graph output must be made by a node of its graph, under its own name
            identity = ir.node("Identity", [result], num_outputs=1)
            graph.insert_before(node, identity)
            moved.append(identity)
            result = identity.outputs[0]
        out.replace_all_uses_with(result, replace_graph_outputs=True)
        if result.is_graph_output():
            out.name = None
            result.name = out_name
    graph.remove(node, safe=True)
    return moved


def _detach(branch: ir.Graph) -> None:
    """Drop the uses the branch that never runs (and the graphs in it) holds on outer
    values: left in place, a value the other branch also reads would look used twice, and
    single-use rules (constant push-down...) would not fire until the model was reloaded."""
    for graph in all_graphs(branch):
        for inner in graph:
            for i, value in enumerate(inner.inputs):
                if value is not None:
                    inner.replace_input_with(i, None)


def inline_constant_ifs(ctx: PassContext) -> None:
    names = NameScope(ctx.graphs())
    gone: set[int] = set()  # graphs of removed Ifs (by id): nothing left to do there
    for graph in ctx.graphs():
        if id(graph) in gone:
            continue
        todo = [n for n in graph if n.op_type == "If" and n.domain in DEFAULT_DOMAINS]
        while todo:
            node = todo.pop()
            ctx.record(PATTERN, matched=1)
            condition = _condition(node)
            if condition is None:
                ctx.reason(PATTERN, "the condition is not a constant", node)
                continue
            branch = node.attributes["then_branch" if condition else "else_branch"].value
            other = node.attributes["else_branch" if condition else "then_branch"].value
            _detach(other)
            gone.update(id(sub) for held in node_graphs(node) for sub in all_graphs(held))
            moved = _inline(graph, node, branch, names)
            ctx.record(PATTERN, effected=1)
            todo += [n for n in moved if n.op_type == "If" and n.domain in DEFAULT_DOMAINS]


register(
    PassInfo(
        "ConstantIfInlineFusionPass",
        "Replace an If whose condition is a constant by the branch that runs (recursively)",
        run=inline_constant_ifs,
    )
)
