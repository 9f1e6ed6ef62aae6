"""What onnxruntime's static quantizer is given, so that it neither raises nor makes a
model onnxruntime cannot run, on models it was not written for (found by running
``opfuse quantize`` over onnx's conformance models: ``tests/quantize_conformance.py``).

- ``with_names``: every node named (``OP:first output``, unique as output names are),
  since the quantizer excludes nodes by name; ``without_names`` takes the invented
  names off its result, so the user's unnamed nodes stay unnamed.
- ``with_ir_for_initializers``: a model below IR 4 raised to it (its initializers
  need not be graph inputs, which the quantizer's scales are not).
- ``other_float_nodes``: the nodes that read or write float16, bfloat16 or double
  tensors. The quantizer is made for float32: on a float16 attention it makes a model
  whose types disagree (onnxruntime refuses it); those nodes stay in float.
- ``quantized_ops``: the ops that make a model already quantized (QDQ pairs, QLinear
  ops, integer kernels): the quantizer would quantize it again (duplicate node names,
  a model onnxruntime refuses); ``opfuse quantize`` asks for the float model instead.
- ``qdq_kernels_at``: whether onnxruntime has QuantizeLinear/DequantizeLinear kernels at
  the model's opset. onnxruntime 1.32 has none at opset 28, which the quantizer writes
  them at; the contrib-domain ones (``UseQDQContribOps``) run at any opset.
"""

from __future__ import annotations

import functools

import onnx

from opfuse.errors import OpfuseError
from opfuse.model.shapes import infer_proto
from opfuse.pipeline.opset import raise_ir_version

OTHER_FLOATS = frozenset(
    {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)
NAME_SEPARATOR = ":"  # OP:first output; a name taken already gets a trailing "_"


QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "ConvInteger",
        "MatMulInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QAttention",
        "DynamicQuantizeMatMul",
    }
)


def quantized_ops(model: onnx.ModelProto) -> str:
    """The quantized ops of the main graph, counted ("12 QuantizeLinear, 3 QLinearConv"),
    or '' for a float model. QLinear* ops of any domain count; a DequantizeLinear of a
    constant does not (int8 weights an exporter stores, read in float: weight-only
    quantization, whose activations the quantizer still quantizes), nor MatMulNBits."""
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    counts: dict[str, int] = {}
    for node in graph.node:
        weight_only = node.op_type == "DequantizeLinear" and node.input[0] in constants
        if weight_only or not (node.op_type in QUANTIZED_OPS or node.op_type.startswith("QLinear")):
            continue
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda c: -c[1]))


def with_names(model: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str]]:
    """``model`` with a name on each main-graph node without one, and those names;
    ``model`` itself when every node has a name."""
    unnamed = [i for i, n in enumerate(model.graph.node) if not n.name]
    if not unnamed:
        return model, set()
    named = onnx.ModelProto()
    named.CopyFrom(model)
    taken = {n.name for n in model.graph.node}
    invented = set()
    for i in unnamed:
        node = named.graph.node[i]
        name = f"{node.op_type}{NAME_SEPARATOR}{node.output[0] if node.output else i}"
        while name in taken:
            name += "_"
        node.name = name
        taken.add(name)
        invented.add(name)
    return named, invented


def made(invented: str) -> str:
    """The output an invented name (``OP:output``) was made from."""
    return invented.split(NAME_SEPARATOR, 1)[1]


def with_ir_for_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy at IR 4 or more when it is below: up to IR 3 every initializer
    must also be a graph input, so each scale and zero point the quantizer adds made the
    int8 model invalid (a torch export of IR 3 at opset 9 quantized per tensor; a converted
    opset raises the IR version itself: ``opset.raise_ir_version``)."""
    if model.ir_version >= 4:
        return model
    raised = onnx.ModelProto()
    raised.CopyFrom(model)
    raise_ir_version(raised)
    raised.ir_version = max(raised.ir_version, 4)
    return raised


def without_names(model: onnx.ModelProto, invented: set[str]) -> onnx.ModelProto:
    """``model`` with the ``invented`` node names taken off again (in place)."""
    for node in model.graph.node:
        if node.name in invented:
            node.name = ""
    return model


def other_float_nodes(model: onnx.ModelProto) -> list[str]:
    """The names of the main-graph nodes with an input or output of float16, bfloat16 or
    double (as shape inference types them), in graph order; nothing without a sign of
    such a type (no shape inference then)."""
    graph = model.graph
    declared = [*graph.input, *graph.output, *graph.value_info]
    signs = any(v.type.tensor_type.elem_type in OTHER_FLOATS for v in declared) or any(
        t.data_type in OTHER_FLOATS for t in graph.initializer
    )
    signs = signs or any(
        a.name == "to" and a.i in OTHER_FLOATS
        for n in graph.node
        if n.op_type == "Cast"
        for a in n.attribute
    )
    if not signs:
        return []
    typed = infer_proto(model).graph
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*typed.input, *typed.output, *typed.value_info]
    }
    types.update({t.name: t.data_type for t in typed.initializer})
    return [
        n.name
        for n in graph.node
        if any(types.get(t) in OTHER_FLOATS for t in [*n.input, *n.output] if t)
    ]


@functools.cache
def qdq_kernels_at(opset: int) -> bool:
    """Does onnxruntime run a uint8 QuantizeLinear/DequantizeLinear pair at ``opset``."""
    from onnx import helper

    from opfuse.model.sessions import open_session

    scale = helper.make_tensor("s", onnx.TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("z", onnx.TensorProto.UINT8, [], [128])
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
        [scale, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    raise_ir_version(model)
    try:
        open_session(model, graph_opt="off")
    except OpfuseError:  # no kernel at that opset
        return False
    return True
