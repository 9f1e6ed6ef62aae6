"""ConvToFullyConnectionFusionPass: 1x1 Conv over a 1x1 map + Flatten/Reshape becomes
Flatten + Gemm; the cases it leaves alone, with their reasons."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes

PASS = "ConvToFullyConnectionFusionPass"
rng = np.random.default_rng(0)


def conv_fc(
    tail="y = Flatten(c)",
    x="float[N,8,1,1] x",
    w_shape=(4, 8, 1, 1),
    conv_attrs="",
    bias=True,
    out="float[N,4] y",
):
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(np.float32)
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({x}) => ({out}) {{
          c = Conv{conv_attrs}(x, w{", b" if bias else ""})
          {tail}
        }}""",
        inits,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"bias": False},
        {"tail": "y = Flatten<axis=-3>(c)"},
        {"tail": "s = Constant<value = int64[2] {0, -1}>()\n y = Reshape(c, s)"},
        {"tail": "s = Constant<value = int64[2] {-1, 4}>()\n y = Reshape(c, s)"},
        {
            "tail": "s = Constant<value = int64[2] {2, -1}>()\n y = Reshape(c, s)",
            "x": "float[2,8,1,1] x",
            "out": "float[2,4] y",
        },
        {"conv_attrs": "<strides=[2,2]>"},
        {"tail": "s = Constant<value = int64[2] {-1, 4}>()\n y = Reshape<allowzero=1>(c, s)"},
        {"x": "float[N,8,1] x", "w_shape": (4, 8, 1)},
    ],
)
def test_becomes_gemm(kwargs):
    optimized, result = check_rule(conv_fc(**kwargs), PASS, feeds=None)
    assert op_types(optimized) == {"Flatten": 1, "Gemm": 1}
    assert effected(result, PASS, "conv_to_fc") == 1


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"x": "float[N,8,3,3] x", "out": "float[N,36] y"}, "input spatial dims are not all 1"),
        (
            {"w_shape": (4, 8, 3, 3), "conv_attrs": "<pads=[1,1,1,1]>"},
            "kernel is not 1x1",
        ),
        ({"conv_attrs": "<pads=[1,1,1,1]>", "out": "float[N,36] y"}, "Conv has padding"),
        ({"w_shape": (4, 4, 1, 1), "conv_attrs": "<group=2>"}, "Conv is grouped"),
        (
            {"tail": "y = Flatten<axis=2>(c)", "out": "float[N,1] y"},
            "Flatten does not flatten at axis 1",
        ),
        (
            {
                "tail": "s = Constant<value = int64[3] {0, -1, 1}>()\n y = Reshape(c, s)",
                "out": "float[N,4,1] y",
            },
            "Reshape does not give [batch, channels]",
        ),
    ],
)
def test_not_fused(kwargs, reason):
    model = conv_fc(**kwargs)
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "Gemm" not in op_types(model)
    assert reason in reasons(result, PASS)


def test_conv_with_second_consumer_is_not_fused():
    model = conv_fc(tail="y = Flatten(c)\n z = Relu(c)", out="float[N,4] y, float[N,4,1,1] z")
    optimized, result = check_rule(model, PASS)
    assert "Gemm" not in op_types(optimized)
    assert any("another consumer" in r for r in reasons(result, PASS))


def test_non_constant_weight_is_not_fused():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,8,1,1] x, float[4,8,1,1] w) => (float[N,4] y) {
          c = Conv(x, w)
          y = Flatten(c)
        }"""
    )
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "w is not a constant" in reasons(result, PASS)
