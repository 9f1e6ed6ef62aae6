"""The conductor of opfuse quantize: a valid model the quantizer raises on still ends in a
model (the int32-bias weight-scale adjustment on a Gemm bias shaped [1, N]), the
held-back split with 1 to 9 samples, the recipe choice and its report, heads kept in
float by measurement, the Python API on a ModelProto with arrays, and the speed verdict
in words on the fake runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import opfuse
from opfuse.errors import OpfuseError
from opfuse.quantization import calibration, flow, ort_backend
from opfuse.quantization.conductor import quantize_file

RNG = np.random.default_rng(0)


def gemm_bias_1xn(n_out: int = 6) -> onnx.ModelProto:
    """x [N, 8] -> Gemm with its bias C shaped [1, n_out] (as opfuse fuses a MatMul + Add
    whose constant is [1, N]: a byte classifier's dense head) -> Softmax."""
    w = RNG.normal(0, 0.5, (8, n_out)).astype(np.float32)
    c = RNG.normal(0, 0.1, (1, n_out)).astype(np.float32)
    graph = h.make_graph(
        [
            h.make_node("Gemm", ["x", "w", "c"], ["z"], name="dense"),
            h.make_node("Softmax", ["z"], ["probs"], name="softmax", axis=-1),
        ],
        "head",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 8])],
        [h.make_tensor_value_info("probs", T.FLOAT, ["N", n_out])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def feeds(n: int, shape: tuple[int, ...] = (1, 8), seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


def test_onnxruntime_raises_on_a_gemm_bias_shaped_1xn():
    """The failure itself: onnxruntime's quantizer indexes the bias per output channel in
    its int32-bias weight-scale adjustment; a [1, N] bias makes numpy's 'truth value of an
    array ... is ambiguous'. If this stops raising, onnxruntime fixed it."""
    import tempfile

    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = iter(feeds(4))

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(gemm_bias_1xn(), f"{tmp}/m.onnx")
        with pytest.raises(ValueError, match="truth value of an array"):
            q.quantize_static(f"{tmp}/m.onnx", f"{tmp}/q.onnx", Reader(),
                              quant_format=q.QuantFormat.QDQ, per_channel=True)  # fmt: skip


def test_the_quantizer_failure_is_worked_around_and_said():
    """The [1, N] bias is given as [N] (exact); the model runs and matches the float one
    closely."""
    import onnxruntime as ort

    notes: list[str] = []
    float_model = gemm_bias_1xn()
    model = ort_backend.quantize_proto(
        float_model, feeds(64), flow.QuantOptions(), [], name="m.onnx", notes=notes
    )
    [note] = notes
    assert "the bias of Gemm dense is given to onnxruntime's quantizer as a vector [N]" in note
    assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    x = feeds(1, (4, 8), seed=1)[0]  # within the calibrated ranges
    got = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    want = ort.InferenceSession(float_model.SerializeToString()).run(None, x)[0]
    assert np.abs(got - want).max() < 0.05


def test_the_option_or_node_that_makes_the_quantizer_raise_is_found(monkeypatch):
    """Whatever else raises: inside the int32-bias adjustment, that adjustment is turned
    off; else the node the quantizer was working on is kept in float; each said."""
    calls: list[tuple[list[str], dict[str, object]]] = []

    def _adjust_weight_scale_for_int32_bias():  # the name onnxruntime's frame has
        raise ValueError("The truth value of an array with more than one element is ambiguous")

    def fake(model, samples, options, exclude, extra, cache=None):
        calls.append((list(exclude), dict(extra)))
        if not extra.get(ort_backend.INT32_BIAS_OPTION):
            _adjust_weight_scale_for_int32_bias()
        node = model.graph.node[0]  # noqa: F841 - read from the traceback
        if "dense" not in exclude:
            raise KeyError("zero_point")
        return model

    monkeypatch.setattr(ort_backend, "_quantize_once", fake)
    notes: list[str] = []
    extra: dict[str, object] = {}
    exclude: list[str] = []
    ort_backend.quantize_proto(gemm_bias_1xn(), feeds(2), flow.QuantOptions(), exclude, name="m.onnx",
                        notes=notes, extra_options=extra)  # fmt: skip
    assert (
        extra == {ort_backend.INT32_BIAS_OPTION: True} and exclude == ["dense"] and len(calls) == 3
    )
    assert "in its int32-bias weight-scale adjustment" in notes[1]
    assert "while quantizing node dense (Gemm): that node is kept in float" in notes[2]


def test_a_valid_model_the_quantizer_raises_on_ends_in_a_model(tmp_path):
    """End to end (the CLI's path): a model, the workaround in the summary, and no
    temporary file named anywhere."""
    path = tmp_path / "bytes_classifier.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"] for f in feeds(24)]))
    result = quantize_file(path, tmp_path / "out.onnx", tmp_path / "calib.npz", benchmark=False,
                           max_drop="off")  # fmt: skip
    assert (tmp_path / "out.onnx").exists()
    text = result.summary()
    assert "note: the bias of Gemm dense is given to onnxruntime's quantizer as a vector" in text
    assert "/tmp/" not in text.replace(str(tmp_path), "") and ".opfuse" not in text


