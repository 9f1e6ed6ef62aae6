"""Shape and dtype inference with onnx's C++ inference, merged back by value name.

onnx-ir's ShapeInferencePass deserializes the whole inferred model and merges it; on a
9,000-node model that costs seconds per call. Reading only the inferred ValueInfo protos
of the main graph keeps it to one serialization plus a linear walk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from opfuse.errors import OpfuseError
from opfuse.model.graphs import all_graphs, proto_graphs
from opfuse.model.set_aside import has_set_aside, to_proto


def _onnx_ir_c_api() -> (
    Callable[[Callable[[onnx.ModelProto], onnx.ModelProto], ir.Model], onnx.ModelProto] | None
):
    """onnx-ir's helper that strips large initializers before calling onnx's C API (None
    in an onnx-ir without it)."""
    try:
        from onnx_ir.passes.common._c_api_utils import call_onnx_api
    except ImportError:  # pragma: no cover - older or newer onnx-ir
        return None
    return call_onnx_api


call_onnx_api = _onnx_ir_c_api()

logger = logging.getLogger(__name__)


BIG_TENSOR_BYTES = 1000  # initializers above this go to inference as typed inputs only


def infer_proto(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with inferred value_info (the loader's first inference: no IR round
    trip); on failure, ``proto`` as it was.

    onnx's inference copies the whole model into C++ and back; the weights would make
    that most of its cost, so large initializers take part as typed graph inputs (as
    onnx-ir's ``call_onnx_api`` does) and are put back afterwards."""
    graph = proto.graph
    big = {t.name for t in graph.initializer if _is_big(t)}
    light = _without_initializers(proto, big)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError, RuntimeError, ValueError
        logger.info("shape inference failed, shapes left as they are: %s", exc)
        return proto
    if big:
        del inferred.graph.input[len(graph.input) :]
        del inferred.graph.initializer[:]
        inferred.graph.initializer.extend(graph.initializer)
    return inferred


def _is_big(tensor: onnx.TensorProto) -> bool:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return True
    return tensor.ByteSize() > BIG_TENSOR_BYTES


def _without_initializers(proto: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers in ``names`` are typed graph inputs instead
    (the weights' bytes are not copied)."""
    if not names:
        return proto
    light = onnx.ModelProto()
    for field, value in proto.ListFields():
        if field.name != "graph":
            _copy_field(light, field, value)
    graph = light.graph
    for field, value in proto.graph.ListFields():
        if field.name != "initializer":
            _copy_field(graph, field, value)
    for tensor in proto.graph.initializer:
        if tensor.name not in names:
            graph.initializer.append(tensor)
        else:
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
    return light


def _copy_field(target: Message, field: FieldDescriptor, value: Any) -> None:
    repeated = (
        field.is_repeated
        if hasattr(field, "is_repeated")  # protobuf >= 5.29; older ones have only label
        else field.label == field.LABEL_REPEATED
    )
    if repeated:
        getattr(target, field.name).extend(value)
    elif field.type == field.TYPE_MESSAGE:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def infer_shapes(model: ir.Model) -> int:
    """Fill missing or partial shapes and dtypes of the graph's values (subgraphs too)
    in place; return how many values it told more of.

    Inference failures (custom ops, invalid partial graphs) leave the model as it was.
    """

    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)

    try:
        if has_set_aside(model):  # onnx crashes on the inputs whose types were set aside
            inferred = infer(to_proto(model))
        elif call_onnx_api is not None:
            inferred = call_onnx_api(infer, model)
        else:
            inferred = infer(ir.to_proto(model))
    except Exception as exc:  # onnx raises InferenceError, RuntimeError, ValueError
        logger.info("shape inference failed, shapes left as they are: %s", exc)
        return 0
    values: dict[str, ir.Value] = {}
    for graph in all_graphs(model.graph):
        for node in graph:
            for out in node.outputs:
                if out.name:
                    values[out.name] = out
    told = 0
    for info in _value_infos(inferred.graph):
        value = values.get(info.name)
        if value is None or not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        more = False
        if tensor_type.elem_type and value.dtype is None:
            value.dtype = ir.DataType(tensor_type.elem_type)
            more = True
        if tensor_type.HasField("shape") and _may_know_more(tensor_type.shape, value.shape):
            shape = ir.serde.deserialize_type_proto_for_shape(info.type)
            if shape is not None:
                value.shape = shape
                more = True
        told += more
    return told


def _value_infos(graph: onnx.GraphProto):
    """The inferred ValueInfos of a graph and of its If/Loop/Scan bodies (names are
    unique across scopes in a valid model)."""
    for g in proto_graphs(graph):
        yield from g.value_info
        yield from g.output


def _may_know_more(inferred: onnx.TensorShapeProto, shape: ir.Shape | None) -> bool:
    """Whether the inferred shape knows more integer dims than ``shape``, counted on the
    protobuf without building an ir.Shape (most values are already as known)."""
    if shape is None:
        return True
    dims = inferred.dim
    if len(dims) != len(shape):
        return False
    known = sum(1 for d in dims if d.HasField("dim_value"))
    return known > sum(1 for d in shape if isinstance(d, int))


def negative_dims_dynamic(proto: onnx.ModelProto) -> int:
    """Clear every negative ``dim_value`` of the declared values (graph inputs, outputs,
    value_info, in every graph): ``-1`` is the old exporters' "dynamic" (Paddle's), which
    onnxruntime reads as an unknown dim; kept as a number it would be a fixed dim of -1 to
    shape inference and the rules (a Shape folded to ``[-1, ...]``). How many were cleared."""
    cleared = 0
    for graph in proto_graphs(proto.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            t = value.type
            if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
                continue
            for d in t.tensor_type.shape.dim:
                if d.HasField("dim_value") and d.dim_value < 0:
                    d.ClearField("dim_value")
                    cleared += 1
    return cleared


def declare_static_inputs(model: ir.Model, shapes: dict[str, list[int]]) -> None:
    """Re-declare graph inputs with the given dims (``--static-shapes``): every dim the
    model fixes must be kept, the rank too. Shape inference then knows every dim and the
    shape arithmetic folds; the model only accepts those shapes afterwards."""
    inputs = {v.name or "": v for v in model.graph.inputs}
    for name, dims in shapes.items():
        value = inputs.get(name)
        if value is None:
            raise OpfuseError(
                f"--input-shape names {name!r}, which is not a model input ({', '.join(inputs)})"
            )
        declared = list(value.shape) if value.shape is not None else None
        given = f"--input-shape {name}:{','.join(map(str, dims))}"
        if declared is not None and len(declared) != len(dims):
            raise OpfuseError(f"{given}: input {name!r} has rank {len(declared)}")
        for i, (d, g) in enumerate(zip(declared or [], dims, strict=False)):
            if isinstance(d, int) and d >= 0 and d != g:  # -1: dynamic
                raise OpfuseError(f"{given}: input {name!r} has dim {i} fixed at {d}")
        value.shape = ir.Shape(dims)
    # intermediate shapes that name the old symbolic dims would contradict the new ones
    for graph in all_graphs(model.graph):
        for node in graph:
            for out in node.outputs:
                if out.shape is not None and not all(isinstance(d, int) for d in out.shape):
                    out.shape = None
