"""ConstantPushDownFusionPass, NeutralElementFusionPass and MulByZeroFusionPass (off by
default): each rule fires, refuses with its reason, keeps the numbers, is idempotent."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes
from opfuse.rules import get_pass

PUSH = "ConstantPushDownFusionPass"
NEUTRAL = "NeutralElementFusionPass"
ZERO = "MulByZeroFusionPass"
HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def model(body, inputs="float[2,3] x", outputs="float[2,3] y", inits=None):
    used = {k: v for k, v in (inits or {}).items() if f"{k})" in body or f"{k}," in body}
    return model_from_text(f"{HEAD}\ng ({inputs}) => ({outputs}) {{\n{body}\n}}", used)


C = {"a": np.array([1.5, -2.0, 3.0], np.float32), "b": np.array(0.25, np.float32)}
CI = {"a": np.array([3, -2, 7], np.int64), "b": np.array(5, np.int64)}


@pytest.mark.parametrize(
    "body,op",
    [
        ("t = Add(x, a)\n y = Add(b, t)", "Add"),
        ("t = Sub(x, a)\n y = Add(t, b)", "Add"),
        ("t = Add(x, a)\n y = Sub(t, b)", "Add"),
        ("t = Sub(a, x)\n y = Add(t, b)", "Sub"),
        ("t = Sub(x, a)\n y = Sub(b, t)", "Sub"),
        ("t = Sub(a, x)\n y = Sub(b, t)", "Add"),
        ("t = Add(x, a)\n y = Sub(b, t)", "Sub"),
        ("t = Sub(x, a)\n y = Sub(t, b)", "Sub"),
        ("t = Mul(x, a)\n y = Mul(b, t)", "Mul"),
        ("t = Div(x, a)\n y = Mul(t, b)", "Mul"),
        ("t = Mul(x, a)\n y = Div(t, b)", "Mul"),
        ("t = Div(x, a)\n y = Div(t, b)", "Div"),
        ("t = Div(a, x)\n y = Mul(t, b)", "Div"),
        ("t = Mul(x, a)\n y = Div(b, t)", "Div"),
        ("t = Div(a, x)\n y = Div(b, t)", "Mul"),
        ("t = Sub(a, x)\n y = Sub(t, b)", "Sub"),
        ("t = Div(a, x)\n y = Div(t, b)", "Div"),
        ("t = Div(x, a)\n y = Div(b, t)", "Div"),
        ("t = Mul(x, a)\n y = Div(t, b)", "Mul"),
    ],
)
def test_push_down_float(body, op):
    m = model(body, inits=C)
    optimized, result = check_rule(m, PUSH)
    assert effected(result, PUSH) == 1
    assert op_types(optimized) == {op: 1}


@pytest.mark.parametrize(
    "body,op",
    [
        ("t = Add(x, a)\n y = Add(b, t)", "Add"),
        ("t = Sub(a, x)\n y = Sub(t, b)", "Sub"),
        ("t = Mul(x, a)\n y = Mul(t, b)", "Mul"),
        ("t = Sub(x, a)\n y = Add(t, b)", "Add"),
        ("t = Add(x, a)\n y = Sub(t, b)", "Add"),
        ("t = Sub(x, a)\n y = Sub(b, t)", "Sub"),
        ("t = Sub(a, x)\n y = Sub(b, t)", "Add"),
        ("t = Add(x, a)\n y = Sub(b, t)", "Sub"),
        ("t = Mul(a, x)\n y = Mul(b, t)", "Mul"),
    ],
)
def test_push_down_integer_is_exact(body, op):
    m = model(body, inputs="int64[2,3] x", outputs="int64[2,3] y", inits=CI)
    optimized, result = check_rule(m, PUSH)
    assert op_types(optimized) == {op: 1}


@pytest.mark.parametrize(
    "body,reason,dtype",
    [
        ("t = Div(x, a)\n y = Div(t, b)", "integer division does not reassociate", "int64"),
        ("t = Mul(x, a)\n y = Div(t, b)", "integer division does not reassociate", "int64"),
        ("t = Div(x, a)\n y = Mul(t, b)", "integer division does not reassociate", "int64"),
        ("t = Div(a, x)\n y = Div(b, t)", "integer division does not reassociate", "int32"),
    ],
)
def test_push_down_refuses(body, reason, dtype):
    inits = {k: v.astype(dtype) for k, v in CI.items()} if "int" in dtype else C
    m = model(body, inputs=f"{dtype}[2,3] x", outputs=f"{dtype}[2,3] y", inits=inits)
    feeds = {"x": np.full((2, 3), 1, dtype)}  # no integer division by zero
    optimized, result = check_rule(m, PUSH, feeds=feeds)
    assert reason in reasons(result, PUSH)
    assert sum(op_types(optimized).values()) == 2


def test_push_down_refuses_non_finite_and_zero_divisors():
    inf = {"a": np.array([np.inf, 1, 2], np.float32), "b": np.array(2.0, np.float32)}
    _, result = check_rule(model("t = Mul(x, a)\n y = Mul(t, b)", inits=inf), PUSH)
    assert "a constant is not finite" in reasons(result, PUSH)
    zero = {"a": np.array([0, 1, 2], np.float32), "b": np.array(2.0, np.float32)}
    result = run_passes(model("t = Div(x, a)\n y = Mul(t, b)", inits=zero), PUSH)
    assert "a divisor constant has zeros" in reasons(result, PUSH)
    big = {"a": np.array(3e38, np.float32), "b": np.array(10.0, np.float32)}
    _, result = check_rule(model("t = Mul(x, a)\n y = Mul(t, b)", inits=big), PUSH)
    assert "the combined constant overflows" in reasons(result, PUSH)


def test_push_down_needs_a_private_inner_node():
    m = model("t = Add(x, a)\n u = Add(t, b)\n y = Mul(t, u)", inits=C)
    optimized, result = check_rule(m, PUSH)
    assert any("another consumer" in r for r in reasons(result, PUSH))
    assert op_types(optimized) == {"Add": 2, "Mul": 1}


def test_sum_merges_its_constants():
    m = model("y = Sum(a, x, b, x)", inits=C)
    optimized, result = check_rule(m, PUSH)
    assert effected(result, PUSH, "sum_constants") == 1
    (node,) = optimized.graph
    assert len(node.inputs) == 3


def test_sum_with_one_constant_stays():
    m = model("y = Sum(a, x, x)", inits=C)
    optimized, result = check_rule(m, PUSH)
    assert effected(result, PUSH) == 0
    (node,) = optimized.graph
    assert len(node.inputs) == 3


def test_concat_merges_adjacent_constants():
    inits = {"a": np.ones((1, 3), np.float32), "b": np.zeros((2, 3), np.float32)}
    m = model("y = Concat<axis=0>(x, a, b, x)", outputs="float[7,3] y", inits=inits)
    optimized, result = check_rule(m, PUSH)
    assert effected(result, PUSH, "concat_constants") == 1
    (node,) = optimized.graph
    assert len(node.inputs) == 3


def test_concat_keeps_separated_constants():
    inits = {"a": np.ones((1, 3), np.float32), "b": np.zeros((2, 3), np.float32)}
    m = model("y = Concat<axis=0>(a, x, b)", outputs="float[5,3] y", inits=inits)
    result = run_passes(m, PUSH)
    assert effected(result, PUSH) == 0


# --- neutral elements --------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "t = Add(x, z)\n y = Relu(t)",
        "t = Add(z, x)\n y = Relu(t)",
        "t = Sub(x, z)\n y = Relu(t)",
        "t = Mul(x, o)\n y = Relu(t)",
        "t = Mul(o, x)\n y = Relu(t)",
        "t = Div(x, o)\n y = Relu(t)",
    ],
)
def test_neutral_elements_go(body):
    inits = {"z": np.zeros(3, np.float32), "o": np.ones((1, 3), np.float32)}
    optimized, result = check_rule(model(body, inits=inits), NEUTRAL)
    assert effected(result, NEUTRAL, "neutral_element") == 1
    assert op_types(optimized) == {"Relu": 1}


def test_neutral_element_that_broadcasts_becomes_expand():
    inits = {"z": np.zeros((4, 2, 3), np.float32)}
    m = model("t = Add(x, z)\n y = Relu(t)", outputs="float[4,2,3] y", inits=inits)
    optimized, result = check_rule(m, NEUTRAL)
    assert op_types(optimized) == {"Expand": 1, "Relu": 1}


def test_neutral_element_that_broadcasts_a_dynamic_shape_stays():
    inits = {"z": np.zeros((4, 1, 3), np.float32)}
    m = model(
        "t = Add(x, z)\n y = Relu(t)",
        inputs="float[N,3] x",
        outputs="float[4,N,3] y",
        inits=inits,
    )
    optimized, result = check_rule(m, NEUTRAL)
    assert "the constant broadcasts x to a shape that is not static" in reasons(result, NEUTRAL)
    assert op_types(optimized) == {"Add": 1, "Relu": 1}


def test_zero_minus_is_sub_not_neutral():
    inits = {"z": np.zeros(3, np.float32)}
    optimized, result = check_rule(model("t = Sub(z, x)\n y = Relu(t)", inits=inits), NEUTRAL)
    assert effected(result, NEUTRAL, "zero_minus_one_div") == 1
    assert op_types(optimized) == {"Neg": 1, "Relu": 1}


def test_one_div_becomes_reciprocal():
    inits = {"o": np.ones(3, np.float32)}
    optimized, _ = check_rule(model("t = Div(o, x)\n y = Relu(t)", inits=inits), NEUTRAL)
    assert op_types(optimized) == {"Reciprocal": 1, "Relu": 1}


@pytest.mark.parametrize(
    "body,dtype,reason",
    [
        ("y = Div(o, x)", "int64", "Reciprocal needs a float input"),
        ("y = Sub(z, x)", "uint8", "Neg needs a signed input"),
    ],
)
def test_constant_operand_refuses(body, dtype, reason):
    np_dtype = np.dtype(dtype)
    inits = {"o": np.ones(3, np_dtype), "z": np.zeros(3, np_dtype)}
    m = model(body, inputs=f"{dtype}[2,3] x", outputs=f"{dtype}[2,3] y", inits=inits)
    feeds = {"x": np.full((2, 3), 2, np_dtype)}  # no integer division by zero
    optimized, result = check_rule(m, NEUTRAL, feeds=feeds)
    assert reason in reasons(result, NEUTRAL)
    assert op_types(optimized) in ({"Div": 1}, {"Sub": 1})


def test_zero_minus_that_broadcasts_stays():
    inits = {"z": np.zeros((4, 2, 3), np.float32)}
    m = model("y = Sub(z, x)", outputs="float[4,2,3] y", inits=inits)
    optimized, result = check_rule(m, NEUTRAL)
    assert "the constant broadcasts y to a larger shape" in reasons(result, NEUTRAL)


def test_non_neutral_constant_does_not_match():
    inits = {"z": np.array([0, 0, 1e-30], np.float32)}
    result = run_passes(model("t = Add(x, z)\n y = Relu(t)", inits=inits), NEUTRAL)
    assert effected(result, NEUTRAL) == 0


# --- x * 0 ---------------------------------------------------------------------------


def test_mul_by_zero_is_off_by_default_and_documented():
    info = get_pass(ZERO)
    assert info.default is False
    assert "NaN" in info.note


@pytest.mark.parametrize("x", ["float[2,3] x", "float[N,3] x"])
def test_mul_by_zero_gives_zeros(x):
    inits = {"z": np.zeros(3, np.float32)}
    out = x.replace(" x", " y")
    optimized, result = check_rule(
        model("t = Mul(x, z)\n y = Relu(t)", inputs=x, outputs=out, inits=inits), ZERO
    )
    assert effected(result, ZERO) == 1
    assert "Mul" not in op_types(optimized)


def test_mul_by_zero_unknown_broadcast_stays():
    inits = {"z": np.zeros((4, 1, 3), np.float32)}
    m = model("y = Mul(x, z)", inputs="float[N,3] x", outputs="float[4,N,3] y", inits=inits)
    _, result = check_rule(m, ZERO)
    assert "the constant broadcasts x to a shape that is not static" in reasons(result, ZERO)


# --- constants are combined by the ONNX evaluators, never by hand -----------------------


def test_constants_are_combined_by_the_onnx_evaluators(monkeypatch):
    import opfuse.rewrite.evaluate as _evaluate

    def unavailable(proto):
        raise RuntimeError("reference evaluator unavailable")

    ran = []
    real = _evaluate._onnxruntime

    def onnxruntime(proto):
        ran.append(proto.graph.node[0].op_type)
        return real(proto)

    # with the reference evaluator gone, onnxruntime computes every combined constant
    monkeypatch.setattr(_evaluate, "_reference", unavailable)
    monkeypatch.setattr(_evaluate, "_onnxruntime", onnxruntime)
    monkeypatch.setattr(_evaluate, "_cache", {})
    monkeypatch.setattr(_evaluate, "_memo", {})
    inits = {**C, "c": np.ones((1, 3), np.float32), "d": np.zeros((1, 3), np.float32)}
    for body, out in [
        ("t = Sub(x, a)\n y = Add(t, b)", "float[2,3] y"),
        ("t = Div(a, x)\n y = Mul(t, b)", "float[2,3] y"),
        ("y = Sum(a, x, b)", "float[2,3] y"),
        ("y = Concat<axis=0>(x, c, d)", "float[4,3] y"),
    ]:
        optimized, result = check_rule(model(body, outputs=out, inits=inits), PUSH)
        assert effected(result, PUSH) == 1
    assert ran == ["Sub", "Mul", "Sum", "Concat"]  # each built once, cached after


def test_constants_that_would_grow_the_model_are_not_combined():
    inits = {"a": np.ones((64, 1), np.float32), "b": np.ones((1, 64), np.float32)}
    m = model(
        "t = Add(x, a)\n y = Add(t, b)",
        inputs="float[64,64] x",
        outputs="float[64,64] y",
        inits=inits,
    )
    optimized, result = check_rule(m, PUSH)
    assert "the combined constant would be larger than its parts" in reasons(result, PUSH)
    assert op_types(optimized) == {"Add": 2}


def test_neutral_element_between_graph_input_and_output_becomes_identity():
    inits = {"z": np.zeros(3, np.float32)}
    optimized, result = check_rule(model("y = Add(x, z)", inits=inits), NEUTRAL)
    assert effected(result, NEUTRAL, "neutral_element") == 1
    assert op_types(optimized) == {"Identity": 1}
    assert [v.name for v in optimized.graph.outputs] == ["y"]


def test_neutral_element_of_an_outer_value_in_a_branch_becomes_identity():
    m = model_from_text(
        f"{HEAD}\ng (float[2,3] x, bool c) => (float[2,3] y) {{\n"
        " a = Relu(x)\n z = Constant<value=float[3] {0,0,0}>()\n"
        " y = If(c) <then_branch = g1 () => (float[2,3] o1) { o1 = Add(a, z) },"
        " else_branch = g2 () => (float[2,3] o2) { o2 = Neg(x) }>\n}"
    )
    feeds = {"x": np.ones((2, 3), np.float32), "c": np.array(True)}
    optimized, result = check_rule(m, NEUTRAL, feeds=feeds)  # the checker: a valid branch
    assert effected(result, NEUTRAL) == 1
    assert op_types(optimized)["Identity"] == 1
