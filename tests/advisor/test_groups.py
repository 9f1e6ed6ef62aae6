"""Fusion classes, group growth with the target's limits, and ranking."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from advisor_models import make_model, swish_net
from onnx import helper

from opfuse.advisor.graph import from_chain, from_model
from opfuse.advisor.groups import Group, grow_groups, rank_groups
from opfuse.advisor.opkinds import Kind, classify
from opfuse.errors import OpfuseError
from opfuse.runtime.targets import load_target

LIMITS = load_target("ascend310").ub_limits


def graph_of(proto):  # type: ignore[no-untyped-def]
    return from_model(ir.from_proto(proto))


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("Conv", Kind.CONV),
        ("ConvTranspose", Kind.CONV),
        ("MatMul", Kind.CONV),
        ("Gemm", Kind.CONV),
        ("DepthwiseConv2D", Kind.CONV),
        ("Sigmoid", Kind.ELEMENTWISE),
        ("Mul", Kind.ELEMENTWISE),
        ("ReduceMean", Kind.REDUCE),
        ("GlobalAveragePool", Kind.REDUCE),
        ("UnsortedSegmentSum", Kind.SEGMENT),
        ("Reshape", Kind.OPAQUE),
        ("Softmax", Kind.OPAQUE),
    ],
)
def test_classify(op: str, kind: Kind) -> None:
    assert classify(op) is kind


def chain(head: str, ops: list[str], n_in: int = 1) -> object:
    """head(x[, x2]) followed by single-input unary ops."""
    n = helper.make_node
    inits = {}
    if head == "Conv":
        inits["W"] = np.ones((4, 4, 1, 1), np.float32)
        nodes = [n("Conv", ["x", "W"], ["t0"], name="head")]
    elif head == "ReduceMean":
        nodes = [n("ReduceMean", ["x"], ["t0"], name="head", axes=[1], keepdims=1)]
    else:
        nodes = [n(head, ["x", "x2"][:n_in] if n_in > 1 else ["x"], ["t0"], name="head")]
    for i, op in enumerate(ops):
        nodes.append(n(op, [f"t{i}"], [f"t{i + 1}"] if i + 1 < len(ops) else ["y"], name=f"e{i}"))
    shape = [1, 4, 2, 2]
    out = [1, 1, 2, 2] if head == "ReduceMean" else shape
    ins = {"x": shape, **({"x2": shape} if n_in > 1 else {})}
    return make_model(nodes, ins, {"y": out}, inits)


def test_conv_takes_at_most_three_elementwise() -> None:
    groups = grow_groups(graph_of(chain("Conv", ["Relu"] * 5)), LIMITS)
    assert [g.fusion_type for g in groups] == ["Conv+Relu+Relu+Relu", "Relu+Relu"]
    assert groups[0].kind is Kind.CONV


def test_elementwise_chain_of_five_with_multi_input_head() -> None:
    groups = grow_groups(graph_of(chain("Add", ["Relu"] * 6, n_in=2)), LIMITS)
    assert [len(g.members) for g in groups] == [5, 2]
    assert groups[0].op_types[0] == "Add"


def test_reduce_takes_at_most_four_elementwise() -> None:
    groups = grow_groups(graph_of(chain("ReduceMean", ["Relu"] * 6)), LIMITS)
    assert [g.fusion_type for g in groups] == ["ReduceMean+Relu+Relu+Relu+Relu", "Relu+Relu"]


def test_limits_come_from_the_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    limits = dict(LIMITS, conv_elementwise=1)
    groups = grow_groups(graph_of(chain("Conv", ["Relu"] * 2)), limits)
    assert groups[0].fusion_type == "Conv+Relu"
    bad = tmp_path / "t.json"
    bad.write_text('{"name": "x"}')
    with pytest.raises(OpfuseError, match="lacks"):
        load_target(str(bad))


def test_swish_diamond_is_one_group_and_second_consumer_stops() -> None:
    g = graph_of(swish_net())
    groups = grow_groups(g, LIMITS)
    types = [grp.fusion_type for grp in groups]
    assert "Conv+Sigmoid+Mul" in types
    assert "Conv+Relu" in types  # GlobalAveragePool is a reduce, not an elementwise follower
    assert "GlobalAveragePool+Add+Relu" in types


def test_intermediate_with_outside_consumer_stops_growth() -> None:
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W"], ["c"], name="conv"),
        n("Relu", ["c"], ["r"], name="relu"),
        n("Sigmoid", ["r"], ["s"], name="sig"),
        n("Add", ["r", "s"], ["y"], name="add_outside"),
        n("Tanh", ["c"], ["z"], name="tanh"),  # second consumer of the Conv output
    ]
    model = make_model(
        nodes,
        {"x": [1, 4, 2, 2]},
        {"y": [1, 4, 2, 2], "z": [1, 4, 2, 2]},
        {"W": np.ones((4, 4, 1, 1), np.float32)},
    )
    groups = grow_groups(graph_of(model), LIMITS)
    assert all("conv" not in grp.names for grp in groups)  # c has a consumer outside any group


def test_follower_may_read_a_tensor_made_before_the_group() -> None:
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W"], ["c"], name="conv"),
        n("Mul", ["c", "x"], ["y"], name="mul_outside_input"),
    ]
    model = make_model(
        nodes, {"x": [1, 4, 2, 2]}, {"y": [1, 4, 2, 2]}, {"W": np.ones((4, 4, 1, 1), np.float32)}
    )
    groups = grow_groups(graph_of(model), LIMITS)
    assert [grp.names for grp in groups] == [["conv", "mul_outside_input"]]


def residual_block() -> object:
    """ResNet's basic block: conv1 -> relu1 -> conv2 -> Add(., block input) -> relu_out."""
    n = helper.make_node
    w = {"W1": np.ones((4, 4, 3, 3), np.float32), "W2": np.ones((4, 4, 3, 3), np.float32)}
    nodes = [
        n("Relu", ["x"], ["r0"], name="relu_in"),
        n("Conv", ["r0", "W1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Conv", ["r1", "W2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        n("Add", ["c2", "r0"], ["a"], name="add"),
        n("Relu", ["a"], ["y"], name="relu_out"),
    ]
    return make_model(nodes, {"x": [1, 4, 4, 4]}, {"y": [1, 4, 4, 4]}, w)


def test_residual_add_joins_the_conv_before_it() -> None:
    groups = grow_groups(graph_of(residual_block()), LIMITS)
    assert [grp.fusion_type for grp in groups] == ["Conv+Relu", "Conv+Add+Relu"]
    assert groups[1].names == ["conv2", "add", "relu_out"]
    assert groups[1].output == "y"


def test_follower_never_reads_a_tensor_that_depends_on_its_group() -> None:
    """Mul(c, Softmax(c)): the Softmax is made from the group's own output outside the
    group; taking the Mul would make the group wait on itself."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W"], ["c"], name="conv"),
        n("Softmax", ["c"], ["s"], name="softmax"),
        n("Mul", ["c", "s"], ["y"], name="mul"),
    ]
    model = make_model(
        nodes, {"x": [1, 4, 2, 2]}, {"y": [1, 4, 2, 2]}, {"W": np.ones((4, 4, 1, 1), np.float32)}
    )
    assert grow_groups(graph_of(model), LIMITS) == []


def test_grouping_is_linear_on_a_long_chain() -> None:
    g = from_chain([f"n{i}" for i in range(30000)], ["Conv", "Relu", "Add"] * 10000)
    groups = grow_groups(g, LIMITS)
    assert len(groups) == 10000 and all(grp.fusion_type == "Conv+Relu+Add" for grp in groups)


def test_rank_largest_first_same_types_together() -> None:
    def grp(types: str, us: float) -> Group:
        ops = types.split("+")
        return Group(list(range(len(ops))), Kind.CONV, ops, ops, None, us)

    ranked = rank_groups(
        [
            grp("Conv+Relu", 5),
            grp("Conv+Sigmoid+Mul", 30),
            grp("Conv+Relu", 20),
            grp("Conv+Sigmoid+Mul", 10),
            grp("Conv+Add", 1),
        ]
    )
    assert [(g.fusion_type, g.duration_us) for g in ranked] == [
        ("Conv+Sigmoid+Mul", 30),
        ("Conv+Sigmoid+Mul", 10),
        ("Conv+Relu", 20),
        ("Conv+Relu", 5),
        ("Conv+Add", 1),
    ]


def test_deeper_diamond_fits_and_too_deep_rolls_back() -> None:
    n = helper.make_node
    w = {"W": np.ones((4, 4, 1, 1), np.float32), "k": np.array(2.0, np.float32)}
    shape = {"x": [1, 4, 2, 2]}
    # Conv -> Sigmoid -> Mul(., k) -> Mul(conv, .): three followers, one group
    nodes = [
        n("Conv", ["x", "W"], ["c"], name="conv"),
        n("Sigmoid", ["c"], ["s"], name="sig"),
        n("Mul", ["s", "k"], ["m"], name="scale"),
        n("Mul", ["c", "m"], ["y"], name="gate"),
    ]
    groups = grow_groups(graph_of(make_model(nodes, shape, {"y": [1, 4, 2, 2]}, w)), LIMITS)
    assert [grp.names for grp in groups] == [["conv", "sig", "scale", "gate"]]
    # one more follower: the Conv cannot close its group within 3, so it stays alone and the
    # elementwise chain after it takes the gate too (it reads the Conv's output, made before)
    nodes.insert(3, n("Relu", ["m"], ["m2"], name="relu"))
    nodes[-1] = n("Mul", ["c", "m2"], ["y"], name="gate")
    groups = grow_groups(graph_of(make_model(nodes, shape, {"y": [1, 4, 2, 2]}, w)), LIMITS)
    assert [grp.names for grp in groups] == [["sig", "scale", "relu", "gate"]]
