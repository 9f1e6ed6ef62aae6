"""Constant nodes lifted into initializers on the protobuf, before onnx-ir reads the model.

ConstantFoldingFusionPass's ``constant_node`` rule does the same one rewrite at a time. A
model exported by torch's legacy exporter, or built by stacking blocks, can hold tens of
thousands of them (10,327 of the 39,553 nodes of ``bench/scale.py``'s model); moving their
TensorProtos on the protobuf spares reading each node into onnx-ir and a driver rewrite
per node (0.4 s of 5.7 s there). The pipeline lifts only when that pass is on, and records
the lifts under the rule's name, so the effect log and the node counts read as if the rule
had made them. Only the rule's own case is taken here: a main-graph Constant holding a
``value`` tensor whose output is not a graph output, in a model of IR version 4 or later
(before, an initializer must also be a graph input); the rule takes every other Constant.

With ``merge`` (CommonSubexpressionFusionPass on too), a lifted tensor equal to one lifted
before it (the same dtype, dims and raw bytes, up to SHARED_CONSTANT_BYTES) is not added:
its readers read the first one, as that pass's duplicate_initializers would make them at
the end of the first round. A stack of identical blocks holds thousands of them (0.35 s of
4.6 s there). A name some subgraph declares too (a Loop body's input may reuse an outer
name) is never merged: a reader there may mean its own value.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from opfuse.model.graphs import DEFAULT_DOMAINS, proto_graphs

LIFTED_KEY = "opfuse.lifted_constants"  # model.meta: how many Constants the loader lifted
MERGED_KEY = "opfuse.merged_constants"  # model.meta: how many of them it merged
# equal constants up to this size are shared: merged at load, shared by the rewrites
# that make them (rewrite.builder.SharedConstants); folding counts one as freed by each
# reader, as it would its own copy
SHARED_CONSTANT_BYTES = 256


@dataclass(frozen=True)
class Lifted:
    constants: int  # Constant nodes lifted
    merged: int = 0  # of them, equal to one lifted before (its readers now read that one)


def lift_constants(proto: onnx.ModelProto, *, merge: bool = False) -> Lifted:
    """Move the main graph's plain Constant nodes into its initializers (each named after
    the Constant's output, node order kept otherwise); with ``merge``, equal ones become
    one initializer."""
    if proto.ir_version < 4:
        return Lifted(0)
    graph = proto.graph
    outputs = {o.name for o in graph.output}
    kept = []
    lifted = 0
    first: dict[tuple[int, tuple[int, ...], bytes], str] = {}
    renamed: dict[str, str] = {}
    apart = {a.tensor_name for a in graph.quantization_annotation}  # never merged
    nested = list(proto_graphs(graph))[1:] if merge else []  # subgraphs (none: flat)
    apart |= _declared_in(nested)
    for node in graph.node:
        if not _plain_constant(node) or node.output[0] in outputs:
            kept.append(node)
            continue
        lifted += 1
        name, tensor = node.output[0], node.attribute[0].t
        key = _merge_key(tensor) if merge and name not in apart else None
        if key is not None and first.setdefault(key, name) != name:
            renamed[name] = first[key]
            continue
        added = graph.initializer.add()
        added.CopyFrom(tensor)
        added.name = name
    if lifted:
        del graph.node[:]
        graph.node.extend(kept)
    if renamed:
        # the node list was rebuilt: its subgraphs are found again, when there are any
        _rename_readers(graph, list(proto_graphs(graph))[1:] if nested else [], renamed)
    return Lifted(lifted, len(renamed))


def _merge_key(tensor: onnx.TensorProto) -> tuple[int, tuple[int, ...], bytes] | None:
    """What makes two tensors equal for merging: raw bytes only (other encodings and
    external data are left to CommonSubexpressionFusionPass)."""
    if tensor.data_location != onnx.TensorProto.DEFAULT or not tensor.HasField("raw_data"):
        return None
    raw = tensor.raw_data
    return (
        (tensor.data_type, tuple(tensor.dims), raw) if len(raw) <= SHARED_CONSTANT_BYTES else None
    )


def _declared_in(subgraphs: list[onnx.GraphProto]) -> set[str]:
    """The names ``subgraphs`` declare: their inputs, initializers, outputs of their
    nodes."""
    names: set[str] = set()
    for sub in subgraphs:
        names.update(i.name for i in sub.input)
        names.update(t.name for t in sub.initializer)
        for node in sub.node:
            names.update(node.output)
    return names


def _rename_readers(
    graph: onnx.GraphProto, nested: list[onnx.GraphProto], renamed: dict[str, str]
) -> None:
    """Readers of the merged tensors read the kept ones (``nested``, the subgraphs, read
    outer names too); their value_info goes."""
    for g in (graph, *nested):
        for node in g.node:
            for i, name in enumerate(node.input):
                if name in renamed:
                    node.input[i] = renamed[name]
    infos = [info for info in graph.value_info if info.name not in renamed]
    if len(infos) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(infos)


def _plain_constant(node: onnx.NodeProto) -> bool:
    if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS:
        return False
    if len(node.attribute) != 1 or len(node.output) != 1 or not node.output[0]:
        return False
    attr = node.attribute[0]
    return attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR
