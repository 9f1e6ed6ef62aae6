"""Bias correction (quantization/bias_correction.py): a layer whose int8 weights all round
the same way shifts its output's mean; fast and full correction cancel it (the int8 model's
SQNR on held-out samples rises, the mean output shift falls), by rewriting bias
initializers only (nodes and every other initializer unchanged: the int32 biases of Conv
and Gemm, a MatMul's 8-bit Add constant with its scale); full also cancels the shift a
layer inherits from an uncorrectable layer upstream, which fast cannot see. Nothing changes
where quantization adds no shift; shared or missing biases and layers kept in float are
left alone; the statistics leave onnxruntime as per-channel sums, one sample at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from recovery import ort_quantize

from opfuse.quantization import _stats, bias_correction
from opfuse.quantization._stats import tensor_values
from opfuse.quantization.bias_correction import correct_bias
from opfuse.quantization.trace import sqnr_db

Feed = dict[str, np.ndarray]
RNG = np.random.default_rng(0)


def const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def biased_weight(cout: int, cin: int, k: int = 1, rng: np.random.Generator = RNG) -> np.ndarray:
    """Per output channel: one weight of 127 steps (it sets the int8 scale: step = max/127)
    and the others 0.45 of a step above an integer: int8 rounds every one of them down."""
    w = rng.integers(-100, 100, (cout, cin, k, k)).astype(np.float64) + 0.45
    w[:, 0, 0, 0] = 127.0
    return w * rng.uniform(0.005, 0.01, (cout, 1, 1, 1))


def model_of(
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    outputs: Sequence[tuple[str, list[int]]],
    cin: int = 16,
) -> onnx.ModelProto:
    graph = h.make_graph(
        nodes,
        "bc",
        [h.make_tensor_value_info("x", T.FLOAT, [1, cin, 8, 8])],
        [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
        initializer=inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def biased_net(channels: int = 32, conv1_bias: bool = True) -> onnx.ModelProto:
    """x [1,16,8,8] >= 0 -> Conv 1x1 -> Relu -> Conv 1x1 (output c2) -> GlobalAveragePool ->
    Flatten -> Gemm -> MatMul -> Add (output y); both Convs' int8 weights round down."""
    rng = np.random.default_rng(1)
    c = channels
    nodes = [
        h.make_node("Conv", ["x", "w1", *(["b1"] if conv1_bias else [])], ["c1"], name="conv1"),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        h.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
        h.make_node("Flatten", ["p"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="gemm", transB=1),
        h.make_node("MatMul", ["g", "wm"], ["mm"], name="mm"),
        h.make_node("Add", ["mm", "bm"], ["y"], name="add"),
    ]
    inits = [
        const("w1", biased_weight(c, 16, rng=rng)),
        *([const("b1", rng.normal(0, 0.1, c))] if conv1_bias else []),
        const("w2", biased_weight(c, c, rng=rng)),
        const("b2", rng.normal(0, 0.1, c)),
        const("wg", rng.normal(0, 0.3, (5, c))),
        const("bg", rng.normal(0, 0.1, 5)),
        const("wm", rng.normal(0, 0.3, (5, 3))),
        const("bm", rng.normal(0, 0.1, 3)),
    ]
    return model_of(nodes, inits, [("c2", [1, c, 8, 8]), ("y", [1, 3])])


def positive_samples(n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(0, 1, (1, 16, 8, 8)).astype(np.float32)} for _ in range(n)]


def quantize(
    model: onnx.ModelProto, samples: Sequence[Feed], tmp: Path, exclude: Sequence[str] = ()
) -> onnx.ModelProto:
    return ort_quantize(model, samples, tmp, exclude=exclude)


def compare(
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    name: str,
    samples: Sequence[Feed],
    qname: str | None = None,
) -> tuple[float, float]:
    """(SQNR in dB, mean of int8 - float) of tensor ``name`` (``qname`` in ``qm``) over
    ``samples``."""
    signal = noise = shift = 0.0
    count = 0
    qname = qname or name
    for f, q in zip(
        tensor_values(fm, [name], samples), tensor_values(qm, [qname], samples), strict=True
    ):
        x, y = f[name].astype(np.float64), q[qname].astype(np.float64)
        signal += float(np.sum(x**2))
        noise += float(np.sum((x - y) ** 2))
        shift += float(np.sum(y - x))
        count += x.size
    return sqnr_db(signal, noise), shift / count


