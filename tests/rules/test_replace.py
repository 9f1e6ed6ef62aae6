"""PowToMulFusionPass (exponents 2, 3, 1, -1; on by default), PowToMulInGeluFusionPass
(the x^3 of a tanh GELU, which the first leaves alone; off by default) and
PowToSqrtFusionPass (0.5, -0.5; off by default): each exponent's replacement, the exponents
and inputs they leave alone (with their reasons), numeric against onnxruntime (special
values included), idempotent, and the default switches."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from helpers import (
    check_rule,
    copy_model,
    effected,
    model_from_text,
    op_types,
    reasons,
    run_model,
    run_passes,
)
from opfuse.pipeline.conductor import optimize_model
from opfuse.rules import get_pass
from transformer_models import gpt2_mlp

PASS = "PowToMulFusionPass"
IN_GELU = "PowToMulInGeluFusionPass"
SQRT = "PowToSqrtFusionPass"
SPECIAL = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1e30, -1e30, 1e-39, -1e-39, 1e13, -1e13, 2.5]


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


def raw_pow_model(exponent: float, dtype: str = "float"):
    """Pow on Neg(x), so special values (-inf, -0) reach it."""
    np_dtype = {"float": np.float32, "double": np.float64, "float16": np.float16}[dtype]
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({dtype}[N] x) => ({dtype}[N] y) <{dtype} e> {{
          a = Neg(x)
          y = Pow(a, e)
        }}""",
        {"e": np.array(exponent, np_dtype)},
    )


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: the same float bit pattern (so -0 != +0), or both NaN."""
    both_nan = np.isnan(a) & np.isnan(b)
    return both_nan | ((a == b) & (np.signbit(a) == np.signbit(b)))


@pytest.mark.parametrize(
    "exponent,ops",
    [
        ("2.0", {"Abs": 1, "Mul": 1}),
        ("3.0", {"Abs": 1, "Mul": 2}),
        ("1.0", {"Abs": 1}),
        ("-1.0", {"Abs": 1, "Reciprocal": 1}),
    ],
)
def test_pow_is_replaced(exponent, ops):
    optimized, result = check_rule(pow_model(exponent), PASS)
    assert op_types(optimized) == ops
    assert effected(result, PASS, "pow_to_mul") == 1


@pytest.mark.parametrize(
    "exponent,ops",
    [
        ("0.5", {"Abs": 1, "Sqrt": 1}),
        ("-0.5", {"Abs": 1, "Sqrt": 1, "Reciprocal": 1}),
    ],
)
def test_pow_is_replaced_by_sqrt(exponent, ops):
    optimized, result = check_rule(pow_model(exponent), SQRT)
    assert op_types(optimized) == ops
    assert effected(result, SQRT, "pow_to_sqrt") == 1


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("exponent,ops", [("2", {"Abs": 1, "Mul": 1}), ("3", {"Abs": 1, "Mul": 2})])
def test_integer_exponent_and_input(dtype, exponent, ops):
    optimized, result = check_rule(pow_model(exponent, dtype, dtype), PASS)
    assert op_types(optimized) == ops
    assert effected(result, PASS) == 1


def test_int32_exponent_one():
    optimized, result = check_rule(pow_model("1", "int32", "int32"), PASS)
    assert op_types(optimized) == {"Abs": 1}
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
        ("1", "int64", "int64", "", "onnxruntime's Pow(int64, 1) rounds through double"),
        ("0.5", "float", "float", "", "exponent 0.5 needs Sqrt, which differs on -inf and -0"),
        ("-0.5", "float", "float", "", "exponent -0.5 needs Sqrt, which differs on -inf and -0"),
    ],
)
def test_not_replaced(exponent, dtype, e_type, e_shape, reason):
    model = pow_model(exponent, dtype, e_type, e_shape)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized)["Pow"] == 1
    assert effected(result, PASS) == 0
    assert any(r.startswith(reason) for r in reasons(result, PASS)), reasons(result, PASS)


@pytest.mark.parametrize(
    "exponent,dtype,e_type,e_shape,reason",
    [
        ("2.0", "float", "float", "", "exponent 2 has no cheaper form"),
        ("0.5, 0.5, 0.5", "float", "float", "[3]", "exponent is not a single value"),
        ("0.5", "float", "float", "[1,1,1]", "exponent's rank may broadcast the output"),
        ("0.5", "int64", "float", "", "exponent 0.5 needs a float input"),
    ],
)
def test_not_replaced_by_sqrt(exponent, dtype, e_type, e_shape, reason):
    model = pow_model(exponent, dtype, e_type, e_shape)
    optimized, result = check_rule(model, SQRT)
    assert op_types(optimized)["Pow"] == 1
    assert effected(result, SQRT) == 0
    assert reason in reasons(result, SQRT)


def test_int64_exponent_one_really_differs_in_onnxruntime():
    """Why exponent 1 on int64 is left alone: onnxruntime's Pow rounds through double."""
    x = np.array([2**53 + 1, np.iinfo(np.int64).max] * 3, np.int64).reshape(2, 3)
    y = run_model(pow_model("1", "int64", "int64"), {"x": x})["y"]
    assert (y != x).all(), y


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


