"""LayoutTransposeFusionPass: Transpose pairs cancel or compose; regions of elementwise,
broadcast, Pad, Reduce, Concat/Split, Clip, Cast, Resize and Softmax operators between
NHWC<->NCHW Transposes lose them; shape arithmetic is remapped; --layout nchw re-declares
the input; never more Transposes than before; numeric and idempotent (check_rule)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (
    check_rule,
    copy_model,
    effected,
    model_from_text,
    op_types,
    random_feeds,
    reasons,
    run_model,
)
from opfuse.pipeline.conductor import optimize_file
from opfuse.rewrite.context import Options
from opfuse.rules.layout._regions import NOT_WORTH
from opfuse.verification.compare import INPUT_PERMUTATION_KEY

PASS = "LayoutTransposeFusionPass"
HEAD = '<ir_version: 8, opset_import: ["" : 18]>'
rng = np.random.default_rng(0)


def nchw_island(body: str, inits: dict | None = None, out: str = "float[1,4,5,6] y") -> object:
    """x (NCHW) -> Transpose to NHWC -> body (reads t, writes u) -> Transpose back -> Relu."""
    text = f"""{HEAD}
    g (float[1,4,5,6] x) => ({out}) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      {body}
      v = Transpose<perm=[0,3,1,2]>(u)
      y = Sigmoid(v)
    }}"""
    return model_from_text(text, inits)


def test_inverse_pair_cancels():
    text = f"""{HEAD}
    g (float[1,4,5,6] x) => (float[1,4,5,6] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      v = Transpose<perm=[0,3,1,2]>(t)
      y = Relu(v)
    }}"""
    optimized, result = check_rule(model_from_text(text), PASS)
    assert op_types(optimized) == {"Relu": 1}
    assert effected(result, PASS, "transpose_pair") == 1


def test_pair_composes_into_one():
    text = f"""{HEAD}
    g (float[1,4,5,6] x) => (float[1,6,5,4] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      v = Transpose<perm=[0,2,1,3]>(t)
      y = Relu(v)
    }}"""
    optimized, result = check_rule(model_from_text(text), PASS)
    assert op_types(optimized) == {"Transpose": 1, "Relu": 1}
    assert effected(result, PASS, "transpose_pair") == 1


BODIES = {
    "unary": ("a = Relu(t)\n u = Exp(a)", {}),
    "cast": ("a = Cast<to=1>(t)\n u = Neg(a)", {}),
    "clip": (
        "u = Clip(t, lo, hi)",
        {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)},
    ),
    "bn_small_ops": (
        "a = Sub(t, mean)\n b = Mul(a, scale)\n u = Add(b, beta)",
        {
            "mean": rng.standard_normal(4).astype(np.float32),
            "scale": rng.standard_normal(4).astype(np.float32),
            "beta": rng.standard_normal((1, 1, 1, 4)).astype(np.float32),
        },
    ),
    "scalar_and_full_rank_const": (
        "a = Mul(t, k)\n u = Div(full, a)",
        {
            "k": np.array(2.0, np.float32),
            "full": rng.uniform(1, 2, (1, 5, 6, 4)).astype(np.float32),
        },
    ),
    "binary_same_layout": ("a = Relu(t)\n u = Mul(a, t)", {}),
    "softmax": ("u = Softmax<axis=3>(t)", {}),
    "reduce_keepdims": (
        "r = ReduceMean<keepdims=1>(t, ax)\n u = Mul(t, r)",
        {"ax": np.array([1, 2], np.int64)},
    ),
    "split_concat": (
        "a, b = Split<axis=3, num_outputs=2>(t)\n c = Relu(a)\n u = Concat<axis=3>(b, c)",
        {},
    ),
}


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_region_loses_both_transposes(kind):
    body, inits = BODIES[kind]
    optimized, result = check_rule(nchw_island(body, inits), PASS)
    assert "Transpose" not in op_types(optimized)
    assert effected(result, PASS, "transpose_region") == 1


def test_pad_with_constant_and_runtime_pads():
    pads = np.array([0, 1, 2, 0, 0, 1, 0, 0], np.int64)
    model = nchw_island("u = Pad(t, pads)", {"pads": pads}, out="float[1,4,7,8] y")
    optimized, _ = check_rule(model, PASS)
    assert "Transpose" not in op_types(optimized)
    text = f"""{HEAD}
    g (float[1,4,5,6] x, int64[8] p) => (float[1,4,?,?] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      u = Pad(t, p)
      v = Transpose<perm=[0,3,1,2]>(u)
      y = Sigmoid(v)
    }}"""
    model = model_from_text(text)
    feeds = {**random_feeds(model), "p": pads}
    optimized, _ = check_rule(model, PASS, feeds=feeds)
    assert op_types(optimized)["Transpose"] == 0 and op_types(optimized)["Gather"] == 1


def test_resize_scales_are_permuted():
    scales = np.array([1, 2, 3, 1], np.float32)
    body = 'u = Resize<mode="nearest">(t, , sc)'
    optimized, _ = check_rule(nchw_island(body, {"sc": scales}, out="float[1,4,10,18] y"), PASS)
    assert "Transpose" not in op_types(optimized)


def test_reduce_without_keepdims_needs_no_transpose_when_order_survives():
    text = f"""{HEAD}
    g (float[2,4,5,6] x) => (float[2,4] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      a = Relu(t)
      y = ReduceMean<keepdims=0>(a, ax)
    }}"""
    model = model_from_text(text, {"ax": np.array([1, 2], np.int64)})
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized) == {"Relu": 1, "ReduceMean": 1}


def test_squeeze_excite_branch_joins_the_region():
    body = """a = Relu(t)
      r = ReduceMean<keepdims=1>(a, ax)
      c = Transpose<perm=[0,3,1,2]>(r)
      d = Conv(c, w)
      e = Transpose<perm=[0,2,3,1]>(d)
      f = Sigmoid(e)
      u = Mul(a, f)"""
    inits = {
        "ax": np.array([1, 2], np.int64),
        "w": rng.standard_normal((4, 4, 1, 1)).astype(np.float32),
    }
    optimized, _ = check_rule(nchw_island(body, inits), PASS)
    assert "Transpose" not in op_types(optimized)


def test_shape_of_transposed_value_is_remapped():
    text = f"""{HEAD}
    g (float[N,4,5,6] x) => (float[N,4,5,6] y, int64[4] s) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      u = Relu(t)
      s = Shape(u)
      v = Transpose<perm=[0,3,1,2]>(u)
      y = Sigmoid(v)
    }}"""
    optimized, _ = check_rule(model_from_text(text), PASS)
    assert "Transpose" not in op_types(optimized)
    assert op_types(optimized)["Gather"] == 1


def test_unit_axis_transpose_before_reshape_is_dropped():
    text = f"""{HEAD}
    g (float[N,8,1,1] x) => (float[N,8] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      s = Shape(t)
      n = Gather<axis=0>(s, zero)
      m = Unsqueeze(n, zero)
      shape = Concat<axis=0>(m, eight)
      y = Reshape(t, shape)
    }}"""
    inits = {"zero": np.array(0, np.int64), "eight": np.array([8], np.int64)}
    model = model_from_text(text, inits)
    optimized, result = check_rule(model, PASS)
    assert "Transpose" not in op_types(optimized)
    assert effected(result, PASS, "unit_transpose") == 1


def test_region_that_gains_nothing_is_left_with_a_reason():
    text = f"""{HEAD}
    g (float[1,4,5,6] x) => (float[1,5,6,4] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      y = Relu(t)
    }}"""
    model = model_from_text(text)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Transpose": 1, "Relu": 1}
    assert effected(result, PASS) == 0
    assert NOT_WORTH in reasons(result, PASS)


def test_operator_that_is_not_layout_agnostic_stops_the_region():
    body = "a = Reshape(t, shape)\n u = Relu(a)"
    model = nchw_island(body, {"shape": np.array([1, 5, 6, 4], np.int64)})
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized)["Transpose"] == 2
    assert effected(result, PASS, "transpose_region") == 0


def test_lower_rank_runtime_operand_stops_the_region():
    text = f"""{HEAD}
    g (float[1,4,5,6] x, float[4] c) => (float[1,4,5,6] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      u = Add(t, c)
      v = Transpose<perm=[0,3,1,2]>(u)
      y = Sigmoid(v)
    }}"""
    optimized, _ = check_rule(model_from_text(text), PASS)
    assert op_types(optimized)["Transpose"] == 2


def test_layer_norm_over_permuted_axis_is_not_moved():
    body = "u = LayerNormalization<axis=-1>(t, sc, bi)"
    inits = {"sc": np.ones(4, np.float32), "bi": np.zeros(4, np.float32)}
    optimized, _ = check_rule(nchw_island(body, inits), PASS)
    assert op_types(optimized)["Transpose"] == 2


NHWC_INPUT = f"""{HEAD}
    g (float[N,5,6,4] x) => (float[N,4,5,6] y) {{
      a = Mul(x, k)
      b = Add(a, m)
      t = Transpose<perm=[0,3,1,2]>(b)
      y = Conv<pads=[1,1,1,1]>(t, w)
    }}"""


def nhwc_model():
    return model_from_text(
        NHWC_INPUT,
        {
            "k": np.array(1 / 127.5, np.float32),
            "m": rng.standard_normal(4).astype(np.float32),
            "w": rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        },
    )


def test_keep_layout_keeps_the_input_transpose():
    optimized, result = check_rule(nhwc_model(), PASS)
    assert op_types(optimized)["Transpose"] == 1
    assert [d for d in optimized.graph.inputs[0].shape][1:] == [5, 6, 4]
    assert not result.notes


def test_layout_nchw_redeclares_the_input(tmp_path):
    model = nhwc_model()
    optimized = copy_model(model)
    from helpers import run_passes

    result = run_passes(optimized, PASS, options=Options(layout="nchw"))
    assert "Transpose" not in op_types(optimized)
    assert list(optimized.graph.inputs[0].shape)[1:] == [4, 5, 6]
    perms = json.loads(optimized.metadata_props[INPUT_PERMUTATION_KEY])
    assert perms == {"x": [0, 3, 1, 2]}
    assert any("NCHW" in note for note in result.notes)
    feeds = random_feeds(model)
    got = run_model(optimized, {"x": feeds["x"].transpose(0, 3, 1, 2).copy()})
    np.testing.assert_allclose(got["y"], run_model(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_layout_nchw_verifies_end_to_end(tmp_path):
    import onnx_ir as ir

    src = tmp_path / "nhwc.onnx"
    ir.save(nhwc_model(), src)
    result = optimize_file(src, tmp_path / "out.onnx", options=Options(layout="nchw"))
    assert result.verify is not None and result.verify.ok
    assert result.after["Transpose"] == 0


PERMS = [(0, 2, 3, 1), (0, 3, 1, 2), (0, 1, 3, 2), (1, 0, 2, 3), (3, 2, 1, 0)]
OPS = ["Relu", "Neg", "AddC", "MulC", "ReduceMean", "Concat", "Transpose"]


@st.composite
def chains(draw):
    shape = [2, 3, 4, 5]
    lines, inits, cur = [], {}, "x"
    for i, op in enumerate(draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=8))):
        out = f"v{i}"
        if op == "Transpose":
            perm = draw(st.sampled_from(PERMS))
            lines.append(f"{out} = Transpose<perm=[{','.join(map(str, perm))}]>({cur})")
            shape = [shape[p] for p in perm]
        elif op in ("AddC", "MulC"):
            keep = draw(st.integers(0, 4))  # broadcast constant over the last `keep` axes
            cshape = [draw(st.sampled_from([1, d])) for d in shape[4 - keep :]]
            inits[f"c{i}"] = rng.standard_normal(cshape).astype(np.float32)
            lines.append(f"{out} = {op[:-1]}({cur}, c{i})")
        elif op == "ReduceMean":
            axis = draw(st.integers(0, 3))
            inits[f"a{i}"] = np.array([axis], np.int64)
            lines.append(f"{out} = ReduceMean<keepdims=1>({cur}, a{i})")
            shape[axis] = 1
        elif op == "Concat":
            axis = draw(st.integers(0, 3))
            lines.append(f"{out} = Concat<axis={axis}>({cur}, {cur})")
            shape[axis] *= 2
        else:
            lines.append(f"{out} = {op}({cur})")
        cur = out
    lines.append(f"y = Sigmoid({cur})")
    text = f"""{HEAD}
    g (float[2,3,4,5] x) => (float[{",".join(map(str, shape))}] y) {{
      {chr(10).join(lines)}
    }}"""
    return model_from_text(text, inits)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_random_chains_stay_equal_and_never_gain_transposes(model):
    optimized, _ = check_rule(model, PASS)
    assert op_types(optimized)["Transpose"] <= op_types(model)["Transpose"]


def test_layout_nhwc_redeclares_an_nchw_input_read_as_nhwc(tmp_path):
    """The mirror case: an NCHW input whose first use transposes it to NHWC."""
    import onnx_ir as ir

    text = f"""{HEAD}
    g (float[1,4,5,6] x) => (float[1,5,6,4] y) {{
      t = Transpose<perm=[0,2,3,1]>(x)
      y = Relu(t)
    }}"""
    src = tmp_path / "nchw.onnx"
    ir.save(model_from_text(text), src)
    kept = optimize_file(src, tmp_path / "keep.onnx")
    assert kept.after["Transpose"] == 1 and not kept.notes
    result = optimize_file(src, tmp_path / "out.onnx", options=Options(layout="nhwc"))
    assert result.verify is not None and result.verify.ok
    assert result.after["Transpose"] == 0
    assert list(result.model.graph.inputs[0].shape) == [1, 5, 6, 4]
    assert any("NHWC" in note for note in result.notes)


def test_layout_nchw_absorbs_a_transpose_right_at_the_input(tmp_path):
    """No preprocessing: the NHWC input goes straight into the Transpose before the Conv."""
    import onnx_ir as ir

    text = f"""{HEAD}
    g (float[1,5,6,4] x) => (float[1,4,5,6] y) {{
      t = Transpose<perm=[0,3,1,2]>(x)
      y = Conv<pads=[1,1,1,1]>(t, w)
    }}"""
    src = tmp_path / "nhwc.onnx"
    ir.save(model_from_text(text, {"w": rng.standard_normal((4, 4, 3, 3)).astype(np.float32)}), src)
    result = optimize_file(src, tmp_path / "out.onnx", options=Options(layout="nchw"))
    assert result.verify is not None and result.verify.ok
    assert result.after["Transpose"] == 0
    assert list(result.model.graph.inputs[0].shape) == [1, 4, 5, 6]
    assert effected(result, PASS, "input_transpose") == 1


def test_input_with_another_reader_keeps_its_transpose(tmp_path):
    text = f"""{HEAD}
    g (float[1,5,6,4] x) => (float[1,4,5,6] y, float[1,5,6,4] z) {{
      t = Transpose<perm=[0,3,1,2]>(x)
      y = Relu(t)
      z = Sigmoid(x)
    }}"""
    optimized, result = check_rule(model_from_text(text), PASS, options=Options(layout="nchw"))
    assert op_types(optimized)["Transpose"] == 1
    assert list(optimized.graph.inputs[0].shape) == [1, 5, 6, 4]


def squeeze_excite(extra_use: bool = False):
    """A Keras EfficientNet squeeze-excite block on the channels-last side: global pool
    [N, C] -> Reshape [N, 1, 1, C] -> Transpose to NCHW -> 1x1 Convs -> Sigmoid ->
    Transpose back -> Mul with the block's input; NCHW Convs around it."""
    c = 8
    inits = {
        "w": rng.standard_normal((c, c, 3, 3)).astype(np.float32),
        "w1": rng.standard_normal((4, c, 1, 1)).astype(np.float32),
        "b1": rng.standard_normal(4).astype(np.float32),
        "w2": rng.standard_normal((c, 4, 1, 1)).astype(np.float32),
        "b2": rng.standard_normal(c).astype(np.float32),
        "w3": rng.standard_normal((c, c, 1, 1)).astype(np.float32),
        "shape": np.array([-1, 1, 1, c], np.int64),
        "hw": np.array([1, 2], np.int64),
    }
    outputs = f"float[N,6,6,{c}] y" + (", float[a,b,d,e] r" if extra_use else "")
    text = f"""{HEAD}
    g (float[N,6,6,{c}] x) => ({outputs}) {{
      a = Transpose<perm=[0,3,1,2]>(x)
      cv = Conv<pads=[1,1,1,1]>(a, w)
      b = Transpose<perm=[0,2,3,1]>(cv)
      m = ReduceMean<keepdims=0>(b, hw)
      r = Reshape(m, shape)
      t = Transpose<perm=[0,3,1,2]>(r)
      s1 = Conv(t, w1, b1)
      s2 = Relu(s1)
      s3 = Conv(s2, w2, b2)
      sg = Sigmoid(s3)
      u = Transpose<perm=[0,2,3,1]>(sg)
      y0 = Mul(b, u)
      y1 = Transpose<perm=[0,3,1,2]>(y0)
      y2 = Conv(y1, w3)
      y = Transpose<perm=[0,2,3,1]>(y2)
    }}"""
    return model_from_text(text, inits)