def test_an_internal_failure_is_exit_3_naming_the_users_model(monkeypatch):
    from opfuse.quantization.workspace import QuantizeInternalError

    def broken(*args, **kwargs):
        raise RuntimeError("something inside onnxruntime")

    monkeypatch.setattr(ort_backend, "_quantize_once", broken)
    with pytest.raises(QuantizeInternalError, match=r"^m\.onnx: onnxruntime's quantizer failed: "
                       r"something inside onnxruntime; try --exclude") as info:  # fmt: skip
        ort_backend.quantize_proto(gemm_bias_1xn(), feeds(2), flow.QuantOptions(), [], name="m.onnx",
                            notes=[])  # fmt: skip
    assert info.value.exit_code == 3


@pytest.mark.parametrize("n", range(1, 10))
def test_the_held_back_split_with_1_to_9_samples(n):
    """A held-back sample is never a calibration sample; 1 sample is refused; the
    validation part is held apart from 4 calibration samples on, else said."""
    samples = [{"x": np.full(1, i)} for i in range(n)]
    if n == 1:
        with pytest.raises(OpfuseError, match="holds 1 sample: give at least 2"):
            calibration.split(samples)
        return
    calib, held = calibration.split(samples)
    ids = lambda part: [int(s["x"][0]) for s in part]  # noqa: E731
    assert held and calib and not set(ids(calib)) & set(ids(held))
    assert sorted(ids(calib) + ids(held)) == list(range(n))
    assert len(held) == max(1, n // 4)
    fit, valid, apart = calibration.validation_split(calib)
    if len(calib) >= calibration.MIN_VALIDATION_SPLIT:
        assert (
            apart and not set(ids(fit)) & set(ids(valid)) and not set(ids(valid)) & set(ids(held))
        )
    else:
        assert not apart and ids(fit) == ids(valid) == ids(calib)


def test_few_samples_are_warned_about(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"] for f in feeds(8)]))
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    assert result.eval_samples == 2
    assert any("rest on 2 samples" in w for w in result.warnings)
    assert result.output is None and result.model is not None  # nothing written: no output


def test_the_api_takes_a_modelproto_and_arrays_and_returns_one(tmp_path):
    model = gemm_bias_1xn()
    data = {"x": np.concatenate([f["x"] for f in feeds(16)])}
    result = opfuse.quantize(model, calibration=data, eval=feeds(12, seed=1), benchmark=False,
                             max_drop="off")  # fmt: skip
    assert isinstance(result, opfuse.QuantizeResult)
    assert isinstance(result.model, onnx.ModelProto)
    assert any(n.op_type == "QuantizeLinear" for n in result.model.graph.node)
    assert result.eval_samples == 12 and "samples from the eval data given" in result.summary()
    assert repr(result).startswith("QuantizeResult(recipe='") and len(repr(result)) < 120
    assert model.graph.node[0].op_type == "Gemm"  # the model given is not changed
    # wrong types: one-line OpfuseError, not a numpy traceback
    for kwargs, message in [
        ({"calibration": 3}, "calibration: expected a path, a mapping"),
        ({"calibration": {"x": "abc"}}, r"calibration\['x'\]: not an array of numbers"),
        ({"calibration": [{"y": np.zeros((1, 8), np.float32)}]}, "sample 0 has"),
        ({"calibration": [np.zeros((1, 8))]}, "sample 0 is a ndarray"),
        ({"calibration": data, "exclude": "dense"}, "exclude: expected a list"),
        ({"calibration": data, "samples": "4"}, "samples: expected an int"),
    ]:
        with pytest.raises(OpfuseError, match=message):
            opfuse.quantize(model, benchmark=False, **kwargs)
    with pytest.raises(OpfuseError, match="model: expected a path or an onnx.ModelProto"):
        opfuse.quantize(b"bytes", calibration=data)  # type: ignore[arg-type]


def test_a_forced_recipe_and_the_report_list_each_recipe(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"] for f in feeds(16)]))
    report = tmp_path / "r.json"
    result = quantize_file(path, tmp_path / "o.onnx", tmp_path / "c.npz", benchmark=False,
                           recipe="minmax", report=report)  # fmt: skip
    data = json.loads(report.read_text())
    assert data["recipe"] == "minmax" and [r["recipe"] for r in data["recipes"]] == ["minmax"]
    assert data["recipes"][0]["kept"] is True and data["recipes"][0]["validation"]
    assert "kept: minmax" in result.summary()
    with pytest.raises(OpfuseError, match="--recipe 'minmax,mse': one of minmax, mse"):
        quantize_file(path, tmp_path / "o2.onnx", tmp_path / "c.npz", recipe="minmax,mse")
    with pytest.raises(OpfuseError, match="--recipe 'fast'"):
        quantize_file(path, tmp_path / "o2.onnx", tmp_path / "c.npz", recipe="fast")


def measured(original_ms: float, optimized_ms: float, int8_ms: float):  # type: ignore[no-untyped-def]
    from opfuse.quantization.result import FLOAT_OPT, INT8
    from opfuse.tuning.measure import AGAIN, ORIGINAL, Measurement

    rounds = 5
    times = {
        ORIGINAL: [original_ms / 1000] * rounds,
        AGAIN: [original_ms / 1000] * rounds,
        FLOAT_OPT: [optimized_ms / 1000] * rounds,
        INT8: [int8_ms / 1000] * rounds,
    }
    return Measurement("fake 1.0", rounds, times)


def verdict(speed, coverage=None, flags=("avx2", "avx512f", "avx512_vnni"), kept=(), hardswish=0):  # type: ignore[no-untyped-def]
    from opfuse.quantization.fallback import KeptFloat
    from opfuse.quantization.gate import Gate
    from opfuse.quantization.result import QuantizeResult
    from opfuse.runtime.cpu import CpuFeatures

    result = QuantizeResult(None, [], Gate(), 8, 4, "samples", [KeptFloat(k, 1.0) for k in kept])  # type: ignore[arg-type]
    result.speed, result.cpu, result.coverage = speed, CpuFeatures(frozenset(flags)), coverage
    result.sizes = {"original": 10_400_000, "int8": 2_800_000}
    result.hardswish_written_out = hardswish
    return result.speed_verdict()


def test_the_speed_verdict_when_int8_pays():
    text = verdict(measured(20.0, 18.0, 8.0))
    assert text.startswith("int8 pays on this machine: 8 ms against 20 ms for the float original")
    assert "2.50x faster" in text and "the float optimized model 18 ms" in text
    assert "2.8 MB against 10.4 MB" in text and "AVX512-VNNI" in text
    assert "measure to confirm" not in text


def test_the_speed_verdict_says_when_the_medians_disagree_with_the_paired_ratio():
    from opfuse.quantization.result import FLOAT_OPT, INT8
    from opfuse.tuning.measure import AGAIN, ORIGINAL, Measurement

    steady = verdict(measured(20.0, 18.0, 8.0))
    assert "paired; the medians give" not in steady
    # the load fell while the int8 model ran its fifth round: every round's ratio is 0.6
    # but one (0.2), the medians' ratio 6 / 30 ms = 0.2
    original = [0.030] * 5 + [0.010] * 4
    int8 = [0.018] * 4 + [0.006] * 5
    times = {ORIGINAL: original, AGAIN: original, FLOAT_OPT: original, INT8: int8}
    moved = Measurement("fake 1.0", 9, times)
    text = verdict(moved)
    assert "1.67x faster (paired; the medians give 5.00x" in text


def test_the_speed_verdict_names_the_measured_cause():
    from opfuse.quantization.kernels import KernelCoverage

    hardswish = KernelCoverage(
        integer_ops={"QLinearConv": 20},
        float_between_qdq={"HardSigmoid": 11, "Mul": 11},
        integer_fraction=1.0,
        total_macs=10**8,
    )
    text = verdict(measured(1.0, 0.9, 1.5), hardswish, hardswish=11)
    assert text.startswith("int8 does not pay on this machine: 1.5 ms against 1 ms")
    assert (
        "22 float ops stay between DequantizeLinear and QuantizeLinear (HardSigmoid 11, Mul 11)"
        in text
    )
    assert "Up to 11 of them are HardSwish written out" in text and "try --target-opset 14" in text
    # the HardSwish ops of the layers kept in float, or run as QLinearMul, are not among them
    se_only = KernelCoverage(
        integer_ops={"QLinearConv": 20},
        float_between_qdq={"HardSigmoid": 2, "Div": 5},
        integer_fraction=1.0,
        total_macs=10**8,
    )
    assert "HardSwish" not in verdict(measured(1.0, 0.9, 1.5), se_only, hardswish=28)
    # a HardSigmoid gating another tensor (squeeze-excite) is not a HardSwish: no advice
    assert "--target-opset" not in verdict(measured(1.0, 0.9, 1.5), hardswish)
    assert "The model runs in 1 ms" in text  # small: the Q/DQ costs what int8 saves
    assert "measure to confirm" not in text and "faster choice here" in text
    # the multiply-adds left in float, and a CPU without VNNI
    partial = KernelCoverage(integer_fraction=0.4, total_macs=10**8)
    text = verdict(measured(30.0, 28.0, 31.0), partial, flags=("avx2",), kept=("conv1", "conv2"))
    assert (
        "Only 40% of the multiply-adds run in integer kernels (conv1, conv2 kept in float" in text
    )
    assert "This CPU has no VNNI" in text and "The model runs in" not in text
    # nothing to name: said as measured, with what to try
    full = KernelCoverage(integer_fraction=1.0, total_macs=10**8)
    text = verdict(measured(30.0, 28.0, 31.0), full)
    assert "every multiply-add runs in integer kernels" in text and "--runtime" in text


def test_the_speed_verdict_end_to_end_on_the_fake_runtime(tmp_path):
    """The fake runtime's costs decide: Q/DQ expensive, int8 loses and the text says why."""
    from opfuse.runtime.fake import FakeRuntime

    path = tmp_path / "m.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"] for f in feeds(16)]))
    slow = FakeRuntime({"QuantizeLinear": 0.01, "DequantizeLinear": 0.01}, default=0.001)
    result = quantize_file(path, tmp_path / "o.onnx", tmp_path / "c.npz", runtime=slow,
                           max_drop="off", write_slower=True)  # fmt: skip
    assert result.pays() is False
    line = next(x for x in result.lines() if x.startswith("int8 does not pay on this machine"))
    assert "Measured cause:" in line and "ms against" in line
    fast = FakeRuntime({"Gemm": 0.05, "Softmax": 0.05}, default=0.0)
    result = quantize_file(path, tmp_path / "o2.onnx", tmp_path / "c.npz", runtime=fast,
                           max_drop="off", write_slower=True)  # fmt: skip
    assert result.to_json()["speed"]["verdict"] == result.speed_verdict()