@pytest.mark.parametrize("dtype", ["float", "double", "float16"])
@pytest.mark.parametrize("exponent", [2.0, 3.0, 1.0, -1.0])
def test_default_pass_is_exact_on_special_values(exponent, dtype):
    """inf, -inf, NaN, -0, +0, overflow and denormals: the same bits as onnxruntime's Pow."""
    model = raw_pow_model(exponent, dtype)
    np_dtype = {"float": np.float32, "double": np.float64, "float16": np.float16}[dtype]
    with np.errstate(over="ignore"):
        x = np.array(SPECIAL, np_dtype)
    optimized, result = check_rule(model, PASS, feeds={"x": x})
    assert effected(result, PASS) == 1
    want, got = run_model(model, {"x": x})["y"], run_model(optimized, {"x": x})["y"]
    assert same_bits(want, got).all(), (x, want, got)


@pytest.mark.parametrize(
    "exponent,x,want,got",
    [
        (0.5, -np.inf, np.inf, np.nan),
        (0.5, -0.0, 0.0, -0.0),
        (-0.5, -np.inf, 0.0, np.nan),
        (-0.5, -0.0, np.inf, -np.inf),
    ],
)
def test_sqrt_pass_differs_on_special_values_as_its_note_says(exponent, x, want, got):
    model = raw_pow_model(exponent)
    optimized = run_passes(copy_model(model), SQRT).model
    assert "Pow" not in op_types(optimized)
    feeds = {"x": -np.array([x], np.float32)}  # the model negates it
    before, after = run_model(model, feeds)["y"], run_model(optimized, feeds)["y"]
    assert same_bits(before, np.array([want], np.float32)).all(), before
    assert same_bits(after, np.array([got], np.float32)).all(), after
    assert not same_bits(before, after).any()


def test_sqrt_pass_is_exact_elsewhere():
    model = raw_pow_model(0.5)
    feeds = {"x": -np.array([np.inf, np.nan, 0.0, 1e-39, 2.5, 1e30, -1.0], np.float32)}
    optimized, _ = check_rule(model, SQRT, feeds=feeds)
    before, after = run_model(model, feeds)["y"], run_model(optimized, feeds)["y"]
    assert same_bits(before, after).all(), (before, after)


def test_sqrt_pass_is_off_by_default():
    info = get_pass(SQRT)
    assert not info.default
    assert "Pow(-inf, 0.5) is +inf where Sqrt gives NaN" in info.note
    assert get_pass(PASS).default
    for exponent in ("0.5", "-0.5"):
        result = optimize_model(pow_model(exponent))
        assert op_types(result.model)["Pow"] == 1
        assert effected(result, SQRT) == 0
        result = optimize_model(pow_model(exponent), enable=[SQRT])
        assert "Pow" not in op_types(result.model)
        assert effected(result, SQRT, "pow_to_sqrt") == 1


