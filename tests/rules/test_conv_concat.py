"""ConvConcatFusionPass: sibling Convs on one input merged into one Conv (+ Split, or
straight into their Concat), and the siblings it leaves apart with the reasons."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes

PASS = "ConvConcatFusionPass"
rng = np.random.default_rng(0)


def weights(**shapes):
    return {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}


def inception(opset=17):
    """Three 1x1 branches (one of them without bias) and a 3x3 one, each through Relu."""
    inits = weights(
        w1=(4, 3, 1, 1), b1=(4,), w2=(2, 3, 1, 1), b2=(2,), w3=(5, 3, 1, 1), w4=(3, 3, 3, 3)
    )
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[1,3,6,6] x) => (float[1,14,6,6] y) {{
          c1 = Conv(x, w1, b1)
          c2 = Conv(x, w2, b2)
          c3 = Conv(x, w3)
          c4 = Conv<pads=[1,1,1,1]>(x, w4)
          r1 = Relu(c1)
          r2 = Relu(c2)
          r3 = Sigmoid(c3)
          r4 = Relu(c4)
          y = Concat<axis=1>(r1, r2, r3, r4)
        }}""",
        inits,
    )


@pytest.mark.parametrize("opset", [11, 17])
def test_siblings_merge_and_split(opset):
    optimized, result = check_rule(inception(opset), PASS)
    ops = op_types(optimized)
    assert ops["Conv"] == 2 and ops["Split"] == 1
    assert effected(result, PASS, "conv_concat") == 1


def test_siblings_feeding_their_concat_need_no_split():
    inits = weights(w1=(4, 3, 3, 3), b1=(4,), w2=(2, 3, 3, 3), b2=(2,), w3=(5, 3, 3, 3))
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,6,6] x) => (float[1,14,6,6] y) {
          a = Relu(x)
          c1 = Conv<pads=[1,1,1,1]>(x, w1, b1)
          c3 = Conv<pads=[1,1,1,1]>(x, w3)
          c2 = Conv<pads=[1,1,1,1]>(x, w2, b2)
          y = Concat<axis=1>(a, c1, c2, c3)
        }""",
        inits,
    )
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Relu": 1, "Conv": 1, "Concat": 1}
    assert effected(result, PASS) == 1


def test_graph_outputs_keep_their_names():
    inits = weights(w1=(4, 3, 1, 1), w2=(2, 3, 1, 1))
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,6,6] x) => (float[1,4,6,6] c1, float[1,2,6,6] c2) {
          c1 = Conv(x, w1)
          c2 = Conv(x, w2)
        }""",
        inits,
    )
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1, "Split": 1}
    assert [v.name for v in optimized.graph.outputs] == ["c1", "c2"]


@pytest.mark.parametrize(
    "attrs2,w2,reason",
    [
        (
            "<strides=[2,2]>",
            (2, 3, 1, 1),
            "sibling Convs differ in kernel, strides, pads or dilations",
        ),
        ("", (2, 3, 3, 3), "sibling Convs differ in kernel, strides, pads or dilations"),
        (
            "<pads=[1,1,1,1]>",
            (2, 3, 1, 1),
            "sibling Convs differ in kernel, strides, pads or dilations",
        ),
        ("<group=3>", (3, 1, 1, 1), "Conv is grouped"),
    ],
)
def test_siblings_that_differ_stay_apart(attrs2, w2, reason):
    inits = weights(w1=(4, 3, 1, 1), w2=w2)
    model = model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,6,6] x) => (float[1,?,?,?] y1, float[1,?,?,?] y2) {{
          y1 = Conv(x, w1)
          y2 = Conv{attrs2}(x, w2)
        }}""",
        inits,
    )
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 2}
    assert effected(result, PASS) == 0
    assert reason in reasons(result, PASS)


def test_non_constant_weight_stays_apart():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,6,6] x, float[2,3,1,1] w2) => (float[1,4,6,6] y1, float[1,2,6,6] y2) {
          y1 = Conv(x, w1)
          y2 = Conv(x, w2)
        }""",
        weights(w1=(4, 3, 1, 1)),
    )
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "Conv weight is not constant" in reasons(result, PASS)


def test_non_constant_bias_stays_apart():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,6,6] x, float[2] b2) => (float[1,4,6,6] y1, float[1,2,6,6] y2) {
          y1 = Conv(x, w1)
          y2 = Conv(x, w2, b2)
        }""",
        weights(w1=(4, 3, 1, 1), w2=(2, 3, 1, 1)),
    )
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "Conv bias is not constant" in reasons(result, PASS)


def test_each_sibling_left_out_gets_a_reason_when_others_merge():
    # c1 and c2 merge; c3 (3x3) and c4 (stride 2) match no sibling: a reason for each
    inits = weights(w1=(4, 3, 1, 1), w2=(2, 3, 1, 1), w3=(3, 3, 3, 3), w4=(2, 3, 1, 1))
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,6,6] x) => (float[1,4,6,6] c1, float[1,2,6,6] c2,
                                 float[1,3,6,6] c3, float[1,2,3,3] c4) {
          c1 = Conv(x, w1)
          c2 = Conv(x, w2)
          c3 = Conv<pads=[1,1,1,1]>(x, w3)
          c4 = Conv<strides=[2,2]>(x, w4)
        }""",
        inits,
    )
    for node in model.graph:
        node.name = node.outputs[0].name
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 3, "Split": 1}
    assert effected(result, PASS) == 1
    (stats,) = [s for s in result.log if s.pass_name == PASS]
    assert {"c3", "c4"} <= set(
        stats.examples["sibling Convs differ in kernel, strides, pads or dilations"]
    )
