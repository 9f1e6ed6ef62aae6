"""Relu6QuantFusionPass: Clip(0, 6)/Relu before QuantizeLinear removed when the
quantized range clips at both bounds, Clip(0, 6) turned into Relu when only the upper
bound is implied, and kept otherwise, per case (uint8/int8, per-tensor/per-axis, Clip
as inputs or attributes)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons

PASS = "Relu6QuantFusionPass"
C = 3


def quant_model(act="clip", scale=6 / 255, zp=0, dtype="uint8", opset=17, extra="", axis=None):
    scale_arr = np.asarray(scale, np.float32)
    zp_arr = np.asarray(zp, np.uint8 if dtype == "uint8" else np.int8)
    if scale_arr.ndim and zp_arr.ndim == 0:
        zp_arr = np.full(scale_arr.shape, zp, zp_arr.dtype)
    inits = {"scale": scale_arr, "zp": zp_arr}
    if act == "clip" and opset >= 11:
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
        line = "a = Clip(x, lo, hi)"
    elif act == "clip":
        line = "a = Clip<min=0.0, max=6.0>(x)"
    else:
        line = "a = Relu(x)"
    q_attrs = f"<axis={axis}>" if axis is not None else ""
    outputs = f"{dtype}[2,{C},4] y" + (f", float[2,{C},4] z" if extra else "")
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[2,{C},4] x) => ({outputs}) {{
          {line}
          y = QuantizeLinear{q_attrs}(a, scale, zp)
          {extra}
        }}""",
        inits,
    )


def feeds():
    # covers far below 0, [0, 6] and far above 6
    x = np.linspace(-10, 12, 2 * C * 4, dtype=np.float32).reshape(2, C, 4)
    return {"x": x}


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        # uint8, zp 0, scale 6/255: Q(0) = 0 = qmin, Q(6) = 255 = qmax
        ({}, {"QuantizeLinear": 1}),
        ({"opset": 10}, {"QuantizeLinear": 1}),  # Clip bounds as attributes
        # int8, zp -128, scale 6/255: Q(0) = -128, Q(6) = 127
        ({"dtype": "int8", "zp": -128}, {"QuantizeLinear": 1}),
        # Relu into uint8 zp 0: Q(0) = 0 = qmin, no upper bound
        ({"act": "relu"}, {"QuantizeLinear": 1}),
        # 6 / scale = 254.9 rounds to 255 = qmax
        ({"scale": 6 / 254.9}, {"QuantizeLinear": 1}),
        # int8 zp 0, scale 6/127: Q(6) = 127 = qmax, but Q(0) = 0 > -128: Relu stays
        ({"dtype": "int8", "zp": 0, "scale": 6 / 127}, {"Relu": 1, "QuantizeLinear": 1}),
        # per-axis scales, every channel saturates at 0 and at or below 6
        ({"scale": [6 / 255, 6 / 255, 6 / 260], "axis": 1}, {"QuantizeLinear": 1}),
    ],
)
def test_clip_before_quantize_removed_or_relu(kwargs, expected):
    model = quant_model(**kwargs)
    optimized, result = check_rule(model, PASS, feeds=feeds())
    assert op_types(optimized) == expected
    assert effected(result, PASS, "relu6_quant") == 1


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        # Q(6) = 200 < 255: values between 6 and 7.65 would quantize above 200
        ({"scale": 0.03}, "the quantized range [0, 7.65] does not clip at the Clip bounds [0, 6]"),
        # int8 zp 0: Q(0) = 0 > -128 and Relu has no other bound to drop
        (
            {"act": "relu", "dtype": "int8", "zp": 0, "scale": 0.05},
            "the quantized range [-6.4, 6.35] does not clip at the Relu bounds [0, inf]",
        ),
        # one channel's range goes past 6
        (
            {"scale": [6 / 255, 0.05, 6 / 255], "axis": 1},
            "the quantized range [0, 12.75] does not clip at the Clip bounds [0, 6]",
        ),
        ({"extra": "z = Neg(a)"}, "output has another consumer"),
    ],
)
def test_clip_that_matters_stays(kwargs, reason):
    model = quant_model(**kwargs)
    optimized, result = check_rule(model, PASS, feeds=feeds())
    assert op_types(optimized)[kwargs.get("act", "clip").capitalize()] == 1
    assert effected(result, PASS) == 0
    assert any(reason in r for r in reasons(result, PASS)), reasons(result, PASS)


def test_non_constant_scale_is_refused():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x, float s) => (uint8[2,3] y) {
          a = Relu(x)
          y = QuantizeLinear(a, s)
        }"""
    )
    optimized, result = check_rule(
        model, PASS, feeds={"x": feeds()["x"][0, :2, :3], "s": np.array(0.1, np.float32)}
    )
    assert "Relu" in op_types(optimized)
    assert "scale is not a constant" in reasons(result, PASS)