def many_classes(path: Path, classes: int = 200) -> Path:
    """x [N, C] -> MatMul by the identity -> Softmax over C classes: probabilities near
    1/C, below the 1/255 step of the [0, 1] range onnxruntime's quantizer fixes for a
    Softmax output, so the requantized top class ties with others."""
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "eye"], ["z"], name="logits"),
            h.make_node("Softmax", ["z"], ["probs"], name="softmax", axis=-1),
        ],
        "classes",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", classes])],
        [h.make_tensor_value_info("probs", T.FLOAT, ["N", classes])],
        initializer=[numpy_helper.from_array(np.eye(classes, dtype=np.float32), "eye")],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def class_samples(path: Path, n: int, classes: int = 200, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 1, classes)).astype(np.float32)
    x[np.arange(n), 0, rng.integers(0, classes, n)] += 0.1  # a top class, clear in the logits
    np.savez(path, x=x)
    return path


def test_a_softmax_head_whose_requantization_changes_the_top_class_stays_float(tmp_path):
    model = many_classes(tmp_path / "m.onnx")
    result = quantize_file(model, tmp_path / "o.onnx", class_samples(tmp_path / "c.npz", 16),
                           eval=class_samples(tmp_path / "e.npz", 12, seed=4),
                           benchmark=False, max_drop="off", recipe="minmax")  # fmt: skip
    [head] = result.heads
    assert head.op_type == "Softmax" and head.in_float
    assert head.float_top1 is not None and head.int8_top1 is not None
    assert head.float_top1 > head.int8_top1
    assert "the Softmax head making probs keeps a float output" in result.summary()
    # the MatMul making the logits keeps int8 inputs; its output and the Softmax's are float
    assert result.to_json()["heads"][0]["float_sqnr_db"] is not None
    graph = onnx.load(str(tmp_path / "o.onnx")).graph
    producer = {o: n for n in graph.node for o in n.output}
    assert producer["probs"].op_type == "Softmax"  # no QuantizeLinear/DequantizeLinear after it
    logits = producer[producer["probs"].input[0]]
    assert logits.op_type == "MatMul"  # nor between the logits and the Softmax
    assert producer[logits.input[0]].op_type == "DequantizeLinear"  # its input stays int8
    [acc] = result.accuracy
    assert acc.top1 is not None and acc.top1 >= 0.8