def transposes_after_reshape(model) -> int:
    return sum(
        1
        for n in model.graph
        if n.op_type == "Transpose"
        and n.inputs[0].producer() is not None
        and n.inputs[0].producer().op_type == "Reshape"
    )


def test_a_squeeze_excite_reshape_carries_its_transpose():
    model = squeeze_excite()
    feeds = {"x": rng.standard_normal((2, 6, 6, 8)).astype(np.float32)}
    optimized, result = check_rule(model, PASS, feeds=feeds)
    # only the model's own NHWC input and output Transposes are left
    assert op_types(optimized)["Transpose"] == 2
    assert op_types(optimized)["Reshape"] == 1
    assert transposes_after_reshape(optimized) == 0
    assert effected(result, PASS, "unit_transpose") >= 1


@pytest.mark.parametrize(
    ("target", "moves_real_axis"), [("-1,1,1,8", False), ("-1,2,1,4", True), ("-1,1,2,4", True)]
)
def test_only_a_transpose_of_unit_axes_after_a_reshape_becomes_one(target, moves_real_axis):
    """[N, 2, 1, 4] to [N, 4, 2, 1] swaps the 2 and the 4: the Transpose stays."""
    text = f"""{HEAD}
    g (float[N,8] x) => (float[a,b,c,d] y) {{
      r = Reshape(x, shape)
      t = Transpose<perm=[0,3,1,2]>(r)
      y = Relu(t)
    }}"""
    model = model_from_text(text, {"shape": np.array(target.split(","), np.int64)})
    optimized, result = check_rule(model, PASS)
    assert transposes_after_reshape(optimized) == int(moves_real_axis)
    assert op_types(optimized)["Reshape"] == 1
    assert effected(result, PASS, "unit_transpose") == int(not moves_real_axis)


def test_a_reshape_with_another_use_keeps_the_transpose():
    model = squeeze_excite(extra_use=True)
    feeds = {"x": rng.standard_normal((1, 6, 6, 8)).astype(np.float32)}
    optimized, _ = check_rule(model, PASS, feeds=feeds)
    assert transposes_after_reshape(optimized) == 1
