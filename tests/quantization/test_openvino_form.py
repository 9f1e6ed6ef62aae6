"""openvino_form: onnxruntime's QDQ form rewritten into the form OpenVINO runs in int8
(Q/DQ on the inputs of the compute ops, biases and outputs in float), on built models
quantized by onnxruntime's own quantize_static."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.quantization.openvino_form import (
    COMPUTE_INPUTS,
    DEFAULT_OPS,
    QUANTIZE_EXTRA_OPTIONS,
    openvino_form,
    openvino_form_report,
)
from qdq_models import calibration, cnn, quantize

Q, DQ = "QuantizeLinear", "DequantizeLinear"


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, feeds)[0])


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def quantized_inputs(model: onnx.ModelProto) -> set[tuple[str, int]]:
    """(reader node name, input index) of every input read through a DequantizeLinear."""
    made = producers(model)
    return {
        (n.name, i)
        for n in model.graph.node
        for i, name in enumerate(n.input)
        if name in made and made[name].op_type == DQ
    }


def quantized_tensors(model: onnx.ModelProto) -> set[str]:
    """The float tensors a QuantizeLinear reads (the activations still quantized)."""
    return {n.input[0] for n in model.graph.node if n.op_type == Q}


def output_scale(qdq: onnx.ModelProto) -> float:
    """The step of the pair onnxruntime put on the model's output."""
    made = producers(qdq)
    dq = made[qdq.graph.output[0].name]
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    return float(inits[dq.input[1]])


