"""onnx-ir's deserialization, with the main graph's value_info read once per distinct type;
and what the input file described (``Declared``), whose shape annotations the writer keeps.

A model read after shape inference has a value_info for nearly every value (30,000 on
``bench/scale.py``'s transformer stack), and onnx-ir deserializes each one field by field:
a third of its time there. Most of them repeat a few thousand types, so the plain ones (a
tensor type, no doc string, no metadata) are taken out of the protobuf before onnx-ir reads
it and given to the node outputs they name afterwards, each distinct type deserialized once
by onnx-ir's own functions. Its shapes are frozen, so one shape object serves every value of
that type; each value gets a type object of its own (``Value.dtype`` assigns into it).

What onnx-ir reads in another order stays in the protobuf for it: the value_info of
initializers and graph outputs (the graph output's own type is applied after it), the
dynamo exporter's value_info of function values (named ``domain::function/value``), a name
given twice (onnx-ir reads the last entry only) and the empty name.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import onnx
import onnx_ir as ir

from opfuse.model.graphs import all_graphs, proto_graphs

_Cached = tuple[ir.TypeProtocol | None, ir.Shape | None]


def deserialize_model(proto: onnx.ModelProto) -> ir.Model:
    """``ir.serde.deserialize_model(proto)``, the same model; ``proto`` is left as it was."""
    graph = proto.graph
    if not graph.value_info:
        return ir.serde.deserialize_model(proto)
    for_onnx_ir = {t.name for t in graph.initializer} | {o.name for o in graph.output}
    infos = list(graph.value_info)
    names = Counter(info.name for info in infos)
    # a name given twice (onnx-ir reads the last entry only) or no name (an absent output)
    for_onnx_ir |= {name for name, n in names.items() if n > 1 or not name}
    kept: list[onnx.ValueInfoProto] = []
    taken: list[onnx.ValueInfoProto] = []
    for info in infos:
        name = info.name
        (kept if name in for_onnx_ir or "::" in name else taken).append(info)
    if not taken:
        return ir.serde.deserialize_model(proto)
    del graph.value_info[:]
    graph.value_info.extend(kept)
    try:
        model = ir.serde.deserialize_model(proto)
    finally:
        del graph.value_info[:]
        graph.value_info.extend(infos)
    _apply(model.graph, taken)
    return model


def _apply(graph: ir.Graph, infos: list[onnx.ValueInfoProto]) -> None:
    """What onnx-ir's ``deserialize_value_info_proto`` does for each node output named."""
    values = {out.name: out for node in graph for out in node.outputs}
    cache: dict[bytes, _Cached] = {}
    for info in infos:
        value = values.get(info.name)
        if value is None:
            continue  # a graph input's or an unknown name's: onnx-ir does not read it either
        type_proto = info.type
        if not type_proto.HasField("tensor_type") or info.doc_string or info.metadata_props:
            ir.serde.deserialize_value_info_proto(info, value)
            continue
        key = type_proto.SerializeToString()
        cached = cache.get(key)
        if cached is None:
            cached = (
                ir.serde.deserialize_type_proto_for_type(type_proto),
                ir.serde.deserialize_type_proto_for_shape(type_proto),
            )
            cache[key] = cached
        type_, shape = cached
        value.shape = shape  # frozen: shared safely
        value.type = (
            None if type_ is None else ir.TensorType(type_.dtype, denotation=type_.denotation)
        )


DECLARED_KEY = "opfuse.declared_value_info"


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the input file said of its intermediate values, by name, in every graph:
    the values it gave a value_info, and every node output it had. The writer keeps the
    shape annotations of the first (onnxruntime's fusions read them: SkipLayerNormalization
    fires only where both inputs of its Add have known, equal shapes, which a dynamo
    export's value_info gives and onnxruntime's own inference cannot derive past a
    computed Reshape), and gives the values the passes made theirs too when the input
    described any (``keeps``)."""

    described: frozenset[str]
    values: frozenset[str]

    @classmethod
    def of(cls, proto: onnx.ModelProto) -> Declared:
        described: set[str] = set()
        values: set[str] = set()
        for graph in proto_graphs(proto.graph):
            described.update(info.name for info in graph.value_info if info.name)
            values.update(out for node in graph.node for out in node.output if out)
        return cls(frozenset(described & values), frozenset(values))

    def keeps(self, name: str | None) -> bool:
        """Whether a node output of this name is written with its type and shape: the
        input described it, or it is new (a pass made it) in a model that described its
        values. A value the input left undescribed stays so."""
        if not name:
            return False
        if name in self.described:
            return True
        return bool(self.described) and name not in self.values


def remember_declared(model: ir.Model, proto: onnx.ModelProto) -> None:
    """Record on ``model`` (``model.meta``) what ``proto``, its input file, described."""
    model.meta[DECLARED_KEY] = Declared.of(proto)


def declared(model: ir.Model) -> Declared | None:
    """What the model's input file described (None: not read from a file by opfuse)."""
    found = model.meta.get(DECLARED_KEY)
    return found if isinstance(found, Declared) else None


def untyped_declared(model: ir.Model) -> list[str]:
    """The node outputs the input described that the model no longer knows the type or
    shape of (their value_info cannot be written), by name."""
    seen = declared(model)
    if seen is None or not seen.described:
        return []
    return [
        out.name
        for graph in all_graphs(model.graph)
        for node in graph
        for out in node.outputs
        if out.name in seen.described and out.type is None and out.shape is None
    ]


def described_kept(original: onnx.ModelProto, output: onnx.ModelProto) -> tuple[int, int]:
    """How many of the node outputs ``original`` described (a value_info with a tensor
    type) are still intermediate node outputs of ``output``, and how many of those
    ``output`` describes: the share of shape annotations an optimizer kept (every graph;
    a value that became a graph output or a constant says its type itself)."""

    def described(proto: onnx.ModelProto) -> tuple[set[str], set[str]]:
        typed: set[str] = set()
        intermediate: set[str] = set()
        for graph in proto_graphs(proto.graph):
            typed.update(v.name for v in graph.value_info if v.type.HasField("tensor_type"))
            outputs = {o.name for o in graph.output}
            intermediate.update(
                out for node in graph.node for out in node.output if out and out not in outputs
            )
        return typed & intermediate, intermediate

    before, _ = described(original)
    after, values = described(output)
    surviving = before & values
    return len(surviving), len(surviving & after)
