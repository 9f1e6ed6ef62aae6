"""model.value_info: the main graph's value_info read once per distinct type gives the very
model onnx-ir's own deserialization gives, on built edge cases and on the ONNX suite."""

from __future__ import annotations

import contextlib

import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

import conformance
from opfuse.model.graphs import all_graphs
from opfuse.model.value_info import deserialize_model


def described(model: ir.Model) -> list[tuple[object, ...]]:
    """Every value of every graph with what a value_info can set on it."""
    seen = []
    for graph in all_graphs(model.graph):
        values = [*graph.inputs, *graph.initializers.values()]
        values += [out for node in graph for out in node.outputs]
        values += list(graph.outputs)
        for v in values:
            shape = None if v.shape is None else (tuple(v.shape), v.shape.frozen)
            denotation = getattr(v.type, "denotation", None)
            seen.append(
                (v.name, repr(v.type), denotation, shape, v.doc_string, dict(v.metadata_props))
            )
    return seen


def same_as_onnx_ir(proto: onnx.ModelProto) -> ir.Model:
    before = proto.SerializeToString()
    ours = deserialize_model(proto)
    assert proto.SerializeToString() == before  # the protobuf is left as it was
    assert described(ours) == described(ir.serde.deserialize_model(proto))
    return ours


def vi(name: str, dims: list[object], elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def edge_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Dropout", ["b"], ["b2", ""]),
        helper.make_node("SequenceConstruct", ["c", "c"], ["s"]),
        helper.make_node("SequenceAt", ["s", "zero"], ["d"]),
        helper.make_node("Neg", ["d"], ["y"]),
    ]
    documented = vi("b", ["N", 4])
    documented.doc_string = "from the exporter"
    documented_first = vi("b2", ["N", 4])
    documented_first.doc_string = "overridden by the next entry"
    with_metadata = vi("c", ["N", 4])
    with_metadata.metadata_props.add(key="origin", value="torch")
    denoted = vi("d", ["N", 4])
    denoted.type.denotation = "TENSOR"
    infos = [
        vi("a", ["N", 4]),
        vi("a", [2, 4]),  # a second entry for one name: the last one counts
        documented_first,  # ... and only the last one's doc string (none here)
        vi("b2", [2, 4]),
        vi("", [7], TensorProto.INT64),  # the empty name (an absent optional output's)
        documented,
        with_metadata,
        helper.make_value_info(
            "s",
            helper.make_sequence_type_proto(
                helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", 4])
            ),
        ),
        denoted,
        vi("w", [4]),  # an initializer's: onnx-ir reads it itself
        vi("y", [2, 4]),  # a graph output's: its output entry is applied after it
        vi("x", [2, 4]),  # a graph input's: not read
        vi("ghost", [1]),  # no such value
        vi("pkg::f/v", [1]),  # the dynamo exporter's function value_info (IR 9)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("x", ["N", 4])],
        [vi("y", ["N", 4])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [4], [1, 2, 3, 4]),
            helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        ],
        value_info=infos,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_edge_cases_read_as_onnx_ir_reads_them():
    model = same_as_onnx_ir(edge_model())
    a = next(o for n in model.graph for o in n.outputs if o.name == "a")
    assert tuple(a.shape) == (2, 4)
    b = next(o for n in model.graph for o in n.outputs if o.name == "b")
    assert b.doc_string == "from the exporter"
    b2 = next(o for n in model.graph for o in n.outputs if o.name == "b2")
    assert b2.doc_string is None


def test_values_of_one_type_share_a_frozen_shape_but_not_a_type():
    model = deserialize_model(edge_model())
    b, c = (o for n in model.graph for o in n.outputs if o.name in ("b", "c"))
    a = next(o for n in model.graph for o in n.outputs if o.name == "a")
    relu_out = next(n for n in model.graph if n.op_type == "Neg").inputs[0]
    assert a.shape is not None and a.shape.frozen
    assert relu_out.type is not a.type
    a.dtype = ir.DataType.DOUBLE  # assigns into a's own type object
    assert relu_out.dtype == ir.DataType.FLOAT and b.dtype == ir.DataType.FLOAT


def test_the_onnx_suite_reads_as_onnx_ir_reads_it():
    checked = 0
    for case in conformance.cases():
        proto = onnx.load(str(case / "model.onnx"))
        with contextlib.suppress(Exception):  # else as written, without inferred value_info
            proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        try:
            expected = ir.serde.deserialize_model(proto)
        except Exception:
            continue  # onnx-ir cannot read it at all (map types...): set_aside's case
        ours = deserialize_model(proto)
        assert described(ours) == described(expected), case.name
        checked += 1
    assert checked > 1000