def test_a_head_whose_requantization_keeps_the_top_class_stays_int8(tmp_path):
    """Two classes: requantizing the probabilities changes no top class, and the error
    comes from the input's rounding (every other sample has a logit of 400: a step of 1.6
    on the input), which a float output does not remove (an SQNR gain below 1 dB)."""
    model = many_classes(tmp_path / "m.onnx", classes=2)
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, (16, 1, 2)).astype(np.float32)
    x[:, 0, 0] += 2.0 * (rng.uniform(size=16) > 0.5)
    x[::2, 0, 1] = 400.0
    np.savez(tmp_path / "c.npz", x=x)
    result = quantize_file(model, tmp_path / "o.onnx", tmp_path / "c.npz", benchmark=False,
                           max_drop="off")  # fmt: skip
    [head] = result.heads
    assert not head.in_float and "stays requantized: the same top class" in head.describe()
    assert head.float_sqnr_db is not None and head.int8_sqnr_db is not None
    assert head.float_sqnr_db < head.int8_sqnr_db + 1.0


def test_a_softmax_written_out_scores_classes():
    """Div(Exp(x), ReduceSum(Exp(x))) (tf2onnx, jax2tf) is a classifier head; a Div of
    anything else is not."""
    from opfuse.quantization.accuracy import scoring_outputs

    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [
        h.make_node("Exp", ["x"], ["e"]),
        h.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
        h.make_node("Div", ["e", "s"], ["probs"]),
        h.make_node("Div", ["x", "s"], ["ratio"]),
    ]
    graph = h.make_graph(
        nodes,
        "softmax",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 5])],
        [h.make_tensor_value_info(n, T.FLOAT, [1, 5]) for n in ("probs", "ratio")],
        initializer=[axes],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert scoring_outputs(model) == {"probs"}


