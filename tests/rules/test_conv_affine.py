"""ConvMulFusionPass, ConvAddFusionPass, MatMulBiasAddFusionPass: Mul/Add of scalar or
per-channel constants folded into the linear layer before them (also across an NHWC
Transpose and a MatMul's bias Add), a Mul before a Conv/MatMul folded into its weights
(with padding), rank-2 MatMul + Add into Gemm, and the cases each refuses."""

from __future__ import annotations

import re

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons

MUL, ADD, GEMM = "ConvMulFusionPass", "ConvAddFusionPass", "MatMulBiasAddFusionPass"
rng = np.random.default_rng(2)
CIN, C, K = 3, 4, 6

INITS = {
    "w": rng.standard_normal((C, CIN, 3, 3)).astype(np.float32),
    "wg": rng.standard_normal((C, 1, 3, 3)).astype(np.float32),  # depthwise over C inputs
    "wt": rng.standard_normal((CIN, C // 2, 3, 3)).astype(np.float32),  # ConvTranspose
    "b": rng.standard_normal(C).astype(np.float32),
    "wm": rng.standard_normal((K, C)).astype(np.float32),
    "wn": rng.standard_normal((C, K)).astype(np.float32),
    "bm": rng.standard_normal(C).astype(np.float32),
    "c_nchw": rng.uniform(0.5, 2, (1, C, 1, 1)).astype(np.float32),
    "c_in": rng.uniform(0.5, 2, (1, CIN, 1, 1)).astype(np.float32),
    "c_inc": rng.uniform(0.5, 2, (1, C, 1, 1)).astype(np.float32),
    "c_chw": rng.uniform(0.5, 2, (C, 1, 1)).astype(np.float32),
    "c_nhwc": rng.uniform(0.5, 2, (1, 1, 1, C)).astype(np.float32),
    "c_vec": rng.uniform(0.5, 2, C).astype(np.float32),
    "c_k": rng.uniform(0.5, 2, K).astype(np.float32),
    "c_h": rng.uniform(0.5, 2, (1, 1, 5, 1)).astype(np.float32),
    "c_big": rng.uniform(0.5, 2, (2, 3, C)).astype(np.float32),
    "two": np.array(2.5, np.float32),
    "c_w5": rng.uniform(0.5, 2, (1, 5, 1, 1)).astype(np.float32),
    "c_k1": rng.uniform(0.5, 2, (K, 1)).astype(np.float32),
}


def build(body: str, inputs: str = f"float[1,{CIN},5,5] x", outputs: str = "float[?,?,?,?] y"):
    used = set(re.findall(r"\w+", body))
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({inputs}) => ({outputs}) {{
          {body}
        }}""",
        {k: v for k, v in INITS.items() if k in used},
    )


CONV = "h = Conv<pads=[1,1,1,1]>(x, w, b)"
MM_IN = f"float[3,{K}] x"
MM_OUT = f"float[3,{C}] y"


@pytest.mark.parametrize(
    "body,inputs,outputs,expected",
    [
        (f"{CONV}\ny = Mul(h, c_nchw)", None, None, {"Conv": 1}),
        (f"{CONV}\ny = Mul(c_chw, h)", None, None, {"Conv": 1}),
        ("h = Conv(x, w)\ny = Mul(h, two)", None, None, {"Conv": 1}),
        (f"{CONV}\ny = Div(h, c_nchw)", None, None, {"Conv": 1}),
        (f"{CONV}\ny = Sub(c_nchw, h)", None, None, {"Conv": 1}),  # c - L(x): s = -1
        ("h = Conv(x, w)\ny = Sub(two, h)", None, None, {"Conv": 1}),
        ("h = Gemm<transB=1>(x, wn, bm)\ny = Sub(c_vec, h)", MM_IN, MM_OUT, {"Gemm": 1}),
        (
            "h = ConvTranspose<group=1>(x, wt)\ny = Mul(h, c_vec2)",
            None,
            None,
            {"ConvTranspose": 1},
        ),
        (
            f"{CONV}\nt = Transpose<perm=[0,2,3,1]>(h)\ny = Mul(t, c_nhwc)",
            None,
            None,
            {"Conv": 1, "Transpose": 1},
        ),
        ("h = Gemm<transB=1>(x, wn, bm)\ny = Mul(h, c_vec)", MM_IN, MM_OUT, {"Gemm": 1}),
        (
            "m = MatMul(x, wm)\nh = Add(m, bm)\ny = Mul(h, c_vec)",
            MM_IN,
            MM_OUT,
            {"MatMul": 1, "Add": 1},
        ),
        (
            "h = MatMul(x, wm)\ny = Mul(h, c_vec)",
            f"float[2,3,{K}] x",
            f"float[2,3,{C}] y",
            {"MatMul": 1},
        ),
    ],
)
def test_mul_after_layer_folds(body, inputs, outputs, expected):
    if "c_vec2" in body:
        INITS["c_vec2"] = rng.uniform(0.5, 2, (1, C // 2, 1, 1)).astype(np.float32)
    model = build(body, inputs or f"float[1,{CIN},5,5] x", outputs or "float[?,?,?,?] y")
    optimized, result = check_rule(model, MUL)
    assert op_types(optimized) == expected
    assert effected(result, MUL, "conv_mul") == 1


@pytest.mark.parametrize(
    "body,reason",
    [
        (f"{CONV}\ny = Mul(h, c_h)", "constants vary along axis 2, the channels are on axis 1"),
        (
            f"{CONV}\nt = Transpose<perm=[0,2,3,1]>(h)\ny = Mul(t, c_w5)",
            "constants vary along axis 1, the channels are on axis 3",
        ),
        ("h = Conv(x, v)\ny = Mul(h, c_nchw)", "Conv weight is not a constant"),
        (f"{CONV}\ny = Mul(h, c_nchw)\nz = Relu(h)", "another consumer"),
    ],
)
def test_mul_after_layer_refused(body, reason):
    inputs = f"float[1,{CIN},5,5] x" + (f", float[{C},{CIN},3,3] v" if " v)" in body else "")
    outputs = "float[?,?,?,?] y" + (", float[?,?,?,?] z" if "z =" in body else "")
    model = build(body, inputs, outputs)
    optimized, result = check_rule(model, MUL)
    assert effected(result, MUL) == 0
    assert any(reason in r for r in reasons(result, MUL)), reasons(result, MUL)


@pytest.mark.parametrize(
    "body,inputs,outputs,expected",
    [
        (f"{CONV}\ny = Add(h, c_nchw)", None, None, {"Conv": 1}),
        ("h = Conv(x, w)\ny = Sub(h, c_chw)", None, None, {"Conv": 1}),
        (
            f"{CONV}\nt = Transpose<perm=[0,2,3,1]>(h)\ny = Add(t, c_vec)",
            None,
            None,
            {"Conv": 1, "Transpose": 1},
        ),
        ("h = Gemm(x, wm)\ny = Add(h, c_vec)", MM_IN, MM_OUT, {"Gemm": 1}),
        (
            "m = MatMul(x, wm)\nh = Add(m, bm)\ny = Add(h, c_vec)",
            f"float[2,3,{K}] x",
            f"float[2,3,{C}] y",
            {"MatMul": 1, "Add": 1},
        ),
    ],
)
def test_add_after_layer_folds(body, inputs, outputs, expected):
    model = build(body, inputs or f"float[1,{CIN},5,5] x", outputs or "float[?,?,?,?] y")
    optimized, result = check_rule(model, ADD)
    assert op_types(optimized) == expected
    assert effected(result, ADD, "conv_add") == 1


def test_add_after_layer_refused_for_non_per_channel_constant():
    model = build(f"{CONV}\ny = Add(h, c_h)")
    optimized, result = check_rule(model, ADD)
    assert effected(result, ADD) == 0
    assert "constants vary along axis 2, the channels are on axis 1" in reasons(result, ADD)


def test_add_after_a_bare_matmul_is_left_to_gemm():
    model = build("h = MatMul(x, wm)\ny = Add(h, c_vec)", f"float[2,3,{K}] x", f"float[2,3,{C}] y")
    optimized, result = check_rule(model, ADD, GEMM)
    assert op_types(optimized) == {"MatMul": 1, "Add": 1}
    assert effected(result, ADD) == 0 and effected(result, GEMM) == 0
    assert "MatMul operands are not both 2-D" in reasons(result, GEMM)


@pytest.mark.parametrize(
    "body,inputs",
    [
        ("h = MatMul(x, wm)\ny = Add(h, bm)", MM_IN),
        ("h = MatMul(x, wm)\ny = Add(bias, h)", f"{MM_IN}, float[3,{C}] bias"),
        ("h = MatMul(x, v)\ny = Add(h, bm)", f"{MM_IN}, float[{K},{C}] v"),
    ],
)
def test_matmul_bias_add_becomes_gemm(body, inputs):
    model = build(body, inputs, MM_OUT)
    optimized, result = check_rule(model, GEMM)
    assert op_types(optimized) == {"Gemm": 1}
    assert effected(result, GEMM, "matmul_bias_add") == 1


@pytest.mark.parametrize(
    "body,inputs,outputs,reason",
    [
        (
            "h = MatMul(x, wm)\ny = Add(h, c_big)",
            MM_IN,
            f"float[2,3,{C}] y",
            "bias does not broadcast to the MatMul output [M, N]",
        ),
        (
            "h = MatMul(x, v)\ny = Add(h, v2)",
            "int32[3,2] x, int32[2,2] v, int32[2] v2",
            "int32[3,2] y",
            "output is not floating point",
        ),
    ],
)
def test_matmul_bias_add_refused(body, inputs, outputs, reason):
    model = build(body, inputs, outputs)
    optimized, result = check_rule(model, GEMM)
    assert "Gemm" not in op_types(optimized)
    assert reason in reasons(result, GEMM)


@pytest.mark.parametrize(
    "body,inputs,outputs,expected",
    [
        ("s = Mul(x, c_in)\ny = Conv<pads=[1,1,1,1]>(s, w, b)", None, None, {"Conv": 1}),
        ('s = Mul(x, two)\ny = Conv<auto_pad="SAME_UPPER">(s, w)', None, None, {"Conv": 1}),
        (
            "s = Mul(x, c_inc)\ny = Conv<pads=[1,1,1,1], group=4>(s, wg)",
            f"float[1,{C},5,5] x",
            None,
            {"Conv": 1},
        ),
        (
            "s = Mul(x, c_k)\ny = MatMul(s, wm)",
            f"float[2,3,{K}] x",
            f"float[2,3,{C}] y",
            {"MatMul": 1},
        ),
        ("s = Mul(c_k, x)\ny = Gemm<transB=1>(s, wn, bm)", MM_IN, MM_OUT, {"Gemm": 1}),
    ],
)
def test_mul_before_layer_folds(body, inputs, outputs, expected):
    model = build(body, inputs or f"float[1,{CIN},5,5] x", outputs or "float[?,?,?,?] y")
    optimized, result = check_rule(model, MUL)
    assert op_types(optimized) == expected
    assert effected(result, MUL, "mul_conv") == 1


@pytest.mark.parametrize(
    "body,inputs,reason",
    [
        (
            "s = Mul(x, c_h)\ny = Conv<pads=[1,1,1,1]>(s, w, b)",
            None,
            "constants vary along axis 2, the channels are on axis 1",
        ),
        ("s = Mul(x, c_k1)\ny = Gemm<transA=1>(s, wm)", f"float[{K},3] x", "Gemm transposes A"),
        (
            "s = Mul(x, c_in)\ny = Conv<pads=[1,1,1,1]>(s, w, b)",
            "float[1,1,5,5] x",
            "the Mul may broadcast its input up (input shape unknown or smaller)",
        ),
    ],
)
def test_mul_before_layer_refused(body, inputs, reason):
    model = build(
        body,
        inputs or f"float[1,{CIN},5,5] x",
        "float[?,?,?,?] y" if "Conv" in body else "float[3,4] y",
    )
    optimized, result = check_rule(model, MUL)
    assert effected(result, MUL) == 0
    assert reason in reasons(result, MUL)


AIPP = "AippFusionPass"


@pytest.mark.parametrize("pads,folded", [("[1,1,1,1]", False), ("[0,0,0,0]", True)])
def test_add_before_a_padded_conv_is_not_folded(pads, folded):
    # conv(pad(x + c)) != conv(pad(x)) + conv(c): the border holds 0, not c. The pass that
    # matches an Add before a Conv is AippFusionPass (from a graph input); without
    # padding it folds the Add into the bias, so the padded case is a real refusal
    model = build(f"s = Add(x, c_in)\ny = Conv<pads={pads}>(s, w, b)")
    optimized, result = check_rule(model, MUL, ADD, GEMM, AIPP)
    assert effected(result, MUL) == effected(result, ADD) == effected(result, GEMM) == 0
    if folded:
        assert op_types(optimized) == {"Conv": 1}
        assert effected(result, AIPP, "aipp_conv") == 1
    else:
        assert op_types(optimized) == {"Add": 1, "Conv": 1}
        assert effected(result, AIPP) == 0
        assert any(r.startswith("Conv pads with zeros") for r in reasons(result, AIPP))


def test_float32_conv_mul_add_fold_gives_onnxruntimes_bits():
    """onnxruntime folds Conv -> Mul -> Add by per-channel constants at load time in
    float32 (W * c, b * c, + d); opfuse folds them with the same steps, so under
    ORT_ENABLE_ALL the two models give the same bits."""
    import onnx_ir as ir
    import onnxruntime as ort

    c = 64
    inits = {
        "w": rng.standard_normal((c, 16, 3, 3)).astype(np.float32),
        "b": rng.standard_normal(c).astype(np.float32),
        "k": rng.uniform(0.5, 2, (c, 1, 1)).astype(np.float32),
        "d": rng.standard_normal((c, 1, 1)).astype(np.float32),
    }
    model = model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,16,6,6] x) => (float[1,{c},6,6] y) {{
          v = Conv<pads=[1,1,1,1]>(x, w, b)
          m = Mul(v, k)
          y = Add(m, d)
        }}""",
        inits,
    )
    optimized, _ = check_rule(model, MUL, ADD, "BatchNormSmallOpsFusionPass")  # the chain's
    assert op_types(optimized) == {"Conv": 1}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    feeds = {"x": rng.standard_normal((1, 16, 6, 6)).astype(np.float32)}
    want, got = (
        ort.InferenceSession(ir.to_proto(m).SerializeToString(), opts).run(None, feeds)[0]
        for m in (model, optimized)
    )
    assert np.array_equal(want, got)
    # not vacuous: float64 rounded once gives other bias bits
    b64 = (inits["b"] * inits["k"].reshape(-1).astype(np.float64) + inits["d"].reshape(-1)).astype(
        np.float32
    )
    bias = next(v for v in optimized.graph.initializers.values() if v.name.endswith("bias_affine"))
    assert not np.array_equal(bias.const_value.numpy(), b64)


INITS.update(
    t_in=rng.uniform(-1, 1, (1, CIN, 1, 1)).astype(np.float32),
    s_in=rng.uniform(0.5, 2, (CIN, 1, 1)).astype(np.float32),
    w1=rng.standard_normal((C, CIN, 1, 1)).astype(np.float32),
    t_inc=rng.uniform(-1, 1, (1, C, 1, 1)).astype(np.float32),
)


@pytest.mark.parametrize(
    "body",
    [
        "m = Mul(x, s_in)\n a = Add(m, t_in)\n y = Conv(a, w, b)",  # PaddleOCR's normalization
        "a = Sub(x, t_in)\n y = Conv(a, w)",  # no bias: one is made
        "a = Add(x, two)\n y = Conv<strides=[2,2]>(a, w, b)",  # a scalar, strided
        'a = Add(x, t_in)\n y = Conv<auto_pad="SAME_UPPER">(a, w1, b)',  # 1x1: SAME pads nothing
        "a = Add(t_inc, h)\n y = Conv<group=4>(a, wg, b)",  # depthwise, constant first
    ],
)
def test_mul_then_add_before_an_unpadded_conv_folds_into_it(body):
    inputs = f"float[1,{C},5,5] h" if "h)" in body else f"float[1,{CIN},5,5] x"
    optimized, result = check_rule(build(body, inputs), MUL, ADD)
    assert op_types(optimized) == {"Conv": 1}
    assert effected(result, ADD, "add_conv") == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "a = Add(x, t_in)\n y = Conv<pads=[1,1,1,1]>(a, w, b)",
            "the Conv pads: its zero border would have to hold the shift",
        ),
        (
            'a = Add(x, t_in)\n y = Conv<auto_pad="SAME_UPPER">(a, w, b)',
            "the Conv pads: its zero border would have to hold the shift",
        ),
        (
            "a = Add(x, c_h)\n y = Conv(a, w, b)",
            "constants vary along axis 2, the channels are on axis 1",
        ),
    ],
)
def test_an_add_before_a_conv_that_pads_is_left(body, reason):
    optimized, result = check_rule(build(body), ADD)
    assert op_types(optimized) == {"Add": 1, "Conv": 1}
    assert reason in reasons(result, ADD)