def gpt2_gelu():
    """GPT-2's MLP: Linear -> 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
    -> Linear, then a lone pow(y, 3) (output ``cube``) that is no GELU's."""
    return ir.from_proto(gpt2_mlp())


def pow_nodes(model) -> list[str]:
    return sorted(n.name or "" for n in model.graph if n.op_type == "Pow")


def test_pow_of_a_tanh_gelu_is_left_alone():
    optimized, result = check_rule(gpt2_gelu(), PASS)
    assert pow_nodes(optimized) == ["b0/pow"]  # the GELU's; the lone x^3 became Muls
    assert effected(result, PASS, "pow_to_mul") == 1
    assert any(
        r.startswith("the Pow is the x^3 of a tanh GELU, which onnxruntime fuses into FastGelu")
        for r in reasons(result, PASS)
    ), reasons(result, PASS)


@pytest.mark.parametrize(
    "change",
    [
        ("b0.c", 0.05),  # not GELU's coefficient
        ("b0.s", 0.8),  # not sqrt(2/pi)
        ("b0.one", 2.0),  # 2 + tanh
        ("b0.half", 0.25),  # 0.25 * x * (...)
    ],
)
def test_a_pow_in_a_near_gelu_is_replaced(change):
    """The chain must be the GELU's, constants included, for the Pow to be left alone."""
    model = gpt2_gelu()
    name, value = change
    model.graph.initializers[name].const_value = ir.tensor(np.array(value, np.float32), name=name)
    optimized, result = check_rule(model, PASS)
    assert pow_nodes(optimized) == []
    assert effected(result, PASS, "pow_to_mul") == 2


def test_gelu_pass_rewrites_only_the_gelu_pow():
    optimized, result = check_rule(gpt2_gelu(), IN_GELU)
    assert pow_nodes(optimized) == ["cube"]  # the lone x^3 is PowToMulFusionPass's
    assert effected(result, IN_GELU, "pow_to_mul_in_gelu") == 1
    assert "not the x^3 of a tanh GELU (PowToMulFusionPass rewrites it)" in reasons(result, IN_GELU)
    both, _ = check_rule(gpt2_gelu(), PASS, IN_GELU)
    assert pow_nodes(both) == []
    assert op_types(both)["Mul"] == op_types(gpt2_gelu())["Mul"] + 4


def test_gelu_pow_is_rewritten_only_when_asked():
    info = get_pass(IN_GELU)
    assert not info.default
    assert "only while x^3 is a Pow" in info.note
    assert "tanh GELU (GPT-2's) is left alone" in get_pass(PASS).note
    assert pow_nodes(optimize_model(gpt2_gelu()).model) == ["b0/pow"]
    assert pow_nodes(optimize_model(gpt2_gelu(), enable=[IN_GELU]).model) == []


def test_gelu_pow_numbers_match_onnxruntime():
    """Mul(Mul(x, x), x) is onnxruntime's own Pow(x, 3): the same bits on the GELU."""
    model = gpt2_gelu()
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32) * 3}
    optimized, _ = check_rule(model, IN_GELU, PASS, feeds=feeds)
    want, got = run_model(model, feeds), run_model(optimized, feeds)
    for name in want:
        assert same_bits(want[name], got[name]).all(), name


def test_tune_measures_the_gelu_pow_rewrite():
    """Off by default, the rewrite is one of the flips opfuse tune measures on the runtime."""
    from opfuse.tuning.variants import DEFAULT, Variant, probe

    found = probe(gpt2_gelu())
    assert IN_GELU in found.matched
    assert Variant(switches=((IN_GELU, True),)) in found.flips(DEFAULT)
