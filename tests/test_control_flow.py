"""Control flow: the passes run inside If/Loop/Scan bodies, and respect values a body
captures from the outer scope (a captured value's readers inside a body are consumers
too: a rule must not fold a node whose output a body still reads)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import assert_same_outputs, copy_model
from opfuse.pipeline.conductor import optimize_model

RNG = np.random.default_rng(0)
C = 4  # channels everywhere: loop-carried tensors keep their shape


def t(name: str, *shape: int, low: float = -1.0, high: float = 1.0) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.uniform(low, high, shape).astype(np.float32), name)


def bn_params(prefix: str) -> list[onnx.TensorProto]:
    return [
        t(prefix + "g", C),
        t(prefix + "b", C),
        t(prefix + "m", C),
        t(prefix + "v", C, low=0.5, high=2.0),
    ]


def conv_bn_nodes(x: str, out: str, p: str) -> list[onnx.NodeProto]:
    """Conv(x, p+w, pads 1) -> BN -> Identity -> out; weights are outer initializers."""
    return [
        helper.make_node("Conv", [x, p + "w"], [p + "c"], name=p + "conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization",
            [p + "c", p + "g", p + "b", p + "m", p + "v"],
            [p + "n"],
            name=p + "bn",
        ),
        helper.make_node("Identity", [p + "n"], [out], name=p + "identity"),
    ]


def image(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, C, 5, 5])


def model(graph: onnx.GraphProto) -> ir.Model:
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto, full_check=True)
    return ir.from_proto(proto)


def ops_by_graph(m: ir.Model) -> dict[str, Counter[str]]:
    """Op types of the main graph ("main") and of each subgraph (by its name)."""
    out = {"main": Counter(n.op_type for n in m.graph)}
    for g in m.graph.subgraphs():
        out[g.name or "?"] = Counter(n.op_type for n in g)
    return out


def optimize(m: ir.Model, feeds_list: list[dict[str, np.ndarray]]) -> ir.Model:
    """Optimize a copy, check numbers on every feed and that a rerun changes nothing."""
    result = optimize_model(copy_model(m))
    for feeds in feeds_list:
        assert_same_outputs(m, result.model, feeds)
    again = optimize_model(copy_model(result.model))
    changed = [(s.pass_name, s.pattern) for s in again.log if s.effected]
    assert not changed, f"second run changed the model: {changed}"
    return result.model


def x_feed(**extra: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((1, C, 5, 5)).astype(np.float32), **extra}


def test_if_branches_are_optimized():
    then_g = helper.make_graph(conv_bn_nodes("x", "yt", "t_"), "then", [], [image("yt")])
    else_g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Identity", ["r"], ["ye"], name="else_identity"),
        ],
        "else",
        [],
        [image("ye")],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        "main",
        [image("x"), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [image("y")],
        [t("t_w", C, C, 3, 3), *bn_params("t_")],
    )
    m = model(graph)
    cond = [np.array(True), np.array(False)]
    got = optimize(m, [x_feed(cond=c) for c in cond])
    ops = ops_by_graph(got)
    assert ops["then"] == Counter({"Conv": 1}), ops
    assert ops["else"] == Counter({"Relu": 1}), ops


def test_loop_body_is_optimized():
    body = helper.make_graph(
        [
            *conv_bn_nodes("v", "v_out", "l_"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond_identity"),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            image("v"),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), image("v_out")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)],
        "main",
        [image("x")],
        [image("y")],
        [
            numpy_helper.from_array(np.array(3, np.int64), "trips"),
            t("l_w", C, C, 3, 3, low=-0.3, high=0.3),
            *bn_params("l_"),
        ],
    )
    m = model(graph)
    got = optimize(m, [x_feed()])
    ops = ops_by_graph(got)
    assert ops["loop_body"]["BatchNormalization"] == 0, ops
    assert ops["loop_body"]["Conv"] == 1, ops


def test_scan_body_is_optimized():
    """Scan over T steps: h = h + (x_t @ W + b); MatMul + bias Add becomes Gemm."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["xt", "s_w"], ["mm"], name="mm"),
            helper.make_node("Add", ["mm", "s_bias"], ["lin"], name="bias"),
            helper.make_node("Identity", ["lin"], ["lin2"], name="scan_identity"),
            helper.make_node("Add", ["h", "lin2"], ["h_out"], name="acc"),
            helper.make_node("Relu", ["h_out"], ["step_out"], name="relu"),
        ],
        "scan_body",
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("xt", TensorProto.FLOAT, [2, 5]),
        ],
        [
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("step_out", TensorProto.FLOAT, [2, 3]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Scan", ["h0", "seq"], ["h_last", "steps"], body=body, num_scan_inputs=1
            )
        ],
        "main",
        [
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("seq", TensorProto.FLOAT, [4, 2, 5]),
        ],
        [
            helper.make_tensor_value_info("h_last", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("steps", TensorProto.FLOAT, [4, 2, 3]),
        ],
        [t("s_w", 5, 3), t("s_bias", 3)],
    )
    m = model(graph)
    feeds = {
        "h0": RNG.standard_normal((2, 3)).astype(np.float32),
        "seq": RNG.standard_normal((4, 2, 5)).astype(np.float32),
    }
    got = optimize(m, [feeds])
    ops = ops_by_graph(got)
    assert ops["scan_body"]["Identity"] == 0, ops
    assert ops["scan_body"]["Gemm"] == 1 and ops["scan_body"]["MatMul"] == 0, ops