def changed_initializers(before: onnx.ModelProto, after: onnx.ModelProto) -> set[str]:
    """The initializers whose values differ; asserts that the nodes, the graph's interface
    and every initializer's name, dtype and shape are the same."""
    assert [n.SerializeToString() for n in before.graph.node] == [
        n.SerializeToString() for n in after.graph.node
    ]
    assert before.graph.input == after.graph.input
    assert before.graph.output == after.graph.output
    old = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
    new = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert list(old) == list(new)
    for name in old:
        assert (old[name].dtype, old[name].shape) == (new[name].dtype, new[name].shape), name
    return {name for name in old if not np.array_equal(old[name], new[name])}


# --- where it must help ----------------------------------------------------------------------


@pytest.mark.parametrize("full", [False, True])
def test_a_systematic_rounding_bias_is_cancelled(full: bool, tmp_path: Path) -> None:
    model = biased_net()
    calib, held_out = positive_samples(16, 0), positive_samples(8, 100)
    qm = quantize(model, calib, tmp_path)
    before_db, before_shift = compare(model, qm, "c2", held_out)
    corrected, count = correct_bias(model, qm, calib, full=full)
    after_db, after_shift = compare(model, corrected, "c2", held_out)
    assert count == 4  # conv1, conv2, gemm, the MatMul's Add
    assert abs(before_shift) > 0.05
    assert abs(after_shift) < abs(before_shift) / 20
    assert after_db > before_db + 6.0, (before_db, after_db)
    assert compare(model, corrected, "g", held_out)[0] > compare(model, qm, "g", held_out)[0] + 3


@pytest.mark.parametrize("full", [False, True])
def test_only_bias_initializers_change(full: bool, tmp_path: Path) -> None:
    model = biased_net()
    calib = positive_samples(6, 1)
    qm = quantize(model, calib, tmp_path)
    original = qm.SerializeToString()
    corrected, count = correct_bias(model, qm, calib, full=full)
    assert qm.SerializeToString() == original  # the input is not touched
    changed = changed_initializers(qm, corrected)
    biases = {"b1_quantized", "b2_quantized", "bg_quantized", "bm_quantized"}
    assert biases <= changed <= biases | {"bm_scale", "bm_zero_point"}
    assert count == 4


def test_full_also_cancels_what_a_layer_inherits(tmp_path: Path) -> None:
    """conv1 has no bias (nothing to correct there): its shift reaches conv2 through the
    Relu. Fast corrects conv2 for its own rounding only; full for what it receives too."""
    model = biased_net(conv1_bias=False)
    calib, held_out = positive_samples(16, 2), positive_samples(8, 101)
    qm = quantize(model, calib, tmp_path)
    base = compare(model, qm, "c2", held_out)
    fast, fast_count = correct_bias(model, qm, calib)
    full, full_count = correct_bias(model, qm, calib, full=True)
    assert fast_count <= 3 and full_count <= 3  # conv1 has no bias
    assert "b2_quantized" in changed_initializers(qm, fast) & changed_initializers(qm, full)
    fast_db, fast_shift = compare(model, fast, "c2", held_out)
    full_db, full_shift = compare(model, full, "c2", held_out)
    assert abs(full_shift) < abs(fast_shift) / 5 < abs(base[1]) / 5
    assert full_db > fast_db + 3.0


def gemm_model(beta: float) -> onnx.ModelProto:
    """x -> GlobalAveragePool -> Flatten -> Gemm (transB, ``beta``) with weights that round down."""
    rng = np.random.default_rng(3)
    nodes = [
        h.make_node("GlobalAveragePool", ["x"], ["p"], name="pool"),
        h.make_node("Flatten", ["p"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "w", "b"], ["y"], name="gemm", transB=1, beta=beta),
    ]
    w = biased_weight(24, 16, rng=rng)[:, :, 0, 0] * 20
    return model_of(nodes, [const("w", w), const("b", rng.normal(0, 0.1, 24))], [("y", [1, 24])])


def test_gemm_with_beta(tmp_path: Path) -> None:
    """onnxruntime folds beta into the int32 bias's scale (and sets beta to 1)."""
    model = gemm_model(beta=2.0)
    calib, held_out = positive_samples(16, 4), positive_samples(8, 102)
    qm = quantize(model, calib, tmp_path)
    before = compare(model, qm, "y", held_out, "y_QuantizeLinear_Input")
    corrected, count = correct_bias(model, qm, calib)
    after = compare(model, corrected, "y", held_out, "y_QuantizeLinear_Input")
    assert count == 1
    assert abs(after[1]) < abs(before[1]) / 10
    assert after[0] > before[0] + 6.0


