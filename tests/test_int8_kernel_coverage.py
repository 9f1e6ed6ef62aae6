"""How much of a QDQ model onnxruntime runs in integer kernels, read from the graph it
saves after its QDQ fusion; the models are quantized by onnxruntime's quantize_static."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from opfuse.errors import OpfuseError
from opfuse.quantization.kernels import compute_macs, integer_coverage
from qdq_models import cnn, quantize

# multiply-adds of cnn((16, 32), size=8, classes=10), by hand: output elements x Cin x 3 x 3
CONV1 = 16 * 8 * 8 * (3 * 9)
CONV2 = 32 * 8 * 8 * (16 * 9)
FC = 10 * 32


def test_macs_by_hand() -> None:
    assert compute_macs(cnn()) == {"conv1": CONV1, "conv2": CONV2, "fc": FC}


def test_all_compute_fused_into_integer_kernels(tmp_path: Path) -> None:
    cov = integer_coverage(quantize(cnn(), tmp_path))
    assert cov.integer_ops["QLinearConv"] == 2
    assert cov.integer_ops["QGemm"] == 1
    assert cov.integer_fraction == 1.0
    assert cov.total_macs == CONV1 + CONV2 + FC
    assert cov.float_between_qdq == {}
    assert cov.describe().startswith("100% of the Conv/MatMul/Gemm multiply-adds")


def test_float_model_runs_nothing_in_integer(tmp_path: Path) -> None:
    cov = integer_coverage(cnn())
    assert cov.integer_ops == {} and cov.integer_fraction == 0.0
    assert cov.total_macs == CONV1 + CONV2 + FC


def test_unfused_activation_is_float_between_dq_and_q(tmp_path: Path) -> None:
    # onnxruntime has no QLinear HardSwish: it stays float (HardSigmoid * x) between DQ and Q
    cov = integer_coverage(quantize(cnn(act="HardSwish"), tmp_path))
    assert cov.integer_fraction == 1.0
    assert cov.float_between_qdq.get("Mul") == 2
    assert "float ops left between DequantizeLinear and QuantizeLinear: " in cov.describe()


def test_a_layer_left_in_float_lowers_the_fraction(tmp_path: Path) -> None:
    # conv2 and its activation excluded: no DQ/Q around conv2, it runs in float
    qdq = quantize(cnn(act="HardSwish"), tmp_path, exclude=["conv2", "act2"])
    cov = integer_coverage(qdq)
    assert cov.integer_ops["QLinearConv"] == 1
    assert cov.integer_fraction == pytest.approx((CONV1 + FC) / (CONV1 + CONV2 + FC))
    assert cov.describe().startswith(f"{(CONV1 + FC) / (CONV1 + CONV2 + FC):.0%} ")


def test_model_onnxruntime_refuses_is_an_opfuse_error() -> None:
    bad = cnn()
    bad.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(OpfuseError, match="onnxruntime cannot load the model"):
        integer_coverage(bad)


def test_input_model_is_not_changed(tmp_path: Path) -> None:
    qdq = quantize(cnn(), tmp_path)
    before = qdq.SerializeToString()
    integer_coverage(qdq)
    assert qdq.SerializeToString() == before
    onnx.checker.check_model(qdq)
