"""QDQMovementFusionPass: Q(move(DQ(x))) with one per-tensor scale and zero point becomes
move(x) in the integer type; bit-identical outputs (onnxruntime, optimizations off),
idempotent; not where scales, zero points or types differ, the scale is per axis, the
dequantized value has another reader, or it is not the moved data."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_model

PASS = "QDQMovementFusionPass"


def qdq_model(move="t = Transpose<perm=[0, 2, 1]>(d)", out_shape="[1,4,3]", s_out=0.05,
              z_out=10, dtype="uint8", extra_out="", extra=""):  # fmt: skip
    np_type = np.uint8 if dtype == "uint8" else np.int8
    inits = {
        "s": np.array(0.05, np.float32),
        "z": np.array(10, np_type),
        "s2": np.array(s_out, np.float32),
        "z2": np.array(z_out, np_type),
        "shape": np.array([1, 12], np.int64),
        "idx": np.array([2, 0], np.int64),
    }
    used = {"s", "z", "s2", "z2"} | {name for name in ("shape", "idx") if name in move}
    return model_from_text(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({dtype}[1,3,4] x) => ({dtype}{out_shape} y{extra_out}) {{
          d = DequantizeLinear(x, s, z)
          {move}
          y = QuantizeLinear(t, s2, z2)
          {extra}
        }}""",
        {k: v for k, v in inits.items() if k in used},
    )


def feeds(dtype=np.uint8):
    info = np.iinfo(dtype)
    return {"x": np.random.default_rng(0).integers(info.min, info.max + 1, (1, 3, 4), dtype)}


@pytest.mark.parametrize(
    "move, out_shape",
    [
        ("t = Transpose<perm=[0, 2, 1]>(d)", "[1,4,3]"),
        ("t = Reshape(d, shape)", "[1,12]"),
        ("t = Gather<axis=2>(d, idx)", "[1,3,2]"),
        ("t = Flatten<axis=1>(d)", "[1,12]"),
    ],
)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qdq_around_a_move_goes(move, out_shape, dtype):
    np_type = np.uint8 if dtype == "uint8" else np.int8
    model = qdq_model(move, out_shape, dtype=dtype)
    optimized, result = check_rule(model, PASS, feeds=feeds(np_type))
    assert effected(result, PASS) == 1
    assert "QuantizeLinear" not in op_types(optimized)
    assert "DequantizeLinear" not in op_types(optimized)
    ref, got = run_model(model, feeds(np_type)), run_model(optimized, feeds(np_type))
    assert ref["y"].dtype == got["y"].dtype and np.array_equal(ref["y"], got["y"])  # bit-exact


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"s_out": 0.1}, "the scales differ"),
        ({"z_out": 11}, "the zero points differ"),
        ({"extra_out": ", float[1,3,4] d2", "extra": "d2 = Identity(d)"}, "another consumer"),
    ],
)
def test_it_does_not_fire(kwargs, reason):
    model = qdq_model(**kwargs)
    optimized, result = check_rule(model, PASS, feeds=feeds())
    assert effected(result, PASS) == 0
    assert any(reason in r for r in reasons(result, PASS)), reasons(result, PASS)


def test_a_per_axis_scale_does_not_fire():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (uint8[1,3,4] x) => (uint8[1,4,3] y) {
          d = DequantizeLinear<axis=1>(x, s, z)
          t = Transpose<perm=[0, 2, 1]>(d)
          y = QuantizeLinear<axis=2>(t, s, z)
        }""",
        {"s": np.array([0.1, 0.2, 0.3], np.float32), "z": np.array([1, 2, 3], np.uint8)},
    )
    _, result = check_rule(model, PASS, feeds=feeds())
    assert effected(result, PASS) == 0
    assert any("per-axis" in r for r in reasons(result, PASS))
