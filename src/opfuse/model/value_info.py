"""onnx-ir's deserialization, with the main graph's value_info read once per distinct type.

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

from collections import Counter

import onnx
import onnx_ir as ir

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
