"""AippFusionPass: preprocessing between a graph input and the first Conv folds into the
Conv (scalar and per-channel, through Transposes, same-type Casts, constant Pads whose
value moves into raw space); refused where padding makes it inexact, per-channel Pads,
non-affine Div, other consumers; numeric and idempotent (check_rule)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, copy_model, effected, model_from_text, op_types, reasons, run_passes
from opfuse.rules.aipp import INEXACT_PAD

PASS = "AippFusionPass"
HEAD = '<ir_version: 8, opset_import: ["" : 18]>'
rng = np.random.default_rng(0)


def make(chain: str, conv: str = "Conv", out: str = "float[1,8,4,4] y", **inits) -> object:
    text = f"""{HEAD}
    g (float[1,3,6,6] x) => ({out}) {{
      {chain}
      y = {conv}(p, w, bias)
    }}"""
    params = {
        "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "bias": rng.standard_normal(8).astype(np.float32),
        "scale": np.array(1 / 127.5, np.float32),
        "shift": np.array(-1.0, np.float32),
        "mean": rng.standard_normal((3, 1, 1)).astype(np.float32),
        "std": rng.uniform(0.5, 2, (3, 1, 1)).astype(np.float32),
        **inits,
    }
    used = {k: v for k, v in params.items() if k in text}
    return model_from_text(text, used)


def test_scalar_rescaling_folds():
    model = make("a = Mul(x, scale)\n p = Add(a, shift)")
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1}
    assert effected(result, PASS, "aipp_conv") == 1


def test_per_channel_normalization_folds():
    model = make("c = Cast<to=1>(x)\n a = Sub(c, mean)\n p = Div(a, std)")
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1}


def test_nhwc_input_through_transpose():
    text = f"""{HEAD}
    g (float[1,6,6,3] x) => (float[1,8,4,4] y) {{
      a = Sub(x, mean)
      b = Mul(a, k)
      p = Transpose<perm=[0,3,1,2]>(b)
      y = Conv<group=1>(p, w)
    }}"""
    inits = {
        "mean": rng.standard_normal(3).astype(np.float32),
        "k": rng.uniform(0.5, 2, 3).astype(np.float32),
        "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
    }
    optimized, _ = check_rule(model_from_text(text, inits), PASS)
    assert op_types(optimized) == {"Transpose": 1, "Conv": 1}


def test_grouped_conv_folds():
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    chain = "a = Sub(x, mean)\n p = Div(a, std)"
    model = make(
        chain, conv="Conv<group=3>", out="float[1,6,4,4] y", w=w, bias=np.ones(6, np.float32)
    )
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1}


def test_constant_pad_value_moves_to_raw_space():
    chain = "a = Mul(x, scale)\n b = Add(a, shift)\n p = Pad(b, pads)"
    model = make(chain, out="float[1,8,6,6] y", pads=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized) == {"Pad": 1, "Conv": 1}


def test_zero_shift_folds_through_conv_padding():
    model = make("p = Mul(x, std)", conv="Conv<pads=[1,1,1,1]>", out="float[1,8,6,6] y")
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1}


def refused(model) -> list[str]:
    result = run_passes(copy_model(model), PASS)
    assert effected(result, PASS) == 0
    return reasons(result, PASS)


def test_shift_with_conv_padding_is_refused():
    model = make(
        "a = Mul(x, scale)\n p = Add(a, shift)", conv="Conv<pads=[1,1,1,1]>", out="float[1,8,6,6] y"
    )
    assert INEXACT_PAD in refused(model)


def test_pad_after_per_channel_normalization_is_refused():
    chain = "a = Sub(x, mean)\n b = Div(a, std)\n p = Pad(b, pads)"
    model = make(chain, out="float[1,8,6,6] y", pads=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    assert any("no single raw pad value" in r for r in refused(model))


def test_constant_divided_by_image_is_refused():
    assert "Div of a constant by the image is not affine" in refused(make("p = Div(scale, x)"))


def test_other_consumer_is_refused():
    text = f"""{HEAD}
    g (float[1,3,6,6] x) => (float[1,8,4,4] y, float[1,3,6,6] z) {{
      p = Mul(x, scale)
      z = Relu(p)
      y = Conv(p, w)
    }}"""
    inits = {
        "scale": np.array(2.0, np.float32),
        "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
    }
    assert any("another consumer" in r for r in refused(model_from_text(text, inits)))


def test_not_per_channel_is_refused():
    model = make("p = Mul(x, k)", k=rng.standard_normal((1, 3, 6, 6)).astype(np.float32))
    assert "the preprocessing is not per channel" in refused(model)


@pytest.mark.parametrize("chain", ["p = Relu(x)", "p = Identity(x)"])
def test_no_preprocessing_no_match(chain):
    result = run_passes(make(chain), PASS)
    assert effected(result, PASS) == 0 and not reasons(result, PASS)
