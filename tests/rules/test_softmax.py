"""SoftmaxFusionPass (with the max subtraction, on by default) and SoftmaxNoMaxFusionPass
(without it, off by default): attribute and input axes, opset < 13 (last axis only), the
cases they leave alone with their reasons, where the form without the max differs (Exp
overflow), and the default switches."""

from __future__ import annotations

import numpy as np
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

PASS = "SoftmaxFusionPass"
NO_MAX = "SoftmaxNoMaxFusionPass"


def softmax_model(
    opset=17, axis=-1, max_axis=None, with_max=True, keepdims=1, sum_axes=None, shape="2,3,5"
):
    max_axis = axis if max_axis is None else max_axis
    sum_axes = f"[{axis}]" if sum_axes is None else sum_axes
    if opset >= 18:
        peak = f"mx = ReduceMax<keepdims={keepdims}>(x, max_axes)"
    else:
        peak = f"mx = ReduceMax<keepdims={keepdims}, axes=[{max_axis}]>(x)"
    if opset >= 13:
        total = f"s = ReduceSum<keepdims={keepdims}>(e, sum_axes)"
    else:
        total = f"s = ReduceSum<keepdims={keepdims}, axes={sum_axes}>(e)"
    body = f"""
          sum_axes = Constant<value = int64[{sum_axes.count(",") + 1}] {{{sum_axes[1:-1]}}}>()
          max_axes = Constant<value = int64[1] {{{max_axis}}}>()
          {peak if with_max else ""}
          z = {"Sub(x, mx)" if with_max else "Identity(x)"}
          e = Exp(z)
          {total}
          y = Div(e, s)"""
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[{shape}] x) => (float[{shape}] y) {{{body}
        }}"""
    )


@pytest.mark.parametrize(
    "opset,axis,with_max",
    [
        (17, -1, True),
        (17, 1, True),
        (17, 0, False),
        (17, -1, False),
        (18, -1, True),
        (18, 1, True),
        (18, 1, False),
        (11, 2, True),
        (11, -1, True),
        (11, -1, False),
    ],
)
def test_fuses_into_softmax(opset, axis, with_max):
    model = softmax_model(opset, axis, with_max=with_max)
    name, pattern = (PASS, "softmax") if with_max else (NO_MAX, "softmax_no_max")
    optimized, result = check_rule(model, name)
    expected = {"Softmax": 1} if with_max else {"Softmax": 1, "Identity": 1}
    assert op_types(optimized) == expected
    assert effected(result, name, pattern) == 1
    softmax = next(n for n in optimized.graph if n.op_type == "Softmax")
    assert softmax.attributes["axis"].value in (axis, axis + 3)


@pytest.mark.parametrize(
    "name,kwargs,reason",
    [
        (PASS, {"max_axis": 1}, "ReduceMax and ReduceSum reduce different axes"),
        (PASS, {"sum_axes": "[1, 2]"}, "ReduceSum does not reduce exactly one axis"),
        (
            NO_MAX,
            {"sum_axes": "[1, 2]", "with_max": False},
            "ReduceSum does not reduce exactly one axis",
        ),
        (
            PASS,
            {"opset": 11, "axis": 1},
            "Softmax before opset 13 normalises all dims after axis: not the last axis",
        ),
        (
            NO_MAX,
            {"opset": 11, "axis": 1, "with_max": False},
            "Softmax before opset 13 normalises all dims after axis: not the last axis",
        ),
        (
            PASS,
            {"with_max": False},
            "no max subtraction: Softmax differs where Exp overflows (SoftmaxNoMaxFusionPass)",
        ),
        (NO_MAX, {}, "has the max subtraction (SoftmaxFusionPass)"),
    ],
)
def test_not_fused(name, kwargs, reason):
    model = softmax_model(**kwargs)
    optimized, result = check_rule(model, name)
    assert "Softmax" not in op_types(optimized)
    assert effected(result, name) == 0
    assert reason in reasons(result, name)


OVERFLOW = np.array([[1.0, 2.0, 3.0, 4.0, 100.0], [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)


def test_no_max_form_differs_where_exp_overflows():
    """The note's claim: Exp(100) is inf in float32, so the original row is NaN where
    Softmax gives the right value; with the max subtraction both agree."""
    model = softmax_model(with_max=False, shape="2,5")
    optimized = run_passes(copy_model(model), NO_MAX).model
    assert op_types(optimized)["Softmax"] == 1
    before = run_model(model, {"x": OVERFLOW})["y"]
    after = run_model(optimized, {"x": OVERFLOW})["y"]
    assert np.isnan(before[0]).any()
    assert np.isfinite(after).all()
    assert np.allclose(after[0, 4], 1.0) and np.allclose(after[1], 0.2)
    np.testing.assert_allclose(before[1], after[1], rtol=1e-6)


def test_max_form_agrees_where_exp_would_overflow():
    model = softmax_model(shape="2,5")
    optimized, result = check_rule(model, PASS, feeds={"x": OVERFLOW})
    assert effected(result, PASS) == 1
    got = run_model(optimized, {"x": OVERFLOW})["y"]
    assert np.isfinite(got).all()


def test_no_max_pass_is_off_by_default():
    info = get_pass(NO_MAX)
    assert not info.default
    assert "Exp overflows" in info.note
    assert get_pass(PASS).default
    result = optimize_model(softmax_model(with_max=False))
    assert "Softmax" not in op_types(result.model)
    assert effected(result, PASS) == effected(result, NO_MAX) == 0
    result = optimize_model(softmax_model(with_max=False), enable=[NO_MAX])
    assert op_types(result.model)["Softmax"] == 1
    assert effected(result, NO_MAX, "softmax_no_max") == 1
    result = optimize_model(softmax_model())
    assert op_types(result.model)["Softmax"] == 1
    assert effected(result, PASS, "softmax") == 1


def test_keepdims_zero_is_not_fused():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,5] x) => (float[2,5] y) {
          e = Exp(x)
          a = Constant<value = int64[1] {1}>()
          s = ReduceSum<keepdims=0>(e, a)
          t = Unsqueeze(s, a)
          y = Div(e, t)
        }"""
    )
    # the Div does not read the ReduceSum directly: no match at all
    optimized, result = check_rule(model, NO_MAX)
    assert effected(result, NO_MAX) == 0
    model = softmax_model(keepdims=0, shape="3,5", axis=0, with_max=False)
    optimized, result = check_rule(model, NO_MAX)
    assert "ReduceSum drops the reduced axis (keepdims=0)" in reasons(result, NO_MAX)
    model = softmax_model(keepdims=0, shape="3,5", axis=0)
    optimized, result = check_rule(model, PASS)
    assert "ReduceSum drops the reduced axis (keepdims=0)" in reasons(result, PASS)


def test_shared_exp_is_not_fused():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,5] x) => (float[2,5] y, float[2,5] e) {
          e = Exp(x)
          a = Constant<value = int64[1] {1}>()
          s = ReduceSum(e, a)
          y = Div(e, s)
        }"""
    )
    optimized, result = check_rule(model, NO_MAX)
    assert "Softmax" not in op_types(optimized)
    assert any("graph output" in r for r in reasons(result, NO_MAX))


def test_non_constant_axes_are_not_fused():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,5] x, int64[1] a) => (float[2,5] y) {
          e = Exp(x)
          s = ReduceSum(e, a)
          y = Div(e, s)
        }"""
    )
    result = run_passes(model, NO_MAX)
    assert effected(result, NO_MAX) == 0
    assert "ReduceSum axes are not constant" in reasons(result, NO_MAX)
