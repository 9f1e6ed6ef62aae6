"""What onnx-ir cannot hold, set aside before a model is deserialized and put back when it
is written, so a valid model is never refused and never loses a part.

onnx-ir 1.x has no map types (skl2onnx's ZipMap outputs a sequence of maps) and no opaque
types; it drops sparse initializers and refuses a Constant's ``sparse_value``. Before
deserializing, ``set_aside`` takes them out of a copy of the proto:

- a graph input or output of such a type keeps its name and loses its type (the value
  stays in the graph, untyped, so no pass rewrites around it); its type is put back;
- a ``value_info`` of such a type is dropped, and put back while its value still exists;
- a sparse initializer, or a Constant's ``sparse_value``, becomes the dense tensor it
  stands for (exactly what a runtime computes from it), and becomes sparse again on the
  way out while it is still the same tensor. Over ``DENSE_LIMIT`` bytes dense (or a sparse
  attribute of another op), it is dropped from the copy and ``SetAside.unchanged`` says
  why: that model must be written as it was read, not from onnx-ir.

``notes`` says what was set aside and why, for the summary. ``from_proto`` and ``to_proto``
are onnx-ir's with this on both ways (the ``SetAside`` travels in ``model.meta``); onnx's
C++ shape inference and version converter must be given ``to_proto``'s whole model (an
input without its type crashes them).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper

from opfuse.model import value_info
from opfuse.model.graphs import proto_graphs

META_KEY = "opfuse.set_aside"
DENSE_LIMIT = 64 * 2**20  # bytes a sparse tensor may take once dense

_MAP_REASON = "onnx-ir holds no map types"
_OPAQUE_REASON = "onnx-ir holds no opaque or unknown types"


@dataclasses.dataclass
class SetAside:
    """The parts of a model kept out of onnx-ir, by value name."""

    types: dict[str, onnx.TypeProto] = dataclasses.field(default_factory=dict)
    value_info: dict[str, onnx.ValueInfoProto] = dataclasses.field(default_factory=dict)
    sparse: dict[str, onnx.SparseTensorProto] = dataclasses.field(default_factory=dict)
    dense: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    unchanged: str | None = None  # why the whole model must be written as it was

    def __bool__(self) -> bool:
        return bool(self.types or self.value_info or self.sparse or self.unchanged)


def _type_problem(type_proto: onnx.TypeProto) -> str | None:
    """Why onnx-ir cannot hold this type, or None."""
    case = type_proto.WhichOneof("value")
    if case == "map_type":
        return _MAP_REASON
    if case in ("sequence_type", "optional_type"):
        inner = getattr(type_proto, case)
        return _type_problem(inner.elem_type) if inner.HasField("elem_type") else None
    if case in ("tensor_type", "sparse_tensor_type", None):
        return None
    return _OPAQUE_REASON


def _describe(type_proto: onnx.TypeProto) -> str:
    """``seq(map(int64, tensor(float)))``: the type as onnx's operator docs write it."""
    case = type_proto.WhichOneof("value")
    if case in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, case)
        name = onnx.helper.tensor_dtype_to_string(inner.elem_type).removeprefix("TensorProto.")
        return f"{'tensor' if case == 'tensor_type' else 'sparse_tensor'}({name.lower()})"
    if case in ("sequence_type", "optional_type"):
        inner = getattr(type_proto, case)
        return (
            f"{case[:3] if case == 'sequence_type' else 'optional'}({_describe(inner.elem_type)})"
        )
    if case == "map_type":
        key = onnx.helper.tensor_dtype_to_string(type_proto.map_type.key_type)
        value = _describe(type_proto.map_type.value_type)
        return f"map({key.removeprefix('TensorProto.').lower()}, {value})"
    return case or "no type"


def needs_setting_aside(proto: onnx.ModelProto) -> bool:
    """Cheap check: does the model hold anything onnx-ir cannot (so a copy is needed)?"""
    sparse = onnx.AttributeProto.SPARSE_TENSOR
    for graph in proto_graphs(proto.graph):
        if graph.sparse_initializer:
            return True
        for infos in (graph.input, graph.output, graph.value_info):
            for info in infos:  # plain loops: this runs on every value of every model
                if not info.type.HasField("tensor_type") and _type_problem(info.type):
                    return True
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == sparse:
                    return True
    return False


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.size:
        if indices.ndim == 1:  # linearized indices
            dense.reshape(-1)[indices] = values
        else:  # one row of coordinates per value
            dense[tuple(indices.T)] = values
    return dense


