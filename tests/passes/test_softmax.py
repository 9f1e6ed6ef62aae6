"""SoftmaxFusionPass: with and without the max subtraction, attribute and input axes,
opset < 13 (last axis only), and the cases it leaves alone with their reasons."""

from __future__ import annotations

import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes

PASS = "SoftmaxFusionPass"


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
        (18, -1, True),
        (18, 1, True),
        (11, 2, True),
        (11, -1, True),
    ],
)
def test_fuses_into_softmax(opset, axis, with_max):
    model = softmax_model(opset, axis, with_max=with_max)
    optimized, result = check_rule(model, PASS)
    expected = {"Softmax": 1} if with_max else {"Softmax": 1, "Identity": 1}
    assert op_types(optimized) == expected
    assert effected(result, PASS, "softmax") == 1
    softmax = next(n for n in optimized.graph if n.op_type == "Softmax")
    assert softmax.attributes["axis"].value in (axis, axis + 3)


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"max_axis": 1}, "ReduceMax and ReduceSum reduce different axes"),
        ({"sum_axes": "[1, 2]", "with_max": False}, "ReduceSum does not reduce exactly one axis"),
        (
            {"opset": 11, "axis": 1},
            "Softmax before opset 13 normalises all dims after axis: not the last axis",
        ),
    ],
)
def test_not_fused(kwargs, reason):
    model = softmax_model(**kwargs)
    optimized, result = check_rule(model, PASS)
    assert "Softmax" not in op_types(optimized)
    assert effected(result, PASS) == 0
    assert reason in reasons(result, PASS)


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
    optimized, result = check_rule(model, PASS)
    assert effected(result, PASS) == 0
    model = softmax_model(keepdims=0, shape="3,5", axis=0, with_max=False)
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
    optimized, result = check_rule(model, PASS)
    assert "Softmax" not in op_types(optimized)
    assert any("graph output" in r for r in reasons(result, PASS))


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
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "ReduceSum axes are not constant" in reasons(result, PASS)
