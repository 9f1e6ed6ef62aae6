"""BatchNormSmallOpsFusionPass: decomposed BatchNorm (Sub/Mul/Add, Div forms, without
scale, without center, the folded x * scale + shift) folded into the Conv/MatMul/Gemm
before it (also across an NHWC Transpose), else into one BatchNormalization (NCHW) or
one Mul + Add (NHWC), and the chains it leaves alone with their reasons."""

from __future__ import annotations

import re

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons

PASS = "BatchNormSmallOpsFusionPass"
rng = np.random.default_rng(3)
CIN, C, K = 3, 4, 6


def chan(shape):
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)


INITS = {
    "w": rng.standard_normal((C, CIN, 3, 3)).astype(np.float32),
    "b": rng.standard_normal(C).astype(np.float32),
    "wm": rng.standard_normal((K, C)).astype(np.float32),
    "mean": rng.standard_normal((1, C, 1, 1)).astype(np.float32),
    "k": chan((1, C, 1, 1)),
    "std": chan((C, 1, 1)),
    "beta": rng.standard_normal((1, C, 1, 1)).astype(np.float32),
    "mean_l": rng.standard_normal((1, 1, 1, C)).astype(np.float32),
    "k_l": chan((1, 1, 1, C)),
    "beta_l": rng.standard_normal(C).astype(np.float32),
    "bias_l": rng.standard_normal((1, 1, 1, C)).astype(np.float32),
    "h1": chan((1, 1, 5, 1)),
    "h2": chan((1, 1, 5, 1)),
    "two": np.array(2.0, np.float32),
}

NCHW_IN = f"float[1,{CIN},5,5] x"
NCHW_OUT = f"float[1,{C},5,5] y"
NHWC_OUT = f"float[1,5,5,{C}] y"
CONV = "h = Conv<pads=[1,1,1,1]>(x, w, b)"
SUB_MUL_ADD = "a = Sub(h, mean)\nm = Mul(a, k)\ny = Add(m, beta)"
KERAS = (
    "h0 = Conv<pads=[1,1,1,1]>(x, w)\nt = Transpose<perm=[0,2,3,1]>(h0)\nh = Add(t, bias_l)\n"
    "a = Sub(h, mean_l)\nm = Mul(a, k_l)\ny = Add(m, beta_l)"
)


def build(body: str, inputs: str = NCHW_IN, outputs: str = NCHW_OUT):
    used = set(re.findall(r"\w+", body))
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({inputs}) => ({outputs}) {{
          {body}
        }}""",
        {k: v for k, v in INITS.items() if k in used},
    )


@pytest.mark.parametrize(
    "body,inputs,outputs,expected",
    [
        (f"{CONV}\n{SUB_MUL_ADD}", NCHW_IN, NCHW_OUT, {"Conv": 1}),
        # without scale: (x - mean) / std + beta
        (
            f"{CONV}\na = Sub(h, mean)\nm = Div(a, std)\ny = Add(m, beta)",
            NCHW_IN,
            NCHW_OUT,
            {"Conv": 1},
        ),
        # without center: (x - mean) * k
        (f"{CONV}\na = Sub(h, mean)\ny = Mul(k, a)", NCHW_IN, NCHW_OUT, {"Conv": 1}),
        # the already-folded form, and a scalar in the chain
        (f"{CONV}\nm = Mul(h, k)\ny = Add(beta, m)", NCHW_IN, NCHW_OUT, {"Conv": 1}),
        (f"{CONV}\nm = Mul(h, two)\ny = Sub(m, beta)", NCHW_IN, NCHW_OUT, {"Conv": 1}),
        # Keras NHWC export: Conv -> Transpose -> bias Add -> Sub -> Mul -> Add
        (KERAS, NCHW_IN, NHWC_OUT, {"Conv": 1, "Transpose": 1}),
        (
            "h = MatMul(x, wm)\na = Sub(h, beta_l)\ny = Mul(a, beta_l)",
            f"float[3,{K}] x",
            f"float[3,{C}] y",
            {"MatMul": 1, "Add": 1},
        ),
        (
            "h = Gemm(x, wm)\na = Mul(h, beta_l)\ny = Add(a, beta_l)",
            f"float[3,{K}] x",
            f"float[3,{C}] y",
            {"Gemm": 1},
        ),
    ],
)
def test_folds_into_the_layer_before(body, inputs, outputs, expected):
    model = build(body, inputs, outputs)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == expected
    assert effected(result, PASS, "bn_small_ops") == 1


def test_without_a_layer_nchw_becomes_one_batchnorm():
    model = build(SUB_MUL_ADD.replace("(h,", "(x,"), f"float[1,{C},5,5] x")
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"BatchNormalization": 1}
    assert effected(result, PASS) == 1


def test_without_a_layer_nhwc_becomes_one_mul_add():
    body = "a = Sub(x, mean_l)\nm = Mul(a, k_l)\ny = Add(m, beta_l)"
    model = build(body, f"float[1,5,5,{C}] x", NHWC_OUT)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Mul": 1, "Add": 1}
    assert effected(result, PASS) == 1


def test_conv_with_a_second_consumer_keeps_the_conv_and_makes_a_batchnorm():
    model = build(f"{CONV}\n{SUB_MUL_ADD}\nz = Relu(h)", outputs=f"{NCHW_OUT}, {NCHW_OUT[:-1]}z")
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1, "BatchNormalization": 1, "Relu": 1}
    assert effected(result, PASS) == 1


def test_two_op_nhwc_chain_without_a_layer_is_left():
    body = "a = Sub(x, mean_l)\ny = Mul(a, k_l)"
    model = build(body, f"float[1,5,5,{C}] x", NHWC_OUT)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Sub": 1, "Mul": 1}
    assert effected(result, PASS) == 0
    assert (
        "input is not made by a linear layer; the two ops are already one Mul + Add at most"
        in reasons(result, PASS)
    )


def test_constants_not_along_the_conv_channels_are_refused():
    model = build(f"{CONV}\na = Sub(h, h1)\ny = Mul(a, h2)")
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1, "Sub": 1, "Mul": 1}
    assert any(
        "constants vary along axis 2, the channels are on axis 1" in r
        for r in reasons(result, PASS)
    )


def test_nhwc_constants_on_an_nchw_conv_are_refused():
    # [1,1,1,C] constants on a [1,C,5,5] conv output broadcast along W, not the channels
    body = f"{CONV}\na = Sub(h, mean_l)\ny = Mul(a, k_l)"
    model = build(body, f"float[1,{CIN},5,{C}] x", f"float[1,{C},5,{C}] y")
    optimized, result = check_rule(model, PASS)
    assert "Conv" in op_types(optimized) and effected(result, PASS) == 0
    assert any("the channels are on axis 1" in r for r in reasons(result, PASS))


def test_constants_that_broadcast_the_input_up_make_mul_add_not_batchnorm():
    # x has 1 channel; the [1,C,1,1] constants broadcast it to C channels, which a
    # BatchNormalization over x's axis 1 could not do
    model = build(SUB_MUL_ADD.replace("(h,", "(x,"), "float[1,1,5,5] x")
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Mul": 1, "Add": 1}
    assert effected(result, PASS) == 1
