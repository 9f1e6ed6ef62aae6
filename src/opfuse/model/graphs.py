"""Walking a model's graphs: the main graph and its If/Loop/Scan bodies.

onnx-ir's ``Graph.subgraphs()`` walks every node through a recursive generator per node;
the passes ask for the list of graphs many times per run, so a plain loop over node
attributes (the same order: outermost first, depth first) matters on large models.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir

DEFAULT_DOMAINS = ("", "ai.onnx")  # the ONNX operator set, under either of its names
# model metadata: the inputs --layout re-declared, as {name: perm}; the layout pass
# writes it, the verifier reads it to feed both models the same data
INPUT_PERMUTATION_KEY = "opfuse.input_permutation"

_GRAPH = ir.AttributeType.GRAPH
_GRAPHS = ir.AttributeType.GRAPHS


def node_graphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by ``node``'s attributes (If branches, a Loop or Scan body)."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == _GRAPH:
            graphs.append(attr.value)
        elif attr.type == _GRAPHS:
            graphs.extend(attr.value)
    return graphs


# the ONNX operators with graph attributes; other default-domain nodes hold none, so the
# walk reads only their op type (a custom-domain node may hold graphs: BeamSearch...)
_HOLDS_GRAPHS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def subgraphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """Every graph nested in ``graph`` (not ``graph`` itself), depth first."""
    for node in graph:
        if node.op_type not in _HOLDS_GRAPHS and node.domain in DEFAULT_DOMAINS:
            continue
        if not node.attributes:
            continue
        for sub in node_graphs(node):
            yield sub
            yield from subgraphs(sub)


def all_graphs(graph: ir.Graph) -> list[ir.Graph]:
    """``graph`` and every graph nested in it, outermost first."""
    return [graph, *subgraphs(graph)]


def proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in it (If/Loop/Scan bodies), on the protobuf."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from proto_graphs(attr.g)
            for sub in attr.graphs:
                yield from proto_graphs(sub)


def proto_wiring(
    graph: onnx.GraphProto,
) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """Each value's producer and each value's readers (in graph order) in one protobuf
    graph (not its subgraphs)."""
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    return producer, readers