def test_a_softmax_written_out_with_a_broadcast_sum_scores_classes():
    """jax2tf's Softmax (magika's head) divides by Expand(Reshape(ReduceSum(Exp))): still
    class scores; the same Div of a Relu by that sum is not."""
    from opfuse.quantization.accuracy import scoring_outputs

    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array([1, 5], np.int64), "shape"),
    ]
    nodes = [
        h.make_node("Exp", ["x"], ["e"]),
        h.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=0),
        h.make_node("Unsqueeze", ["s", "axes"], ["r"]),
        h.make_node("Expand", ["r", "shape"], ["b"]),
        h.make_node("Div", ["e", "b"], ["probs"]),
        h.make_node("Relu", ["x"], ["y"]),
        h.make_node("Div", ["y", "b"], ["ratio"]),
    ]
    graph = h.make_graph(
        nodes,
        "softmax",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 5])],
        [h.make_tensor_value_info(n, T.FLOAT, [1, 5]) for n in ("probs", "ratio")],
        initializer=inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    assert scoring_outputs(model) == {"probs"}


def test_runtime_openvino_writes_openvinos_qdq_form(tmp_path):
    """--runtime openvino: Q/DQ on the compute ops' inputs, the output not requantized."""
    from opfuse.runtime.settings import RuntimeSettings

    path = tmp_path / "m.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"] for f in feeds(16)]))
    result = quantize_file(path, tmp_path / "o.onnx", tmp_path / "c.npz", benchmark=False,
                           max_drop="off", recipe="minmax",
                           runtime=RuntimeSettings(runtime="openvino"))  # fmt: skip
    assert result.form == "openvino" and result.to_json()["form"] == "openvino"
    assert any("written in OpenVINO's QDQ form" in n for n in result.notes)
    graph = onnx.load(str(tmp_path / "o.onnx")).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    dense = next(n for n in graph.node if n.name == "dense")
    assert producer[dense.input[0]] == "DequantizeLinear"  # the input quantized
    assert producer[dense.output[0]] == "Gemm" and producer["probs"] != "DequantizeLinear"
    plain = quantize_file(path, tmp_path / "o2.onnx", tmp_path / "c.npz", benchmark=False,
                          max_drop="off", recipe="minmax")  # fmt: skip
    assert plain.form == "onnxruntime"


def test_hardswish_written_out_is_counted():
    from opfuse.quantization.result import decomposed_hardswish

    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    lo, hi = (
        numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0.0, "lo"), (6.0, "hi"))
    )
    nodes = [
        h.make_node("HardSigmoid", ["x"], ["hs"]),
        h.make_node("Mul", ["x", "hs"], ["a"]),  # x * HardSigmoid(x): one
        h.make_node("HardSigmoid", ["a"], ["gate"]),
        h.make_node("Mul", ["x", "gate"], ["b"]),  # a gate on another tensor: none
        h.make_node("Add", ["b", "three"], ["b3"]),
        h.make_node("Clip", ["b3", "lo", "hi"], ["c"]),
        h.make_node("Mul", ["b", "c"], ["y"]),  # b * Clip(b + 3, 0, 6): two
    ]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4])], [three, lo, hi])  # fmt: skip
    assert decomposed_hardswish(h.make_model(graph)) == 2