def test_a_float_bias_with_beta(tmp_path: Path) -> None:
    """A Gemm of the QDQ model whose bias is a float constant, beta = 2: the correction is
    written to that constant, divided by beta."""
    model = gemm_model(beta=2.0)
    calib, held_out = positive_samples(16, 4), positive_samples(8, 102)
    qm = quantize(model, calib, tmp_path)
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    (dq,) = [n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "b"]
    values = (inits[dq.input[0]] - inits[dq.input[2]]) * inits[dq.input[1]]
    qm.graph.node.remove(dq)
    for name in dq.input:
        qm.graph.initializer.remove(next(t for t in qm.graph.initializer if t.name == name))
    qm.graph.initializer.append(const("b", values / 2))
    gemm = next(n for n in qm.graph.node if n.op_type == "Gemm")
    next(a for a in gemm.attribute if a.name == "beta").f = 2.0
    before = compare(model, qm, "y", held_out, "y_QuantizeLinear_Input")
    assert [layer.bias.kind for layer in bias_correction._layers(model, qm)] == ["float"]
    corrected, count = correct_bias(model, qm, calib)
    after = compare(model, corrected, "y", held_out, "y_QuantizeLinear_Input")
    assert count == 1 and changed_initializers(qm, corrected) == {"b"}
    assert abs(after[1]) < abs(before[1]) / 10
    assert after[0] > before[0] + 6.0


# --- where it must change nothing ---------------------------------------------------------


def exact_model() -> tuple[onnx.ModelProto, list[Feed]]:
    """A Conv whose int8 weights and uint8 input are exact (the weights are integers times
    the channel's scale with 127 in each channel; the inputs are k/255 with 0 and 1 in every
    sample): the int8 layer adds no shift."""
    rng = np.random.default_rng(5)
    steps = rng.integers(-127, 128, (8, 16, 1, 1)).astype(np.float64)
    steps[:, 0] = 127
    w = steps * (2.0 ** -rng.integers(6, 9, (8, 1, 1, 1)))  # powers of two: exact products
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")]
    bias = np.round(rng.normal(0, 0.1, 8) * 2**12) / 2**12
    model = model_of(nodes, [const("w", w), const("b", bias)], [("y", [1, 8, 8, 8])])
    samples = []
    for _ in range(6):
        x = rng.integers(0, 256, (1, 16, 8, 8)).astype(np.float64)
        x.flat[0], x.flat[1] = 0, 255
        samples.append({"x": (x / 255).astype(np.float32)})
    return model, samples


@pytest.mark.parametrize("full", [False, True])
def test_no_shift_no_change(full: bool, tmp_path: Path) -> None:
    model, samples = exact_model()
    qm = quantize(model, samples, tmp_path)
    # what is left is the int32 bias rounding (under half of its step, ~1e-5)
    assert abs(compare(model, qm, "y", samples, "y_QuantizeLinear_Input")[1]) < 1e-5
    corrected, count = correct_bias(model, qm, samples, full=full)
    assert count == 0
    assert corrected.SerializeToString() == qm.SerializeToString()


def test_unbiased_rounding_is_left_about_as_it_was(tmp_path: Path) -> None:
    """Random weights, zero-mean inputs: the shifts are noise; the corrected model is no
    worse on held-out samples and its biases move by less than a rounding step's worth."""
    rng = np.random.default_rng(6)
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Conv", ["c1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    inits = [
        const("w1", rng.normal(0, 0.2, (16, 16, 3, 3))),
        const("b1", rng.normal(0, 0.1, 16)),
        const("w2", rng.normal(0, 0.2, (8, 16, 3, 3))),
        const("b2", rng.normal(0, 0.1, 8)),
    ]
    model = model_of(nodes, inits, [("y", [1, 8, 8, 8])])
    calib = [{"x": rng.normal(0, 1, (1, 16, 8, 8)).astype(np.float32)} for _ in range(16)]
    held_out = [{"x": rng.normal(0, 1, (1, 16, 8, 8)).astype(np.float32)} for _ in range(8)]
    qm = quantize(model, calib, tmp_path)
    before = compare(model, qm, "y", held_out)
    for full in (False, True):
        corrected, _ = correct_bias(model, qm, calib, full=full)
        after = compare(model, corrected, "y", held_out)
        assert after[0] > before[0] - 0.2
        old = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
        for t in corrected.graph.initializer:
            if t.name in ("b1_quantized", "b2_quantized"):
                scale = old[t.name + "_scale"].astype(np.float64)
                moved = (numpy_helper.to_array(t) - old[t.name]) * scale
                y_scale = float(old["y_scale"]) if "y_scale" in old else 1.0
                assert np.abs(moved).max() < y_scale, t.name  # under one output step


