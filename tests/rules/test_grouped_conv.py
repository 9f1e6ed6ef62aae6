"""SplitConvConcatFusionPass: Split -> N Convs -> Concat on the channel axis into one
grouped Conv (split sizes as input, attribute, or even split; biases on some, all or no
branches; grouped branches), then a BatchNormalization after it folds too
(GroupConvBatchNorm); and the cases it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons

PASS = "SplitConvConcatFusionPass"
rng = np.random.default_rng(4)


def branches(
    n=2,
    cin=2,
    cout=3,
    group=1,
    opset=17,
    bias=(True, True),
    split="sizes",
    axis=1,
    concat_order=None,
    pads=None,
    bn=False,
    extra="",
    weight_input=False,
):
    chan = axis in (1, -3)
    x_c = n * cin if chan else cin
    inits: dict[str, np.ndarray] = {}
    lines = []
    outs = ", ".join(f"s{i}" for i in range(n))
    if split == "sizes" and opset >= 13:
        inits["sizes"] = np.full(n, cin if chan else 3, np.int64)
        lines.append(f"{outs} = Split<axis={axis}>(x, sizes)")
    elif split == "sizes":
        lines.append(f"{outs} = Split<axis={axis}, split=[{', '.join([str(cin)] * n)}]>(x)")
    elif opset >= 18:
        lines.append(f"{outs} = Split<axis={axis}, num_outputs={n}>(x)")
    else:
        lines.append(f"{outs} = Split<axis={axis}>(x)")
    for i in range(n):
        w_name = f"w{i}"
        if not (weight_input and i == 1):
            inits[w_name] = rng.standard_normal((cout, cin // group, 3, 3)).astype(np.float32)
        args = f"s{i}, {w_name}"
        if i < len(bias) and bias[i]:
            inits[f"b{i}"] = rng.standard_normal(cout).astype(np.float32)
            args += f", b{i}"
        p = (pads or {}).get(i, "pads=[1,1,1,1]")
        lines.append(f"c{i} = Conv<{p}, group={group}>({args})")
    order = concat_order or list(range(n))
    cat = "y" if not bn else "h"
    lines.append(
        f"{cat} = Concat<axis={1 if axis == 1 else -3}>({', '.join(f'c{i}' for i in order)})"
    )
    if bn:
        c = n * cout
        inits.update(
            scale=rng.uniform(0.5, 1.5, c).astype(np.float32),
            bias=rng.standard_normal(c).astype(np.float32),
            mean=rng.standard_normal(c).astype(np.float32),
            var=rng.uniform(0.5, 1.5, c).astype(np.float32),
        )
        lines.append("y = BatchNormalization(h, scale, bias, mean, var)")
    if extra:
        lines.append(extra)
    h = 5 if chan else 6
    inputs = f"float[1,{x_c},{h},5] x" + (f", float[{cout},{cin},3,3] w1" if weight_input else "")
    outputs = "float[?,?,?,?] y" + (", float[?,?,?,?] z" if "z =" in extra else "")
    body = "\n          ".join(lines)
    text = f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g ({inputs}) => ({outputs}) {{
          {body}
        }}"""
    return model_from_text(text, inits)


@pytest.mark.parametrize(
    "kwargs,group",
    [
        ({}, 2),
        ({"n": 4, "split": "even", "opset": 18, "bias": (), "axis": -3}, 4),
        ({"n": 3, "split": "even", "opset": 13, "bias": (True, False, True)}, 3),
        ({"opset": 11}, 2),
        ({"cin": 4, "cout": 4, "group": 2}, 4),  # grouped branches: group 2 each -> 4
    ],
)
def test_split_convs_concat_become_one_grouped_conv(kwargs, group):
    model = branches(**kwargs)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Conv": 1}
    conv = next(iter(optimized.graph))
    assert conv.attributes["group"].value == group
    assert effected(result, PASS, "split_conv_concat") == 1


def test_batchnorm_after_the_group_folds_too():
    model = branches(n=3, split="even", bn=True)
    optimized, result = check_rule(model, PASS, "ConvBatchNormFusionPass")
    assert op_types(optimized) == {"Conv": 1}
    assert effected(result, PASS) == 1
    assert effected(result, "ConvBatchNormFusionPass", "conv_bn") == 1


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"pads": {1: "pads=[2,2,2,2], dilations=[2,2]"}}, "Convs have different attributes"),
        ({"concat_order": [1, 0]}, "Concat inputs are not the Convs of the Split outputs in order"),
        ({"axis": 2, "cin": 4, "n": 2}, "Split is not on the channel axis"),
        ({"extra": "z = Relu(c0)"}, "output has another consumer"),
        ({"weight_input": True}, "w1 is not a constant"),
    ],
)
def test_refused(kwargs, reason):
    model = branches(**kwargs)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized)["Conv"] == 2
    assert effected(result, PASS) == 0
    assert any(reason in r for r in reasons(result, PASS)), reasons(result, PASS)
