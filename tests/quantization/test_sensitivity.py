"""The activation measure of the fallback's ranking: a tensor's own rounding error with
the scale the quantizer chose, on the float model's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.quantization import flow
from opfuse.quantization.sensitivity import activation_candidates

RNG = np.random.default_rng(0)


def two_branch_model(path: Path) -> Path:
    """x -> MatMul "mm" -> a -> Concat "spiky" (with a constant 300) -> b -> MatMul "out"
    -> y. b's one large value is about 100x the others: its range sets b's uint8 step, so
    the rest round coarsely and "b" must rank worst (its 20,000 other values still hold
    most of its energy, so the SQNR sees it)."""
    rng = np.random.default_rng(0)
    width = 20_000
    w1 = rng.uniform(-1, 1, (8, width)).astype(np.float32)
    w2 = rng.uniform(-1, 1, (width + 1, 4)).astype(np.float32)
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w1"], ["a"], name="mm"),
            h.make_node("Concat", ["a", "spike"], ["b"], name="spiky", axis=1),
            h.make_node("MatMul", ["b", "w2"], ["y"], name="out"),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.full((1, 1), 300.0, np.float32), "spike"),
        ],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def test_the_tensor_with_an_outlier_ranks_first_with_its_producer_and_reader(tmp_path):
    model = two_branch_model(tmp_path / "m.onnx")
    samples = [{"x": RNG.standard_normal((1, 8)).astype(np.float32)} for _ in range(6)]
    qdq = tmp_path / "m.qdq.onnx"
    flow.quantize(model, qdq, samples, flow.QuantOptions())
    assert flow.quantized_nodes(qdq) == ["mm", "spiky", "out"]
    found = activation_candidates(model, qdq, samples)
    worst = found[0]
    assert worst.label == "tensor b" and worst.nodes == ("spiky", "out")
    assert worst.how == "own rounding"
    by_label = {c.label: c for c in found}
    assert "tensor a" in by_label and by_label["tensor a"].sqnr_db > worst.sqnr_db + 10
    # the figure is the rounding error itself: recompute it for "a" by hand
    quantized = onnx.load(str(qdq))
    inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    q = next(n for n in quantized.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "a")
    scale, zero = float(inits[q.input[1]]), float(inits[q.input[2]])
    w1 = numpy_helper.to_array(onnx.load(str(model)).graph.initializer[0]).astype(np.float64)
    values = [s["x"].astype(np.float64) @ w1 for s in samples]
    signal = sum(float(np.sum(v**2)) for v in values)
    noise = sum(
        float(np.sum((v - (np.clip(np.round(v / scale) + zero, 0, 255) - zero) * scale) ** 2))
        for v in values
    )
    assert by_label["tensor a"].sqnr_db == pytest.approx(10 * np.log10(signal / noise), abs=0.05)


def test_the_gate_keeps_a_tensor_without_weights_in_float(tmp_path):
    """No weighted layer alone explains the error: the fallback keeps the Concat's output
    (its producer and reader) in float and the gate holds."""
    from opfuse.quantization.conductor import quantize_file

    model = two_branch_model(tmp_path / "m.onnx")
    data = tmp_path / "x.npz"
    np.savez(data, x=np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32))
    plain = quantize_file(
        model, tmp_path / "plain.onnx", data, max_drop="off", benchmark=False, recipe="minmax"
    )
    assert plain.accuracy[0].sqnr_db < 30
    gated = quantize_file(
        model, tmp_path / "out.onnx", data, max_drop="sqnr=30", benchmark=False, recipe="minmax"
    )
    assert gated.accuracy[0].sqnr_db >= 30
    assert [(k.node, k.in_float, k.how) for k in gated.kept_float] == [
        ("tensor b", ("spiky", "out"), "own rounding")
    ]
    assert "tensor b (" in "\n".join(gated.lines())
    assert gated.to_json()["kept_float"][0]["nodes"] == ["spiky", "out"]


def test_weight_rounding_ranks_a_layer_named_as_its_output():
    """SmolLM2's builder names each MatMul node as its output ("layers.3.q_proj"): the
    weight's rounding delta and the layer's error got the same name, and onnxruntime
    refused the ranking model (duplicate definition), exit 3 in the fallback."""
    from opfuse.quantization.sensitivity import weight_candidates

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, 1, (8, 8)).astype(np.float32), "w")
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "w"], ["proj"], name="proj")],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
        [h.make_tensor_value_info("proj", T.FLOAT, [1, 8])],
        initializer=[w],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    x = rng.normal(0, 1, (1, 8)).astype(np.float32)
    [found] = weight_candidates(model, ["proj"], [{"x": x}])
    assert found.label == "proj" and 30 < found.sqnr_db < 60