def test_auto_tries_each_change_in_cost_order_and_keeps_the_best(tmp_path, monkeypatch):
    """The recipes tried are minmax, then one change at a time to the best so far; a
    change that scores no better is not kept; the budget skips what would not fit, said,
    without running the step to see whether it applies."""
    from opfuse.quantization import recipes, steps

    path = tmp_path / "m.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"] for f in feeds(24)]))
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    names = [r["recipe"] for r in result.recipes]
    assert names[0] == "minmax" and "mean-minmax" in names[1]
    assert sum(r["kept"] for r in result.recipes) == 1
    kept = next(r for r in result.recipes if r["kept"])
    assert kept["recipe"] == result.recipe and f"kept: {result.recipe}" in result.summary()
    # 24 samples: 6 held back for evaluation, 18 calibration samples, of which 4 validation
    # samples choose (enough: no cross-validation)
    assert all(r["cross_validated"] is None for r in result.recipes)
    # a graph larger than LARGE_GRAPH_NODES: a budget smaller in proportion (a count, no
    # clock), here 1 unit: minmax alone, and what did not fit said
    monkeypatch.setattr(recipes, "LARGE_GRAPH_NODES", 0.1)

    def never(ws):  # type: ignore[no-untyped-def]
        raise AssertionError("applies() ran although the budget was spent")

    monkeypatch.setattr(steps.STEPS["cle"], "applies", never)
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    assert [r["recipe"] for r in result.recipes] == ["minmax"]
    assert any(
        s.startswith("cle,minmax (would exceed the recipe budget: 1 of 1 units")
        for s in result.skipped
    )
    monkeypatch.setattr(recipes, "LARGE_GRAPH_NODES", 2000)
    # the budget in cost units (reproducible, no clock): 2 units try minmax and one change
    monkeypatch.setattr(recipes, "RECIPE_UNITS", 2.0)
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    assert [r["recipe"] for r in result.recipes] == ["minmax", names[1]]
    assert any(
        s.startswith("cle,") and "would exceed the recipe budget: 2 of 2 units" in s
        for s in result.skipped
    )


def test_no_temporary_file_is_named():
    import tempfile

    from opfuse.quantization.conductor import _no_temporary

    tmp = tempfile.gettempdir()
    text = (
        f"stored in {tmp}/ort.quant.ab12/x.data, but; {tmp}/.opfuse-quant-1/model.onnx: bad; "
        f"{tmp}/pytest-of-me/calib.npz stays"
    )
    assert _no_temporary(text, f"{tmp}/.opfuse-quant-1/model.onnx", "the model given") == (
        "stored in <a temporary file>, but; the model given: bad; "
        f"{tmp}/pytest-of-me/calib.npz stays"
    )


def test_figures_are_better_only_beyond_their_noise():
    from opfuse.quantization.accuracy import OutputAccuracy
    from opfuse.quantization.gate import Gate

    def fig(top1: float, sqnr: float, rows: int = 160) -> list[OutputAccuracy]:
        return [OutputAccuracy("y", sqnr, 1.0, 0.0, top1, 1.0, rows)]

    gate = Gate()
    # 4 rows of 160 near 95%: within the noise, a tie (the SQNR of an output that scores
    # classes does not decide)
    assert not gate.better(fig(0.969, 13.4), fig(0.944, 14.2))
    assert not gate.better(fig(0.944, 14.2), fig(0.969, 13.4))
    assert not gate.better(fig(0.95, 30.0), fig(0.95, 14.0))

    # an output that scores no classes: its SQNR decides
    def plain(sqnr: float) -> list[OutputAccuracy]:
        return [OutputAccuracy("map", sqnr, 1.0, 0.0)]

    assert gate.better(plain(8.0), plain(7.0)) and not gate.better(plain(7.0), plain(8.0))
    assert gate.better(fig(0.95, 14.0) + plain(8.0), fig(0.95, 30.0) + plain(7.0))
    # an SQNR floor given: every output is judged by its SQNR too
    assert Gate.parse("top1=99%,sqnr=25").better(fig(0.95, 30.0), fig(0.95, 14.0))
    # the same shares on 1600 rows: a difference
    assert gate.better(fig(0.969, 13.4, 1600), fig(0.944, 14.2, 1600))
    # fewer outputs missing the gate first, whatever else
    assert gate.better(fig(0.995, 5.0), fig(0.98, 30.0))
    # equal figures: not better (the cheaper recipe stays)
    assert not gate.better(fig(0.95, 14.0), fig(0.95, 14.0))
    assert not Gate.parse("off").better(fig(0.95, 14.0), fig(0.95, 14.05))