# --- what it leaves alone -------------------------------------------------------------------


def test_layers_without_a_correctable_bias_are_left_alone(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], name="nobias"),
        h.make_node("Conv", ["c1", "w2", "shared"], ["c2"], name="shared1"),
        h.make_node("Conv", ["c1", "w3", "shared"], ["c3"], name="shared2"),
        h.make_node("Conv", ["c1", "w4", "b4"], ["c4"], name="float_layer"),
    ]
    inits = [
        const("w1", biased_weight(8, 16, rng=rng)),
        const("w2", biased_weight(8, 8, rng=rng)),
        const("w3", biased_weight(8, 8, rng=rng)),
        const("shared", rng.normal(0, 0.1, 8)),
        const("w4", biased_weight(8, 8, rng=rng)),
        const("b4", rng.normal(0, 0.1, 8)),
    ]
    outs = [(n, [1, 8, 8, 8]) for n in ("c2", "c3", "c4")]
    model = model_of(nodes, inits, outs)
    calib = positive_samples(4, 8)
    qm = quantize(model, calib, tmp_path, exclude=["float_layer"])
    # onnxruntime gives each reader of a shared bias its own copy: share one again
    shared2 = next(n for n in qm.graph.node if n.name == "shared2")
    assert shared2.input[2] != "shared"
    shared2.input[2] = "shared"
    for full in (False, True):
        corrected, count = correct_bias(model, qm, calib, full=full)
        assert count == 0
        assert corrected.SerializeToString() == qm.SerializeToString()


def test_one_sample_and_none(tmp_path: Path) -> None:
    model = biased_net()
    calib = positive_samples(1, 9)
    qm = quantize(model, calib, tmp_path)
    for full in (False, True):
        corrected, count = correct_bias(model, qm, calib, full=full)
        assert count == 4
        assert abs(compare(model, corrected, "c2", calib)[1]) < 1e-3
        untouched, none = correct_bias(model, qm, [], full=full)
        assert none == 0 and untouched.SerializeToString() == qm.SerializeToString()


def test_initializers_listed_as_inputs(tmp_path: Path) -> None:
    """A float model that lists its initializers among its inputs (IR 3 style): full mode
    copies its nodes beside the quantized ones under other names all the same."""
    model = biased_net()
    model.graph.input.extend(
        h.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer
    )
    calib = positive_samples(6, 11)
    qm = quantize(biased_net(), calib, tmp_path)
    corrected, count = correct_bias(model, qm, calib, full=True)
    assert count >= 2
    assert abs(compare(model, corrected, "c2", calib)[1]) < abs(compare(model, qm, "c2", calib)[1])


# --- memory: per-channel sums, one sample at a time ---------------------------------------


@pytest.mark.parametrize("full", [False, True])
def test_only_per_channel_sums_leave_onnxruntime(
    full: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = biased_net(channels=32)
    calib = positive_samples(5, 10)
    qm = quantize(model, calib, tmp_path)
    runs: list[tuple[int, int]] = []  # per run: samples fed, the largest output's size

    def recording(proto: onnx.ModelProto, outputs: Sequence[str]):  # type: ignore[no-untyped-def]
        sess = _stats.session(proto, outputs)

        class Recorder:
            def get_inputs(self):  # type: ignore[no-untyped-def]
                return sess.get_inputs()

            def run(self, names, feed):  # type: ignore[no-untyped-def]
                got = sess.run(names, feed)
                runs.append((feed["x"].shape[0], max(np.asarray(v).size for v in got)))
                return got

        return Recorder()

    monkeypatch.setattr(bias_correction, "session", recording)
    correct_bias(model, qm, calib, full=full)
    assert runs and all(fed == 1 and size <= 32 for fed, size in runs)
    passes = len(runs) // len(calib)
    assert len(runs) == passes * len(calib)
    assert passes == (1 if not full else 4)  # full: one pass per level (4 layers in a chain)
