"""MatMulBatchNormFusionPass: MatMul/Gemm (+ bias Add) -> BatchNormalization, the
Reshape -> MatMul -> Reshape -> BN sandwich with static and dynamic batch, and the cases
it refuses (BN's axis 1 not the weight's output axis, a shape-changing Reshape, training
mode, a second consumer, a non-constant weight)."""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir
import pytest

from helpers import check_rule, copy_model, effected, model_from_text, op_types, reasons, run_passes

PASS = "MatMulBatchNormFusionPass"
rng = np.random.default_rng(1)
K, C = 6, 4


def bn_params(c: int = C) -> dict[str, np.ndarray]:
    return {
        "scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "bias": rng.standard_normal(c).astype(np.float32),
        "mean": rng.standard_normal(c).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, c).astype(np.float32),
    }


def build(body: str, x_type: str = f"float[3,{K}] x", y_type: str = f"float[3,{C}] y", **extra):
    inits = {
        "w": rng.standard_normal((K, C)).astype(np.float32),
        "wt": rng.standard_normal((C, K)).astype(np.float32),
        "b": rng.standard_normal(C).astype(np.float32),
        **bn_params(),
        **extra,
    }
    used = set(re.findall(r"\w+", body))
    inits = {k: v for k, v in inits.items() if k in used}
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({x_type}) => ({y_type}) {{
          {body}
        }}""",
        inits,
    )


BN = "y = BatchNormalization<epsilon=0.001>(h, scale, bias, mean, var)"


@pytest.mark.parametrize(
    "body,expected",
    [
        (f"h = MatMul(x, w)\n{BN}", {"MatMul": 1, "Add": 1}),
        (f"m = MatMul(x, w)\nh = Add(b, m)\n{BN}", {"MatMul": 1, "Add": 1}),
        (f"h = Gemm<transB=1>(x, wt)\n{BN}", {"Gemm": 1}),
        (f"h = Gemm<transB=1, alpha=0.5, beta=2.0>(x, wt, b)\n{BN}", {"Gemm": 1}),
        (f"h = Gemm(x, w, b)\n{BN}", {"Gemm": 1}),
    ],
)
@pytest.mark.parametrize("batch", ["3", '"n"'])
def test_folds_bn_into_matmul_and_gemm(body, expected, batch):
    model = build(body, f"float[{batch},{K}] x", f"float[{batch},{C}] y")
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == expected
    assert effected(result, PASS, "matmul_bn") == 1


RESHAPE_SANDWICH = f"""
    r = Reshape(x, s1)
    m = MatMul(r, w)
    h = Reshape(m, s2)
    {BN}"""


@pytest.mark.parametrize(
    "x_type,y_type,s2",
    [
        (f"float[2,3,{K}] x", f"float[6,{C}] y", [6, C]),  # static
        (f"float[2,3,{K}] x", f"float[6,{C}] y", [0, C]),
        (f'float["n",3,{K}] x', f'float["m",{C}] y', [-1, C]),  # dynamic batch
        (f'float["n",3,{K}] x', f'float["m",{C}] y', [0, -1]),
    ],
)
def test_folds_through_the_reshape_sandwich(x_type, y_type, s2):
    model = build(
        RESHAPE_SANDWICH,
        x_type,
        y_type,
        s1=np.array([-1, K], np.int64),
        s2=np.array(s2, np.int64),
    )
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"Reshape": 2, "MatMul": 1, "Add": 1}
    assert effected(result, PASS, "matmul_bn") == 1


def test_reshape_that_changes_the_shape_is_refused():
    model = build(
        RESHAPE_SANDWICH,
        f"float[2,3,{K}] x",
        f"float[3,{2 * C}] y",
        s1=np.array([-1, K], np.int64),
        s2=np.array([3, 2 * C], np.int64),
        **bn_params(2 * C),
    )
    optimized, result = check_rule(model, PASS)
    assert "BatchNormalization" in op_types(optimized)
    assert effected(result, PASS) == 0
    assert any("Reshape" in r and "changes the shape" in r for r in reasons(result, PASS))


def test_rank3_matmul_is_refused_because_bn_axis_is_not_the_weight_axis():
    # [B, T, K] @ [K, C] -> [B, T, C]; BN normalizes axis 1 (T), not C
    model = build(
        f"h = MatMul(x, w)\n{BN}",
        f"float[2,{C},{K}] x",
        f"float[2,{C},{C}] y",
    )
    optimized, result = check_rule(model, PASS)
    assert "BatchNormalization" in op_types(optimized)
    assert effected(result, PASS) == 0
    assert (
        "BatchNormalization normalizes axis 1 of the rank-3 MatMul output; "
        "the weight's output axis is axis 2" in reasons(result, PASS)
    )


def test_transposed_rank3_matmul_folds():
    # [B, T, C] transposed to [B, C, T]: BN's axis 1 is now the weight's output axis
    model = build(
        f"m = MatMul(x, w)\nh = Transpose<perm=[0, 2, 1]>(m)\n{BN}",
        f"float[2,5,{K}] x",
        f"float[2,{C},5] y",
    )
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {"MatMul": 1, "Add": 1, "Transpose": 1}
    assert effected(result, PASS) == 1


def test_training_mode_is_refused():
    model = build(f"h = MatMul(x, w)\n{BN}")
    bn = next(n for n in model.graph if n.op_type == "BatchNormalization")
    bn.attributes["training_mode"] = ir.AttrInt64("training_mode", 1)
    result = run_passes(copy_model(model), PASS)
    assert effected(result, PASS) == 0
    assert "BatchNormalization is in training mode" in reasons(result, PASS)


def test_second_consumer_is_refused():
    model = build(
        f"h = MatMul(x, w)\n{BN}\nz = Relu(h)",
        y_type=f"float[3,{C}] y, float[3,{C}] z",
    )
    optimized, result = check_rule(model, PASS)
    assert effected(result, PASS) == 0
    assert any("another consumer" in r for r in reasons(result, PASS))


def test_non_constant_weight_is_refused():
    model = build(f"h = MatMul(x, v)\n{BN}", x_type=f"float[3,{K}] x, float[{K},{C}] v")
    optimized, result = check_rule(model, PASS)
    assert effected(result, PASS) == 0
    assert "MatMul weight is not a constant" in reasons(result, PASS)