def test_value_read_by_a_body_is_not_single_consumer():
    """Outer Conv -> BN, and an If branch also reads the Conv's output: folding the BN
    into the Conv would change what the branch reads, so the Conv must stay as it is."""
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["c"], ["yt"], name="reads_outer_c")],
        "then",
        [],
        [image("yt")],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["ye"], name="neg")], "else", [], [image("ye")]
    )
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "o_w"], ["c"], name="outer_conv", pads=[1, 1, 1, 1]),
            helper.make_node(
                "BatchNormalization", ["c", "o_g", "o_b", "o_m", "o_v"], ["n"], name="outer_bn"
            ),
            helper.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g),
        ],
        "main",
        [image("x"), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [image("n"), image("branch")],
        [t("o_w", C, C, 3, 3), *bn_params("o_")],
    )
    m = model(graph)
    got = optimize(m, [x_feed(cond=np.array(True)), x_feed(cond=np.array(False))])
    ops = ops_by_graph(got)
    assert ops["main"]["BatchNormalization"] == 1 and ops["main"]["Conv"] == 1, ops
    assert ops["then"] == Counter({"Relu": 1}), ops


def test_body_value_captured_by_a_nested_body():
    """Inside a Loop body, Conv -> BN where a nested If inside the same body also reads
    the Conv's output: the same rule, one scope deeper."""
    inner_then = helper.make_graph(
        [helper.make_node("Sigmoid", ["b_c"], ["it"], name="nested_reads_c")],
        "inner_then",
        [],
        [image("it")],
    )
    inner_else = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["ie"], name="inner_identity")],
        "inner_else",
        [],
        [image("ie")],
    )
    body = helper.make_graph(
        [
            helper.make_node("Conv", ["v", "b_w"], ["b_c"], name="body_conv", pads=[1, 1, 1, 1]),
            helper.make_node(
                "BatchNormalization", ["b_c", "b_g", "b_b", "b_m", "b_v"], ["b_n"], name="body_bn"
            ),
            helper.make_node(
                "If", ["cond_in"], ["sel"], then_branch=inner_then, else_branch=inner_else
            ),
            helper.make_node("Add", ["b_n", "sel"], ["v_out"], name="join"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond_identity"),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            image("v"),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), image("v_out")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)],
        "main",
        [image("x"), helper.make_tensor_value_info("go", TensorProto.BOOL, [])],
        [image("y")],
        [
            numpy_helper.from_array(np.array(2, np.int64), "trips"),
            t("b_w", C, C, 3, 3, low=-0.3, high=0.3),
            *bn_params("b_"),
        ],
    )
    m = model(graph)
    got = optimize(m, [x_feed(go=np.array(True))])
    ops = ops_by_graph(got)
    assert ops["loop_body"]["BatchNormalization"] == 1, ops
    assert ops["inner_then"] == Counter({"Sigmoid": 1}), ops


def nested_constant_ifs(depth: int, from_shape: bool) -> onnx.ModelProto:
    """``depth`` nested Ifs: each level adds a constant, then an If whose condition is a
    constant (``from_shape``: computed from the input's static dim, so it folds first)
    and whose then branch holds the next level (behind an Identity), else a Neg."""
    inits = [
        numpy_helper.from_array(np.full((1, 8), 0.1 * i, np.float32), f"c{i}") for i in range(depth)
    ]
    inits += [
        numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("m1", -1), ("one", 1))
    ]

    def level(i: int, x: str) -> list[onnx.NodeProto]:
        if from_shape:
            cond = [
                helper.make_node("Shape", [x], [f"s{i}"], name=f"shape{i}"),
                helper.make_node("Gather", [f"s{i}", "one"], [f"k{i}"], name=f"dim{i}", axis=0),
            ]
        else:
            value = numpy_helper.from_array(np.array(i, np.int64))
            cond = [helper.make_node("Constant", [], [f"k{i}"], name=f"k{i}", value=value)]
        nodes = [helper.make_node("Add", [x, f"c{i}"], [f"a{i}"], name=f"add{i}"), *cond]
        nodes.append(helper.make_node("Greater", [f"k{i}", "m1"], [f"cond{i}"], name=f"gt{i}"))
        if i + 1 < depth:
            inner, inner_out = level(i + 1, f"a{i}"), f"y{i + 1}"
        else:
            inner = [helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
            inner_out = f"r{i}"
        inner.append(helper.make_node("Identity", [inner_out], [f"t{i}"], name=f"tid{i}"))
        out = lambda n: [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 8])]  # noqa: E731
        then_g = helper.make_graph(inner, f"then{i}", [], out(f"t{i}"))
        else_g = helper.make_graph(
            [helper.make_node("Neg", [f"a{i}"], [f"e{i}"], name=f"neg{i}")],
            f"else{i}",
            [],
            out(f"e{i}"),
        )
        nodes.append(
            helper.make_node(
                "If", [f"cond{i}"], [f"y{i}"], name=f"if{i}", then_branch=then_g, else_branch=else_g
            )
        )
        return nodes

    graph = helper.make_graph(
        level(0, "x"),
        "nested",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, ["N", 8])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _all_nodes(graph: ir.Graph) -> int:
    return sum(1 for _ in graph.all_nodes())


