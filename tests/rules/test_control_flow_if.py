"""ConstantIfInlineFusionPass: an If whose condition is a constant (or folds to one) is
replaced by the branch that runs, recursively (a 3-level nest leaves no If)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from helpers import check_rule, effected, op_types, reasons

PASS = "ConstantIfInlineFusionPass"
X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])


def branch(name: str, nodes: list[onnx.NodeProto], out: str, inits=()) -> onnx.GraphProto:
    return helper.make_graph(
        nodes,
        name,
        [],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])],
        list(inits),
    )


def nested_if(depth: int, cond: str, prefix: str = "") -> list[onnx.NodeProto]:
    """If(cond) then (If(cond) then ... Relu(x)*k ...) else Neg(x): ``depth`` levels,
    each then-branch with its own initializer and a node of its own."""
    p = f"{prefix}l{depth}_"
    if depth == 0:
        return [
            helper.make_node("Relu", ["x"], [p + "r"]),
            helper.make_node("Mul", [p + "r", p + "k"], [p + "out"]),
        ]
    inner = nested_if(depth - 1, cond, prefix)
    inner_out = inner[-1].output[0]
    k = numpy_helper.from_array(np.full((3,), depth + 1.5, np.float32), f"{prefix}l{depth - 1}_k")
    then = branch(
        p + "then", [*inner, helper.make_node("Add", [inner_out, "x"], [p + "t"])], p + "t", [k]
    )
    other = branch(p + "else", [helper.make_node("Neg", ["x"], [p + "e"])], p + "e")
    return [helper.make_node("If", [cond], [p + "out"], then_branch=then, else_branch=other)]


def model_with(nodes, inits=(), inputs=(X,), output="y") -> ir.Model:
    graph = helper.make_graph(
        nodes,
        "g",
        list(inputs),
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [2, 3])],
        list(inits),
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto, full_check=True)
    return ir.from_proto(proto)


def nested_model(condition: bool) -> ir.Model:
    cond = numpy_helper.from_array(np.array(condition), "cond")
    nodes = nested_if(3, "cond")
    nodes.append(helper.make_node("Sigmoid", [nodes[-1].output[0]], ["y"]))
    return model_with(nodes, [cond])


def test_three_nested_constant_ifs_leave_no_if():
    optimized, result = check_rule(nested_model(True), PASS)
    assert op_types(optimized) == {"Relu": 1, "Mul": 1, "Add": 3, "Sigmoid": 1}
    assert effected(result, PASS) == 3  # every level


def test_a_false_condition_takes_the_else_branch():
    optimized, result = check_rule(nested_model(False), PASS)
    assert op_types(optimized) == {"Neg": 1, "Sigmoid": 1}
    assert effected(result, PASS) == 1


def test_a_condition_that_folds_to_a_constant_is_inlined():
    """cond = Greater(Constant 2, Constant 1): constant folding makes it a constant first."""
    nodes = [
        helper.make_node(
            "Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))
        ),
        helper.make_node(
            "Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32))
        ),
        helper.make_node("Greater", ["two", "one"], ["cond"]),
        *nested_if(1, "cond"),
        helper.make_node("Identity", ["l1_out"], ["y"]),
    ]
    optimized, _ = check_rule(model_with(nodes), PASS, "ConstantFoldingFusionPass")
    assert "If" not in op_types(optimized)


def test_an_if_output_that_is_a_graph_output_keeps_its_name():
    cond = numpy_helper.from_array(np.array(True), "cond")
    then = branch("then", [helper.make_node("Identity", ["x"], ["t"])], "t")
    other = branch("else", [helper.make_node("Neg", ["x"], ["e"])], "e")
    m = model_with(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)], [cond]
    )
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Identity": 1}
    assert [o.name for o in optimized.graph.outputs] == ["y"]


def test_a_condition_that_is_an_input_is_left():
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    nodes = [*nested_if(1, "cond"), helper.make_node("Identity", ["l1_out"], ["y"])]
    m = model_with(nodes, inputs=(X, cond))
    feeds = {"x": np.ones((2, 3), np.float32), "cond": np.array(True)}
    optimized, result = check_rule(m, PASS, feeds=feeds)
    assert op_types(optimized)["If"] == 1
    assert effected(result, PASS) == 0
    assert reasons(result, PASS) == ["the condition is not a constant"]
