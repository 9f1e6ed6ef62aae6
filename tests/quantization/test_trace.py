"""Where a quantized model's error grows: every quantized activation (and output) against
the float model, the step that adds the most noise, and outlier channels named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.quantization import flow
from opfuse.quantization.trace import TensorError, error_trace, largest_drops


def two_convs(path: Path, outlier: bool) -> Path:
    """x (1x4x6x6) -> 1x1 Conv "c1" -> y1 (8 channels) -> 1x1 Conv "c2" -> y (4 channels).
    With ``outlier``, y1's channel 0 is about 100x the others and c2 ignores it: y1's one
    uint8 scale leaves the small channels a few steps, and y is built from them alone."""
    rng = np.random.default_rng(0)
    w1 = rng.uniform(0.1, 0.3, (8, 4, 1, 1)).astype(np.float32)
    w2 = rng.uniform(0.5, 1.0, (4, 8, 1, 1)).astype(np.float32)
    if outlier:
        w1[0] = 50.0
        w2[:, 0] = 0.0
    graph = h.make_graph(
        [
            h.make_node("Conv", ["x", "w1"], ["y1"], name="c1"),
            h.make_node("Conv", ["y1", "w2"], ["y"], name="c2"),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def trace_of(tmp_path: Path, outlier: bool) -> list[TensorError]:
    model = two_convs(tmp_path / "m.onnx", outlier)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.uniform(0, 1, (1, 4, 6, 6)).astype(np.float32)} for _ in range(6)]
    qdq = tmp_path / "m.qdq.onnx"
    flow.quantize(model, qdq, samples, flow.QuantOptions())
    return error_trace(model, qdq, samples)


def test_the_step_reading_outlier_channels_is_named(tmp_path):
    trace = trace_of(tmp_path, outlier=True)
    by_name = {e.tensor: e for e in trace}
    assert list(by_name) == ["x", "y1", "y"]  # graph order; the output is compared too
    y1, y = by_name["y1"], by_name["y"]
    assert y1.channel_spread is not None and y1.channel_spread > 50
    assert y.worst_input == "y1" and y.inputs_db == pytest.approx(y1.sqnr_db)
    assert y.sqnr_db < 25 and y.drop_db > 10  # y1's energy is in the channel c2 ignores
    worst = largest_drops(trace)[0]
    assert worst.tensor == "y"
    assert worst.describe().startswith(f"y (Conv, {y1.sqnr_db:.1f} -> {y.sqnr_db:.1f} dB)")
    assert "reading y1 with outlier channels" in worst.describe()


def test_no_outlier_no_outlier_words(tmp_path):
    trace = trace_of(tmp_path, outlier=False)
    assert all(e.channel_spread is None or e.channel_spread < 8 for e in trace)
    assert all("outlier" not in e.describe() for e in trace)
    assert min(e.sqnr_db for e in trace) > 25


def test_steps_rank_by_the_noise_they_add():
    small = TensorError("a", "Conv", sqnr_db=24.0, inputs_db=43.0, channel_spread=None)
    large = TensorError("b", "Conv", sqnr_db=0.8, inputs_db=9.5, channel_spread=None)
    assert small.drop_db > large.drop_db  # more dB lost, but of a tiny error
    assert large.added_noise == pytest.approx(10**-0.08 - 10**-0.95)
    assert [e.tensor for e in largest_drops([small, large])] == ["b", "a"]
    clean = TensorError("c", "Relu", sqnr_db=30.0, inputs_db=30.0, channel_spread=None)
    assert largest_drops([clean]) == []
