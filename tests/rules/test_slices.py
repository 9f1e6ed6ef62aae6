"""SliceMergeFusionPass: consecutive Slices merge (distinct axes) or compose (a shared
axis of known size), exactly: checked against onnxruntime on many parameter pairs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons

PASS = "SliceMergeFusionPass"
HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def ints(values) -> str:
    return "int64[{}] {{{}}}".format(len(values), ",".join(map(str, values)))


def chain(first, second, shape="1,3,8,8", out="y") -> object:
    """x -> Slice(first) -> Slice(second) -> y; each a (starts, ends, axes, steps)."""
    lines = []
    for k, (s, e, a, p) in enumerate((first, second)):
        src = "x" if k == 0 else "t"
        dst = "t" if k == 0 else out
        lines.append(
            f"s{k} = Constant<value={ints(s)}>()\n e{k} = Constant<value={ints(e)}>()\n"
            f"a{k} = Constant<value={ints(a)}>()\n p{k} = Constant<value={ints(p)}>()\n"
            f"{dst} = Slice({src}, s{k}, e{k}, a{k}, p{k})"
        )
    body = "\n".join(lines)
    dims = ",".join(f"d{i}" for i in range(len(shape.split(","))))
    return model_from_text(f"{HEAD}\ng (float[{shape}] x) => (float[{dims}] {out}) {{\n{body}\n}}")


FOCUS = (([0], [2**62], [2], [2]), ([1], [2**62], [3], [2]))  # x[..., 1::2 on w, ::2 on h]


def test_slices_on_distinct_axes_merge():
    optimized, result = check_rule(chain(*FOCUS), PASS, "ConstantFoldingFusionPass")
    assert op_types(optimized) == {"Slice": 1}
    assert effected(result, PASS) == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (f, s)
        for f, s in itertools.product(
            [(1, 7, 1), (0, 2**62, 2), (-1, -(2**62), -1), (6, 0, -2), (2, 3, 1)],
            [(1, 5, 1), (0, 2**62, 2), (-1, -(2**62), -1), (3, -10, -1), (10, 20, 1)],
        )
    ],
)
def test_slices_on_one_axis_compose_exactly(first, second):
    m = chain(
        ([first[0]], [first[1]], [3], [first[2]]), ([second[0]], [second[1]], [-1], [second[2]])
    )
    optimized, result = check_rule(m, PASS, "ConstantFoldingFusionPass")
    assert op_types(optimized) == {"Slice": 1}
    assert effected(result, PASS) == 1


def test_one_axis_of_unknown_size_is_left():
    m = chain(([0], [4], [1], [1]), ([1], [3], [1], [1]), shape="1,N,8")
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 6, 8)).astype(np.float32)}
    optimized, result = check_rule(m, PASS, "ConstantFoldingFusionPass", feeds=feeds)
    assert op_types(optimized) == {"Slice": 2}
    assert "both Slices cut an axis whose size is not known" in reasons(result, PASS)


def test_a_middle_tensor_used_elsewhere_is_left():
    text = (
        f"{HEAD}\ng (float[1,3,8,8] x) => (float[a,b,c,d] y, float[e,f,g,h] t) {{\n"
        "s0 = Constant<value=int64[1] {0}>()\n e0 = Constant<value=int64[1] {4}>()\n"
        "a0 = Constant<value=int64[1] {2}>()\n t = Slice(x, s0, e0, a0)\n"
        "s1 = Constant<value=int64[1] {1}>()\n e1 = Constant<value=int64[1] {3}>()\n"
        "a1 = Constant<value=int64[1] {3}>()\n y = Slice(t, s1, e1, a1)\n}"
    )
    m = model_from_text(text)
    optimized, result = check_rule(m, PASS, "ConstantFoldingFusionPass")
    assert op_types(optimized) == {"Slice": 2}
    assert effected(result, PASS) == 0
