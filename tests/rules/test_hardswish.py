"""HardSwishFusionPass: the written-out forms fold into HardSwish (numbers checked against
onnxruntime with its optimizations off, and a second run changes nothing); near misses
and shared intermediates stay, with their reasons; before opset 14 the pass does not run."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes

PASS = "HardSwishFusionPass"
SIXTH = "0.16666667"

# the edges of the piecewise function, both signs of zero, and ordinary values
EDGES = np.array(
    [
        [-1e4, -6.0, -3.0000002, -3.0, -2.9999998, -1.0, -0.0, 0.0, 0.5, 2.9999998, 3.0, 3.0000002],
        [5.9, 6.0, 7.5, 1e4, -0.25, 0.25, -4.5, 4.5, 1.25, -1.25, 2.0, -2.0],
    ],
    dtype=np.float32,
)

FORMS = {
    "div": "p = Mul(x, c)\n y = Div(p, six)",
    "div_operands_swapped": "p = Mul(c, x)\n y = Div(p, six)",
    "mul_sixth": "p = Mul(x, c)\n y = Mul(sixth, p)",
    "x_times_sixth_of_clip": "h = Div(c, six)\n y = Mul(h, x)",
    "x_times_clip_times_sixth": "h = Mul(c, sixth)\n y = Mul(x, h)",
}


def model(body: str, opset: int = 14, three: str = "3.0", high: str = "6.0", add="Add(x, three)"):
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[2, 12] x) => (float[2, 12] y) {{
          three = Constant <value = float {{{three}}}> ()
          zero = Constant <value = float {{0.0}}> ()
          high = Constant <value = float {{{high}}}> ()
          six = Constant <value = float {{6.0}}> ()
          sixth = Constant <value = float {{{SIXTH}}}> ()
          a = {add}
          c = Clip(a, zero, high)
          {body}
        }}"""
    )


@pytest.mark.parametrize("form", sorted(FORMS))
def test_written_out_forms_fold_into_hardswish(form):
    optimized, result = check_rule(model(FORMS[form]), PASS, feeds={"x": EDGES})
    assert op_types(optimized) == {"HardSwish": 1}
    assert effected(result, PASS) == 1


def test_x_times_hard_sigmoid_folds():
    m = model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[2, 12] x) => (float[2, 12] y) {{
          h = HardSigmoid <alpha = {SIXTH}, beta = 0.5> (x)
          y = Mul(x, h)
        }}"""
    )
    optimized, _ = check_rule(m, PASS, feeds={"x": EDGES})
    assert op_types(optimized) == {"HardSwish": 1}


@pytest.mark.parametrize(
    "near_miss",
    [
        model(FORMS["div"], three="2.5"),  # a shifted hard sigmoid
        model(FORMS["div"], high="5.0"),  # a Relu5
        model(FORMS["div"].replace("Mul(x, c)", "Mul(c, c)")),  # not x times it
    ],
    ids=["plus_2.5", "relu5", "clip_squared"],
)
def test_near_misses_do_not_match(near_miss):
    result = run_passes(near_miss, PASS)
    assert "HardSwish" not in op_types(result.model)
    assert effected(result, PASS) == 0
    assert reasons(result, PASS) == []  # no match at all, so no reason either


def test_the_clip_of_another_tensor_does_not_match():
    m = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[2, 12] x, float[2, 12] z) => (float[2, 12] y) {
          three = Constant <value = float {3.0}> ()
          zero = Constant <value = float {0.0}> ()
          high = Constant <value = float {6.0}> ()
          six = Constant <value = float {6.0}> ()
          a = Add(z, three)
          c = Clip(a, zero, high)
          p = Mul(x, c)
          y = Div(p, six)
        }"""
    )
    assert effected(run_passes(m, PASS), PASS) == 0


def test_hard_sigmoid_with_other_slope_does_not_match():
    m = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[2, 12] x) => (float[2, 12] y) {
          h = HardSigmoid <alpha = 0.2, beta = 0.5> (x)
          y = Mul(x, h)
        }"""
    )
    assert effected(run_passes(m, PASS), PASS) == 0


def test_a_shared_intermediate_is_refused_with_the_engine_reason():
    m = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[2, 12] x) => (float[2, 12] y, float[2, 12] c) {
          three = Constant <value = float {3.0}> ()
          zero = Constant <value = float {0.0}> ()
          high = Constant <value = float {6.0}> ()
          six = Constant <value = float {6.0}> ()
          a = Add(x, three)
          c = Clip(a, zero, high)
          p = Mul(x, c)
          y = Div(p, six)
        }"""
    )
    result = run_passes(m, PASS)
    assert "HardSwish" not in op_types(result.model)
    assert any("graph output" in r for r in reasons(result, PASS))


def test_a_constant_of_higher_rank_is_refused():
    m = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[12] x) => (float[1, 12] y) {
          three = Constant <value = float {3.0}> ()
          zero = Constant <value = float {0.0}> ()
          high = Constant <value = float {6.0}> ()
          six = Constant <value = float[1, 1] {6.0}> ()
          a = Add(x, three)
          c = Clip(a, zero, high)
          p = Mul(x, c)
          y = Div(p, six)
        }"""
    )
    result = run_passes(m, PASS)
    assert "HardSwish" not in op_types(result.model)
    assert reasons(result, PASS) == ["the six constant's rank may broadcast the output up"]


def test_before_opset_14_the_pass_does_not_run():
    result = run_passes(model(FORMS["div"], opset=13), PASS)
    assert "HardSwish" not in op_types(result.model)
    assert effected(result, PASS) == 0
