"""PowToMulFusionPass: each exponent's replacement, the exponents and inputs it leaves
alone (with their reasons), numeric against onnxruntime, idempotent."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes

PASS = "PowToMulFusionPass"


def pow_model(exponent: str, dtype: str = "float", e_type: str = "float", e_shape: str = ""):
    out = "[1,2,3]" if e_shape.count(",") == 2 else "[2,3]"
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({dtype}[2,3] x) => ({dtype}{out} y) {{
          a = Abs(x)
          e = Constant<value = {e_type}{e_shape} {{{exponent}}}>()
          y = Pow(a, e)
        }}"""
    )


@pytest.mark.parametrize(
    "exponent,ops",
    [
        ("2.0", {"Abs": 1, "Mul": 1}),
        ("3.0", {"Abs": 1, "Mul": 2}),
        ("1.0", {"Abs": 1}),
        ("0.5", {"Abs": 1, "Sqrt": 1}),
        ("-1.0", {"Abs": 1, "Reciprocal": 1}),
        ("-0.5", {"Abs": 1, "Sqrt": 1, "Reciprocal": 1}),
    ],
)
def test_pow_is_replaced(exponent, ops):
    optimized, result = check_rule(pow_model(exponent), PASS)
    assert op_types(optimized) == ops
    assert effected(result, PASS, "pow_to_mul") == 1


def test_integer_exponent_and_input():
    optimized, result = check_rule(pow_model("2", "int64", "int64"), PASS)
    assert op_types(optimized) == {"Abs": 1, "Mul": 1}
    assert effected(result, PASS) == 1


def test_one_element_exponent_of_rank_one():
    optimized, _ = check_rule(pow_model("3.0", e_shape="[1]"), PASS)
    assert op_types(optimized) == {"Abs": 1, "Mul": 2}


@pytest.mark.parametrize(
    "exponent,dtype,e_type,e_shape,reason",
    [
        ("4.0", "float", "float", "", "exponent 4 has no cheaper form"),
        ("0.0", "float", "float", "", "exponent 0 has no cheaper form"),
        ("2.0, 3.0, 2.0", "float", "float", "[3]", "exponent is not a single value"),
        ("2.0", "float", "float", "[1,1,1]", "exponent's rank may broadcast the output"),
        ("-1", "int64", "int64", "", "exponent -1 needs a float input"),
    ],
)
def test_not_replaced(exponent, dtype, e_type, e_shape, reason):
    model = pow_model(exponent, dtype, e_type, e_shape)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized)["Pow"] == 1
    assert effected(result, PASS) == 0
    assert reason in reasons(result, PASS)


def test_exponent_not_constant():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x, float e) => (float[2,3] y) {
          y = Pow(x, e)
        }"""
    )
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "e is not a constant" in reasons(result, PASS)


def test_numbers_match_pow_for_positive_and_negative_inputs():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[64] x) => (float[64] y2, float[64] y3, float[64] yr) {
          two = Constant<value = float {2.0}>()
          three = Constant<value = float {3.0}>()
          minus = Constant<value = float {-1.0}>()
          y2 = Pow(x, two)
          y3 = Pow(x, three)
          yr = Pow(x, minus)
        }"""
    )
    feeds = {"x": np.linspace(-4, 4, 64, dtype=np.float32) + np.float32(0.01)}
    optimized, result = check_rule(model, PASS, feeds=feeds)
    assert effected(result, PASS) == 3
    assert "Pow" not in op_types(optimized)