@pytest.mark.parametrize("from_shape", [False, True])
def test_25_nested_constant_ifs_inline_to_the_straight_line(from_shape):
    """25 nested constant-condition Ifs (151 or 176 nodes counting subgraphs) leave only
    the nodes that run, folded as a model without the Ifs would be; outputs unchanged; a
    second run changes nothing."""
    original = ir.from_proto(nested_constant_ifs(25, from_shape))
    model = copy_model(original)
    result = optimize_model(model)
    # the Adds of constants fold into one once the branches that never run hold no uses
    # of the Adds' outputs (onnxslim 0.1.98 leaves 25 nodes: 24 Adds and the Relu)
    assert _all_nodes(result.model.graph) == 2
    assert ops_by_graph(result.model) == {"main": Counter({"Add": 1, "Relu": 1})}
    assert_same_outputs(original, result.model)
    again = optimize_model(copy_model(result.model))
    assert again.log.effected() == 0  # idempotent


def test_a_non_constant_condition_is_not_inlined():
    proto = nested_constant_ifs(2, from_shape=False)
    proto.graph.node[1].CopyFrom(helper.make_node("Shape", ["x"], ["k0_full"], name="shape0"))
    proto.graph.node.insert(
        2, helper.make_node("ReduceSum", ["k0_full"], ["k0"], name="k0_dynamic", keepdims=0)
    )  # the dynamic batch in the sum: unknown until run
    original = ir.from_proto(proto)
    result = optimize_model(copy_model(original))
    assert ops_by_graph(result.model)["main"]["If"] == 1
    assert_same_outputs(original, result.model)