def conv_pool_model(seed: int = 0) -> onnx.ModelProto:
    """x -> conv1 -> Relu -> MaxPool -> conv2 -> (+ the MaxPool output: a residual Add)
    -> y; onnxruntime folds the Relu into the pair after conv1."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.15
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "p1"], ["y"], name="residual"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_the_compute_inputs_stay_quantized_biases_and_the_output_go_float(tmp_path: Path) -> None:
    model = cnn()
    qdq = quantize(model, tmp_path)
    form, report = openvino_form_report(qdq)
    onnx.checker.check_model(form, full_check=True)
    # the interface and the compute nodes' names are kept
    assert [i.name for i in form.graph.input] == ["x"]
    assert [o.name for o in form.graph.output] == ["y"]
    names = {n.name for n in form.graph.node}
    assert {"conv1", "conv2", "fc"} <= names
    # activations and weights into the Conv/Gemm inputs 0 and 1, nothing into a bias
    inputs = quantized_inputs(form)
    for node in ("conv1", "conv2", "fc"):
        assert (node, 0) in inputs and (node, 1) in inputs and (node, 2) not in inputs
    # the biases are float constants; no int32 is left
    inits = {t.name: t for t in form.graph.initializer}
    for bias in ("b1", "b2", "bf"):
        assert inits[bias].data_type == TensorProto.FLOAT
    assert not any(t.data_type == TensorProto.INT32 for t in form.graph.initializer)
    # the output is not requantized: y comes from the Gemm
    assert producers(form)["y"].op_type == "Gemm"
    assert "y_QuantizeLinear_Input" not in quantized_tensors(form)
    assert report.kept_weights == 3 and report.float_constants == 3
    # the weights are symmetric (zero point 0), per output channel
    made = producers(form)
    for node in form.graph.node:
        if node.op_type in COMPUTE_INPUTS:
            dq = made[node.input[1]]
            zero = numpy_helper.to_array(inits[dq.input[2]])
            assert zero.dtype == np.int8 and not zero.any() and zero.size > 1


def test_outputs_equal_the_onnxruntime_form_within_int8_steps(tmp_path: Path) -> None:
    model = cnn()
    qdq = quantize(model, tmp_path)
    form = openvino_form(qdq)
    step = output_scale(qdq)
    for feeds in calibration(model, 6, seed=7):
        ref, ort_form, ov_form = run(model, feeds), run(qdq, feeds), run(form, feeds)
        # the form drops roundings only: within a few of the output pair's steps
        assert np.abs(ov_form - ort_form).max() <= 2 * step
        assert np.abs(ov_form - ref).max() <= np.abs(ort_form - ref).max() + 2 * step


def test_a_folded_relu_keeps_its_clamp(tmp_path: Path) -> None:
    model = conv_pool_model()
    qdq = quantize(model, tmp_path)
    assert "Relu" not in {n.op_type for n in qdq.graph.node}  # onnxruntime folded it
    form, _ = openvino_form_report(qdq)
    onnx.checker.check_model(form, full_check=True)
    made = producers(form)
    pool = next(n for n in form.graph.node if n.op_type == "MaxPool")
    clip = made[pool.input[0]]
    assert clip.op_type == "Clip"  # the MaxPool reads the float tensor, clamped at 0
    inits = {t.name: numpy_helper.to_array(t) for t in form.graph.initializer}
    assert float(inits[clip.input[1]]) == 0.0
    for feeds in calibration(model, 6, seed=3):
        ref, ort_form, ov_form = run(model, feeds), run(qdq, feeds), run(form, feeds)
        assert np.abs(ov_form - ref).max() <= np.abs(ort_form - ref).max() + 2 * output_scale(qdq)
    # without the Clip the negative conv outputs would pass: the test can fail
    unclamped = onnx.ModelProto()
    unclamped.CopyFrom(form)
    for node in unclamped.graph.node:
        if node.op_type == "MaxPool":
            node.input[0] = clip.input[0]
    feeds = calibration(model, 1, seed=3)[0]
    assert np.abs(run(unclamped, feeds) - run(model, feeds)).max() > 0.1


def test_with_the_activations_kept_no_clamp_is_needed(tmp_path: Path) -> None:
    model = conv_pool_model()
    qdq = quantize(model, tmp_path, extra=dict(QUANTIZE_EXTRA_OPTIONS))
    assert "Relu" in {n.op_type for n in qdq.graph.node}
    form = openvino_form(qdq)
    assert "Clip" not in {n.op_type for n in form.graph.node}
    feeds = calibration(model, 1, seed=3)[0]
    ref = run(model, feeds)
    bound = np.abs(run(qdq, feeds) - ref).max() + 2 * output_scale(qdq)
    assert np.abs(run(form, feeds) - ref).max() <= bound


def test_the_residual_add_is_float_unless_asked(tmp_path: Path) -> None:
    model = conv_pool_model()
    qdq = quantize(model, tmp_path, extra=dict(QUANTIZE_EXTRA_OPTIONS))
    inputs = quantized_inputs(openvino_form(qdq))
    assert ("residual", 0) not in inputs and ("residual", 1) not in inputs
    assert ("conv2", 0) in inputs and ("pool", 0) not in inputs
    with_add = openvino_form(qdq, ops=DEFAULT_OPS | {"Add"})
    inputs = quantized_inputs(with_add)
    assert ("residual", 0) in inputs and ("residual", 1) in inputs
    feeds = calibration(model, 1, seed=3)[0]
    ref = run(model, feeds)
    bound = np.abs(run(qdq, feeds) - ref).max() + 2 * output_scale(qdq)
    assert np.abs(run(with_add, feeds) - ref).max() <= bound


def test_asymmetric_weights_are_made_symmetric(tmp_path: Path) -> None:
    model = cnn()
    # onnxruntime writes zero points per tensor only (per channel its int8 is symmetric)
    qdq = quantize(model, tmp_path, per_channel=False, extra={"WeightSymmetric": False})
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    assert inits["w1_zero_point"].any()  # the case exists
    # and a per-channel one by hand: zero points of 3 (other weights, a valid model)
    channel = quantize(model, tmp_path)
    for t in channel.graph.initializer:
        if t.name == "w1_zero_point":
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) + np.int8(3), t.name))
    feeds = calibration(model, 1, seed=7)[0]
    for source, count in ((qdq, 3), (channel, 1)):
        form, report = openvino_form_report(source)
        assert report.requantized_weights == count
        inits = {t.name: numpy_helper.to_array(t) for t in form.graph.initializer}
        made = producers(form)
        for node in form.graph.node:
            if node.op_type in COMPUTE_INPUTS:
                assert not inits[made[node.input[1]].input[2]].any()
        # re-quantized weights: their own rounding (a step of a wider range), no more
        ref = run(source, feeds)
        assert np.abs(run(form, feeds) - ref).max() <= 0.05 * np.abs(ref).max() + 2 * (
            output_scale(source)
        )


def test_symmetric_activations(tmp_path: Path) -> None:
    model = cnn()
    qdq = quantize(model, tmp_path)
    form, report = openvino_form_report(qdq, symmetric_activations=True)
    assert report.symmetric_activations >= 1
    inits = {t.name: numpy_helper.to_array(t) for t in form.graph.initializer}
    for node in form.graph.node:
        if node.op_type == Q:
            assert not inits[node.input[2]].any()
    x_zero = inits[
        next(n for n in form.graph.node if n.op_type == Q and n.input[0] == "x").input[2]
    ]
    assert x_zero.dtype == np.int8  # x has negative values: int8 over the larger side
    feeds = calibration(model, 1, seed=7)[0]
    assert np.abs(run(form, feeds) - run(model, feeds)).max() < 0.1


def test_idempotent_and_a_float_model_is_left_alone(tmp_path: Path) -> None:
    model = conv_pool_model()
    form = openvino_form(quantize(model, tmp_path))
    again = openvino_form(form)
    assert [(n.op_type, list(n.input), list(n.output)) for n in again.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in form.graph.node
    ]
    plain = openvino_form(model)
    assert plain.graph == model.graph


def test_a_graph_output_that_a_compute_op_also_reads(tmp_path: Path) -> None:
    """The pair of an output read by a Conv too: the DequantizeLinear stays for the Conv
    under another name, the output comes from the float tensor."""
    model = conv_pool_model()
    model.graph.output.append(helper.make_tensor_value_info("p1", TensorProto.FLOAT, None))
    qdq = quantize(model, tmp_path)
    form = openvino_form(qdq)
    onnx.checker.check_model(form, full_check=True)
    assert [o.name for o in form.graph.output] == ["y", "p1"]
    made = producers(form)
    assert made["p1"].op_type != DQ
    conv2 = next(n for n in form.graph.node if n.name == "conv2")
    assert made[conv2.input[0]].op_type == DQ


def test_runs_on_openvino(tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino")
    model = cnn()
    qdq = quantize(model, tmp_path)
    path = tmp_path / "form.onnx"
    onnx.save_model(openvino_form(qdq), str(path))
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": 1})
    feeds = calibration(model, 1, seed=7)[0]
    got = np.asarray(compiled(feeds)[0])
    assert np.abs(got - run(qdq, feeds)).max() <= 4 * output_scale(qdq)