def test_keep_float_rule_and_logits_with_another_reader():
    """keep_float: a higher top-1, or the same with 1 dB more SQNR; float_logits declines a
    chain whose logits something else also reads (they are not the head's alone)."""
    import onnxruntime as ort

    from opfuse.quantization import heads

    assert heads.keep_float(0.96, 1.0, 30.0, 20.0)  # the top class decides first
    assert not heads.keep_float(1.0, 0.96, 20.0, 30.0)
    assert heads.keep_float(1.0, 1.0, 30.0, 31.0)  # equal: 1 dB more
    assert not heads.keep_float(1.0, 1.0, 30.0, 30.9)
    assert not heads.keep_float(None, 1.0, 30.0, 40.0)
    q = lambda i, o: h.make_node("QuantizeLinear", [i, "s", "z"], [o], name=f"q_{o}")  # noqa: E731
    dq = lambda i, o: h.make_node("DequantizeLinear", [i, "s", "z"], [o], name=f"dq_{o}")  # noqa: E731
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["z0"], name="logits"),
        q("z0", "zq"),
        dq("zq", "zd"),
        h.make_node("Softmax", ["zd"], ["p0"], name="softmax", axis=-1),
        q("p0", "pq"),
        dq("pq", "probs"),
    ]
    inits = [
        numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
        numpy_helper.from_array(np.array(0.01, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.uint8), "z"),
    ]
    out = [h.make_tensor_value_info("probs", T.FLOAT, [1, 4])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])], out, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    made = heads.float_logits(model, "probs")
    assert made is not None
    assert [n.op_type for n in made.graph.node] == ["MatMul", "Softmax"]
    assert made.graph.node[1].input[0] == "z0" and made.graph.node[1].output[0] == "probs"
    feeds = {"x": np.array([[0.1, 0.5, 0.2, 0.3]], np.float32)}
    got = ort.InferenceSession(made.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = np.exp(feeds["x"]) / np.exp(feeds["x"]).sum()
    np.testing.assert_allclose(got.run(None, feeds)[0], ref, rtol=1e-6)
    # through the logits' bias Add (its constant dequantized), a Shape reading the logits
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["m0"], name="logits"),
        q("m0", "mq"),
        dq("mq", "md"),
        dq("bias_q", "bd"),  # the quantizer stores a constant quantized
        h.make_node("Add", ["md", "bd"], ["z0"], name="bias_add"),
        q("z0", "zq"),
        dq("zq", "zd"),
        h.make_node("Shape", ["zd"], ["shape"], name="shape"),
        h.make_node("Softmax", ["zd"], ["p0"], name="softmax", axis=-1),
        q("p0", "pq"),
        dq("pq", "probs"),
    ]
    biased = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [*out, h.make_tensor_value_info("shape", T.INT64, [2])],
        [*inits, numpy_helper.from_array(np.full(4, 50, np.uint8), "bias_q")],
    )
    made = heads.float_logits(h.make_model(biased, opset_imports=[h.make_opsetid("", 17)]), "probs")
    assert made is not None
    assert [n.op_type for n in made.graph.node] == [
        "MatMul", "DequantizeLinear", "Add", "Shape", "Softmax"
    ]  # fmt: skip
    # the logits also read elsewhere: not the head's alone
    model.graph.node.append(h.make_node("Relu", ["z0"], ["other"], name="other"))
    model.graph.output.append(h.make_tensor_value_info("other", T.FLOAT, [1, 4]))
    assert heads.float_logits(model, "probs") is None


def test_recipes_are_cross_validated_on_two_disjoint_halves():
    """folds: the calibration samples (validation part included) in two alternate halves,
    each calibrating a model scored on the other; none below 4 samples."""
    from opfuse.quantization.recipes import folds
    from opfuse.quantization.workspace import Workspace

    model = gemm_bias_1xn()
    samples = feeds(10)
    calib, valid = samples[:8], samples[8:]  # 2 validation samples: cross-validated
    halves = folds(Workspace("m", model, model, calib, valid))
    assert halves is not None
    a, b = halves
    assert a.calib is b.valid and b.calib is a.valid
    assert len(a.calib) + len(b.calib) == 10
    assert not {id(s) for s in a.calib} & {id(s) for s in b.calib}
    assert len(a.valid_reference) == len(a.valid) and a.stats is not b.stats
    # 3 validation samples or more: they choose
    assert folds(Workspace("m", model, model, samples[:7], samples[7:])) is None
    same = feeds(3)
    assert folds(Workspace("m", model, model, same, same)) is None  # 3 samples
    four = feeds(4)  # not apart (fewer than 8): the same list is both parts
    halves = folds(Workspace("m", model, model, four, four))
    assert halves is not None and [len(w.calib) for w in halves] == [2, 2]


