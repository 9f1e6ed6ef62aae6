"""PadConvFusionPass: zero Pad into Conv pads, into AveragePool (count_include_pad) and
MaxPool (only after a non-negative producer, or a -inf Pad), and every refusal."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import (
    check_rule,
    effected,
    model_from_text,
    op_types,
    reasons,
    run_model,
    run_passes,
)

PASS = "PadConvFusionPass"
rng = np.random.default_rng(0)


def pad_model(
    op="Conv",
    op_attrs="",
    pads="0, 0, 1, 2, 0, 0, 2, 1",
    value="0.0",
    pre="a = Identity(x)",
    mode="constant",
    opset=17,
    axes=None,
):
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    call = "y = Conv" + op_attrs + "(p, w)" if op == "Conv" else f"y = {op}{op_attrs}(p)"
    if op != "Conv":
        inits = {}
    n_pads = pads.count(",") + 1
    if opset < 11:
        pad = f'p = Pad<mode="{mode}", pads=[{pads}], value={value}>(a)'
        consts = ""
    else:
        axes_in = ", axes" if axes else ""
        pad = f'p = Pad<mode="{mode}">(a, pads, value{axes_in})'
        consts = f"""
          pads = Constant<value = int64[{n_pads}] {{{pads}}}>()
          value = Constant<value = float {{{value}}}>()"""
        if axes:
            consts += (
                f"\n          axes = Constant<value = int64[{axes.count(',') + 1}] {{{axes}}}>()"
            )
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[1,3,7,7] x) => (float[1,?,?,?] y) {{{consts}
          {pre}
          {pad}
          {call}
        }}""",
        inits,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"op_attrs": "<pads=[1,1,1,1], strides=[2,2]>"},
        {"op_attrs": '<auto_pad="VALID">'},
        {"opset": 10},
        {"opset": 18, "pads": "1, 2, 2, 1", "axes": "2, 3"},
        {"opset": 18, "pads": "1, 2, 2, 1", "axes": "-2, -1"},
        {"op": "AveragePool", "op_attrs": "<kernel_shape=[3,3]>"},
        {
            "op": "AveragePool",
            "op_attrs": "<kernel_shape=[4,4], pads=[1,1,1,1], count_include_pad=1>",
        },
        {"op": "MaxPool", "op_attrs": "<kernel_shape=[3,3]>", "pre": "a = Relu(x)"},
        {"op": "MaxPool", "op_attrs": "<kernel_shape=[3,3]>", "pre": "a = Sigmoid(x)"},
        {"op": "MaxPool", "op_attrs": "<kernel_shape=[3,3], strides=[2,2]>", "value": "-inf"},
        {
            "op": "MaxPool",
            "op_attrs": "<kernel_shape=[3,3]>",
            "pre": "lo = Constant<value = float {0.0}>()\n a = Clip(x, lo)",
        },
    ],
)
def test_pad_merges(kwargs):
    model = pad_model(**kwargs)
    optimized, result = check_rule(model, PASS)
    assert "Pad" not in op_types(optimized)
    assert effected(result, PASS, "pad_conv") == 1
    op = next(n for n in optimized.graph if n.op_type == kwargs.get("op", "Conv"))
    assert "auto_pad" not in op.attributes


def test_merged_pads_are_summed():
    model = pad_model(op_attrs="<pads=[1,1,1,1]>")
    optimized, _ = check_rule(model, PASS)
    conv = next(n for n in optimized.graph if n.op_type == "Conv")
    assert list(conv.attributes["pads"].value) == [2, 3, 3, 2]


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"mode": "reflect"}, "Pad mode is reflect"),
        (
            {
                "op": "MaxPool",
                "op_attrs": "<kernel_shape=[3,3]>",
                "value": "-inf",
                "pads": "0, 1, 1, 1, 0, 0, 1, 1",
            },
            "Pad pads the batch or channel dims",
        ),
        ({"pads": "0, 0, 1, -1, 0, 0, 1, 1"}, "Pad crops (negative pads)"),
        ({"value": "1.0"}, "Pad value is not zero"),
        ({"op_attrs": '<auto_pad="SAME_UPPER">'}, "Conv uses auto_pad=SAME_UPPER"),
        (
            {"op": "AveragePool", "op_attrs": "<kernel_shape=[4,4], pads=[1,1,1,1]>"},
            "AveragePool excludes its own padding (count_include_pad=0)",
        ),
        (
            {"op": "AveragePool", "op_attrs": "<kernel_shape=[3,3]>", "value": "-inf"},
            "Pad value is not zero",
        ),
        (
            {"op": "AveragePool", "op_attrs": "<kernel_shape=[3,3], ceil_mode=1>"},
            "AveragePool uses ceil_mode",
        ),
        (
            {"op": "MaxPool", "op_attrs": "<kernel_shape=[2,2]>"},
            "merged pads would not be smaller than the kernel",
        ),
        (
            {
                "op": "MaxPool",
                "op_attrs": "<kernel_shape=[3,3], dilations=[2,2]>",
                "pre": "a = Relu(x)",
            },
            "MaxPool is dilated",
        ),
        (
            {"op": "MaxPool", "op_attrs": "<kernel_shape=[3,3]>"},
            "MaxPool pads with -inf: a zero Pad is exact only on a non-negative input",
        ),
        (
            {"op": "MaxPool", "op_attrs": "<kernel_shape=[3,3]>", "value": "1.0"},
            "Pad value is neither zero nor -inf",
        ),
    ],
)
def test_not_merged(kwargs, reason):
    model = pad_model(**kwargs)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized)["Pad"] == 1
    assert effected(result, PASS) == 0
    assert reason in reasons(result, PASS)


def test_zero_pad_before_maxpool_would_change_negative_windows():
    """The refusal above is needed: merging would give a different maximum here."""
    model = pad_model(op="MaxPool", op_attrs="<kernel_shape=[3,3]>")
    merged = pad_model(
        op="MaxPool", op_attrs="<kernel_shape=[3,3], pads=[1,2,2,1]>", pads="0, 0, 0, 0, 0, 0, 0, 0"
    )
    x = {"x": -np.abs(rng.standard_normal((1, 3, 7, 7))).astype(np.float32) - 1}
    assert not np.allclose(run_model(model, x)["y"], run_model(merged, x)["y"])


def test_maxpool_indices_used_is_not_merged():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,7,7] x) => (float[1,3,?,?] y, int64[1,3,?,?] i) {
          pads = Constant<value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}>()
          a = Relu(x)
          p = Pad(a, pads)
          y, i = MaxPool<kernel_shape=[3,3]>(p)
        }"""
    )
    optimized, result = check_rule(model, PASS)
    assert "MaxPool's Indices output is used" in reasons(result, PASS)


def test_non_constant_pads_are_not_merged():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,7,7] x, int64[8] pads) => (float[1,4,?,?] y) {
          p = Pad(x, pads)
          y = Conv(p, w)
        }""",
        {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)},
    )
    result = run_passes(model, PASS)
    assert "Pad's pads are not constant" in reasons(result, PASS)


def test_non_constant_pad_value_is_not_merged():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,7,7] x, float v) => (float[1,4,?,?] y) {
          pads = Constant<value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}>()
          p = Pad(x, pads, v)
          y = Conv(p, w)
        }""",
        {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)},
    )
    result = run_passes(model, PASS)
    assert "Pad's value is not constant" in reasons(result, PASS)