def _placeholder(values: onnx.TensorProto, name: str) -> onnx.TensorProto:
    """One element of the right dtype, standing in for a tensor in a model that is only
    looked at (counted), never written (``SetAside.unchanged``)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(values.data_type)
    return numpy_helper.from_array(np.zeros(1, dtype), name)


def _dense_bytes(sparse: onnx.SparseTensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(sparse.values.data_type).itemsize
    return int(np.prod(sparse.dims, dtype=np.int64)) * itemsize


def set_aside(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, SetAside]:
    """A copy of ``proto`` onnx-ir can hold, and what was taken out (``proto`` itself is
    returned, uncopied, when there is nothing to set aside)."""
    aside = SetAside()
    if not needs_setting_aside(proto):
        return proto, aside
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for graph in proto_graphs(proto.graph):
        _set_aside_types(graph, aside)
        _set_aside_sparse(graph, aside)
    return proto, aside


def from_proto(proto: onnx.ModelProto) -> ir.Model:
    """``ir.from_proto``, with what onnx-ir cannot hold set aside in ``model.meta``."""
    proto, aside = set_aside(proto)
    model = value_info.deserialize_model(proto)
    if aside:
        model.meta[META_KEY] = aside
    return model


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """``ir.to_proto``, with what ``from_proto`` set aside put back."""
    proto = ir.to_proto(model)
    aside = model.meta.get(META_KEY)
    if aside:
        restore(proto, aside)
    return proto


def has_set_aside(model: ir.Model) -> bool:
    return bool(model.meta.get(META_KEY))


def _set_aside_types(graph: onnx.GraphProto, aside: SetAside) -> None:
    for kind, infos in (("input", graph.input), ("output", graph.output)):
        for info in infos:
            reason = _type_problem(info.type)
            if reason:
                aside.types[info.name] = onnx.TypeProto.FromString(info.type.SerializeToString())
                aside.notes.append(
                    f"{kind} {info.name!r} ({_describe(info.type)}): {reason}; passed through "
                    "as it is, nothing rewritten around it"
                )
                info.ClearField("type")
    kept = []
    for info in graph.value_info:
        if _type_problem(info.type):
            aside.value_info[info.name] = onnx.ValueInfoProto.FromString(info.SerializeToString())
        else:
            kept.append(info)
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _set_aside_sparse(graph: onnx.GraphProto, aside: SetAside) -> None:
    for sparse in list(graph.sparse_initializer):
        name = sparse.values.name
        if _dense_bytes(sparse) > DENSE_LIMIT:
            aside.unchanged = (
                f"sparse initializer {name!r} is {_dense_bytes(sparse) >> 20} MB dense; onnx-ir "
                "holds no sparse tensors"
            )
            graph.initializer.append(_placeholder(sparse.values, name))
            continue
        dense = _dense(sparse)
        graph.initializer.append(numpy_helper.from_array(dense, name))
        aside.sparse[name] = sparse
        aside.dense[name] = dense
        aside.notes.append(
            f"sparse initializer {name!r}: onnx-ir holds no sparse tensors; made dense for "
            "the passes, written sparse again while unchanged"
        )
    del graph.sparse_initializer[:]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type != onnx.AttributeProto.SPARSE_TENSOR:
                continue
            if node.op_type != "Constant" or _dense_bytes(attr.sparse_tensor) > DENSE_LIMIT:
                aside.unchanged = (
                    f"node {node.name!r} ({node.op_type}) has a sparse tensor attribute "
                    f"{attr.name!r} of {_dense_bytes(attr.sparse_tensor) >> 20} MB dense; "
                    "onnx-ir holds no sparse tensors"
                )
                placeholder = _placeholder(attr.sparse_tensor.values, attr.name)
                attr.CopyFrom(onnx.helper.make_attribute("value", placeholder))
                continue
            sparse = onnx.SparseTensorProto.FromString(attr.sparse_tensor.SerializeToString())
            dense = _dense(sparse)
            attr.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(dense)))
            aside.sparse[node.output[0]] = sparse
            aside.dense[node.output[0]] = dense
            aside.notes.append(
                f"Constant {node.name!r} (sparse_value): onnx-ir holds no sparse tensors; made "
                "dense for the passes, written sparse again while unchanged"
            )


def restore(proto: onnx.ModelProto, aside: SetAside) -> None:
    """Put back, in place, what ``set_aside`` took out and the model still has."""
    if not aside:
        return
    for graph in proto_graphs(proto.graph):
        for info in (*graph.input, *graph.output):
            if info.name in aside.types and not info.type.WhichOneof("value"):
                info.type.CopyFrom(aside.types[info.name])
        produced = {out for node in graph.node for out in node.output}
        have = {info.name for info in graph.value_info}
        for name, info in aside.value_info.items():
            if name in produced and name not in have:
                graph.value_info.append(info)
        _restore_sparse(graph, aside)


def _same(tensor: onnx.TensorProto, dense: np.ndarray) -> bool:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False
    array = numpy_helper.to_array(tensor)
    return (
        array.dtype == dense.dtype and array.shape == dense.shape and np.array_equal(array, dense)
    )


def _restore_sparse(graph: onnx.GraphProto, aside: SetAside) -> None:
    if not aside.sparse:
        return
    kept = []
    for init in graph.initializer:
        # by content: constant folding may have made a sparse Constant an initializer
        # under a new name
        names = [init.name] if init.name in aside.sparse else []
        names += [
            n
            for n in aside.sparse
            if n != init.name and tuple(init.dims) == tuple(aside.sparse[n].dims)
        ]
        same = next((n for n in names if _same(init, aside.dense[n])), None)
        if same is None:
            kept.append(init)
            continue
        sparse = onnx.SparseTensorProto.FromString(aside.sparse[same].SerializeToString())
        sparse.values.name = init.name
        graph.sparse_initializer.append(sparse)
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
    for node in graph.node:
        if node.op_type != "Constant" or not node.output or node.output[0] not in aside.sparse:
            continue
        name = node.output[0]
        values = [a for a in node.attribute if a.name == "value"]
        if len(node.attribute) == 1 and values and _same(values[0].t, aside.dense[name]):
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("sparse_value", aside.sparse[name]))