def test_a_small_calibration_set_is_cross_validated(tmp_path):
    """10 samples, 2 held back for evaluation: 8 calibration samples leave a validation
    part of 2, so the recipes are cross-validated over the 8."""
    path = tmp_path / "m.onnx"
    onnx.save(gemm_bias_1xn(), str(path))
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"] for f in feeds(10)]))
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    assert result.recipes and all(r["cross_validated"] == 8 for r in result.recipes)


def _gemm_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(
        np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32), "w"
    )
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
        [w],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _scaled_weight(model: onnx.ModelProto, factor: float) -> onnx.ModelProto:
    made = onnx.ModelProto()
    made.CopyFrom(model)
    w = numpy_helper.to_array(made.graph.initializer[0]) * np.float32(factor)
    made.graph.initializer[0].CopyFrom(numpy_helper.from_array(w.astype(np.float32), "w"))
    return made


@pytest.mark.parametrize(
    ("factor", "kept"), [(1.0 + 1e-7, True), (1.01, False)], ids=["exact", "inexact"]
)
def test_a_float_step_that_changes_the_outputs_is_dropped_and_said(factor, kept):
    """A float-graph step (cle, smoothquant) is checked against the fused float model
    before quantizing (``steps.float_check``): a change within the verifier's bound is
    applied, one beyond it (1% on a weight) is dropped, the reason said."""
    from opfuse.quantization.steps import FloatChange
    from opfuse.quantization.workspace import Workspace

    model = _gemm_model()
    rng = np.random.default_rng(4)
    samples = [{"x": rng.standard_normal((2, 6)).astype(np.float32)} for _ in range(6)]
    ws = Workspace("m", model, model, samples[:4], samples[4:])
    step = FloatChange("scale", lambda m, calib: (_scaled_weight(m, factor), 1), "weights scaled")
    assert step.applies(ws) is kept
    report = step.run(ws)
    assert report.dropped is not kept
    if kept:
        assert ws.float_model is not model and report.detail == "1 weights scaled"
    else:
        assert ws.float_model is model
        assert "beyond the verifier's bound" in step.reason(ws)


def test_statistics_are_keyed_by_what_they_depend_on_not_by_identity():
    """The statistics (and the calibration files) are keyed by names (issue 40): the
    scope, the float model's lineage (the float steps that made it), the samples' key;
    never by ``id()`` (a freed object could leave its id to a new one). A fork shares the
    statistics; a fold's half gets a scope of its own (statistics of its own, calibration
    files no other scope reads); a float step's model grows the lineage."""
    from opfuse.quantization.workspace import Statistics, Workspace

    model = _gemm_model()
    ws = Workspace("m", model, model, [], [], cache_dir=Path("/nowhere"))
    assert isinstance(ws.stats, Statistics) and not hasattr(ws, "key_of")
    fork = ws.fork()
    assert fork.stats is ws.stats and fork.model_key == ws.model_key == ("main", ())
    first = fork.calibration_cache()
    fork.use_samples([{"x": np.zeros((2, 6), np.float32)}], "all")
    assert fork.calibration_cache() != first  # other samples: another file
    assert ws.calibration_cache() == first  # the same names: the same file
    half = ws.fork()
    half.new_scope("fold0-")
    assert half.stats is not ws.stats and half.calibration_cache() != first
    changed = ws.fork()
    changed.replace_float_model(model, "cle")
    assert changed.lineage == ("cle",) and changed.model_key != ws.model_key
    assert changed.calibration_cache() != first and ws.lineage == ()


def test_the_speed_verdict_names_int4_for_the_int4_recipe():
    from opfuse.quantization.gate import Gate
    from opfuse.quantization.kernels import is_integer_op
    from opfuse.quantization.result import QuantizeResult
    from opfuse.runtime.cpu import CpuFeatures

    result = QuantizeResult(None, [], Gate(), 8, 4, "samples", recipe="int4")  # type: ignore[arg-type]
    result.speed, result.cpu = measured(20.0, 18.0, 8.0), CpuFeatures(frozenset({"avx2"}))
    assert result.speed_verdict().startswith("int4 pays on this machine")
    result.speed = measured(20.0, 18.0, 30.0)
    assert result.speed_verdict().startswith("int4 does not pay on this machine")
    assert is_integer_op("MatMulNBits")  # counted among the integer kernels
