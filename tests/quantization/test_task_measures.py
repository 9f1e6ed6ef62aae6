"""Accuracy as the task measures it (issue 41): NaN or infinite samples refused, a NaN in
an output failing the gate, a map recognized through float rounding."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from test_quantize import sensitive_mlp

from opfuse.errors import OpfuseError
from opfuse.quantization.accuracy import OutputAccuracy, compare_output, is_map
from opfuse.quantization.conductor import quantize_file
from opfuse.quantization.gate import Gate


def _data(path, values):  # type: ignore[no-untyped-def]
    np.savez(path, x=np.asarray(values, np.float32))
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["calibration", "eval"])
def test_nan_or_inf_samples_are_refused_naming_the_array_and_sample(tmp_path, bad, where):
    model = sensitive_mlp(tmp_path / "m.onnx")
    good = np.random.default_rng(0).uniform(0.5, 1.0, (12, 16))
    broken = good.copy()
    broken[5, 3] = bad
    calib = _data(tmp_path / "c.npz", broken if where == "calibration" else good)
    held = _data(tmp_path / "e.npz", broken if where == "eval" else good)
    out = tmp_path / "out.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "opfuse", "quantize", str(model), "-o", str(out),
         "--calibration", str(calib), "--eval", str(held), "--no-benchmark"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()
    what = "NaN" if np.isnan(bad) else "an infinity"
    assert f"--{where} {tmp_path}" in line and f"sample 5, array 'x' holds {what}" in line
    assert not out.exists()


def test_all_nan_eval_data_in_memory_is_refused(tmp_path):
    model = sensitive_mlp(tmp_path / "m.onnx")
    calib = {"x": np.random.default_rng(0).uniform(0.5, 1.0, (12, 16)).astype(np.float32)}
    held = {"x": np.full((4, 16), np.nan, np.float32)}
    with pytest.raises(OpfuseError, match="eval: sample 0, array 'x' holds NaN"):
        quantize_file(model, tmp_path / "o.onnx", calib, eval=held, benchmark=False)
    assert not (tmp_path / "o.onnx").exists()


def test_a_nan_in_an_output_fails_every_gate():
    ref = np.ones((2, 4), np.float32)
    got = np.array([[1, np.nan, 1, 1], [1, 1, 1, 1]], np.float32)
    figures = compare_output("y", ref, got)
    assert np.isnan(figures.sqnr_db)
    for gate in ("auto", "sqnr=5", "top1=60%"):
        assert Gate.parse(gate).misses([figures]) == ["y: NaN in the output"]
    assert Gate.parse("off").misses([figures]) == []
    fine = OutputAccuracy("y", 30.0, 1.0, 0.0)
    assert not Gate.parse("auto").misses([fine])


def test_a_map_a_hair_above_one_is_still_a_map():
    """A float Sigmoid's 1.0000001 (PP-OCRv4's detector on one photo) keeps the output a
    map, judged by its IoU, not by its SQNR; a value well above 1 is no probability."""
    probs = np.random.default_rng(1).uniform(0, 1, (1, 1, 8, 8)).astype(np.float32)
    probs[0, 0, 0, 0] = np.float32(1.0000001)
    assert probs.max() > 1.0 and is_map(probs)
    assert not is_map(probs * 1.5)
    assert not is_map(probs - 0.01)  # below 0 by more than rounding


def _ctc_scores(labels: list[list[int]], classes: int = 6) -> np.ndarray:
    """One-hot-ish [N, T, C] scores whose argmax per step is ``labels`` (0: the blank)."""
    out = np.full((len(labels), len(labels[0]), classes), 0.01, np.float32)
    for n, row in enumerate(labels):
        for t, c in enumerate(row):
            out[n, t, c] = 0.9
    return out


def test_a_ctc_output_is_judged_by_the_cer_of_its_decoded_text():
    """[N, T, C] scores where the blank is the argmax on most steps: greedy-decoded, the
    CER of the int8 text against the float text; a blank against a character at a label
    boundary changes no text (per-step top-1 drops, the CER does not)."""
    from opfuse.quantization.accuracy import ctc_decode, edit_distance

    assert ctc_decode(np.array([0, 3, 3, 0, 3, 0, 2, 2]), blank=0) == [3, 3, 2]
    assert edit_distance([1, 2, 3], [1, 3]) == 1 and edit_distance([], [4, 4]) == 2
    ref = _ctc_scores([[0, 3, 3, 0, 0, 2, 0, 0], [0, 0, 4, 0, 5, 0, 0, 0]])
    shifted = _ctc_scores([[0, 0, 3, 0, 0, 2, 2, 0], [0, 0, 4, 0, 5, 0, 0, 0]])
    figures = compare_output("text", ref, shifted)
    assert figures.top1 == 14 / 16 and figures.cer == 0.0 and figures.lines == 1.0
    misread = _ctc_scores([[0, 3, 3, 0, 0, 4, 0, 0], [0, 0, 4, 0, 0, 0, 0, 0]])
    worse = compare_output("text", ref, misread)
    assert worse.chars == 4 and worse.cer == 2 / 4 and worse.lines == 0.0
    gate = Gate.parse("auto")
    assert gate.misses([figures]) == []  # 87.5% per step, but the same text
    assert gate.misses([worse]) == ["text: CER 50.00% of the decoded text > 1.00%"]
    assert gate.better([figures], [worse]) and not gate.better([worse], [figures])
    assert "CER 0.00%" in figures.line() and "100.0% of the lines the same" in figures.line()
    # sqnr= alone judges it as before (per step and by SQNR); cer= sets the ceiling
    assert Gate.parse("sqnr=1").cer_ceiling() is None
    assert Gate.parse("cer=2%").misses([worse])
    assert Gate.parse("cer=2%").option() == "top1=99%,cer=2%"
    with pytest.raises(OpfuseError, match="turns the gate off in effect"):
        Gate.parse("cer=60%")


def test_a_classifier_per_step_is_not_ctc(tmp_path):
    """No class holds the steps a blank would (20 classes, none above 30%): per-step
    top-1 stays the measure; nor does a model that reads token ids spell text."""
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, (4, 10, 20)).astype(np.float32)
    figures = compare_output("steps", scores, scores + 0.01)
    assert figures.cer is None and figures.top1 is not None
    from opfuse.quantization.accuracy import text_outputs

    assert text_outputs(onnx.load(str(_ctc_model(tmp_path / "ctc.onnx")))) == {"probs"}
    tokens = onnx.load(str(_ctc_model(tmp_path / "ctc.onnx")))
    tokens.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    assert text_outputs(tokens) == set()


def test_a_missed_cer_is_loosened_to_the_figure_reached():
    ref = _ctc_scores([[0, 3, 3, 0, 0, 2, 0, 0], [0, 0, 4, 0, 5, 0, 0, 0]])
    misread = _ctc_scores([[0, 3, 3, 0, 0, 4, 0, 0], [0, 0, 4, 0, 5, 0, 0, 0]])
    figures = compare_output("text", ref, misread)
    assert figures.cer == 1 / 4
    assert Gate.parse("auto").loosened([figures]) == "top1=99%,cer=25%"


def _ctc_model(path):  # type: ignore[no-untyped-def]
    """x [N, 12, 8] -> MatMul [8, 6] + bias (the blank, class 0, ahead unless a feature
    fires) -> Softmax: a recognizer's head, built."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (8, 6)).astype(np.float32)
    w[:, 0] = 0.0
    bias = np.array([2.5, 0, 0, 0, 0, 0], np.float32)
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w"], ["m"], name="head"),
            h.make_node("Add", ["m", "b"], ["logits"], name="bias"),
            h.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        ],
        "ctc",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 12, 8])],
        [h.make_tensor_value_info("probs", T.FLOAT, ["N", 12, 6])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def test_quantize_judges_a_built_recognizer_by_its_decoded_text(tmp_path):
    model = _ctc_model(tmp_path / "ctc.onnx")
    rng = np.random.default_rng(4)
    x = (rng.uniform(0, 1, (24, 12, 8)) * (rng.uniform(0, 1, (24, 12, 1)) > 0.7)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x[:16])
    np.savez(tmp_path / "e.npz", x=x[16:])
    result = quantize_file(
        model, None, tmp_path / "c.npz", eval=tmp_path / "e.npz", benchmark=False, recipe="minmax"
    )
    [figures] = result.accuracy
    assert figures.cer is not None and figures.lines is not None and figures.chars > 0
    assert result.passed == (figures.cer <= 0.01)
    assert "CER <= 1% of the decoded text where an output is CTC-like" in result.gate.describe()
    assert result.to_json()["accuracy"][0]["cer"] == figures.cer
    assert any("decoded as CTC: CER" in line for line in result.lines())


def test_embeddings_are_pooled_over_the_mask_and_compared_by_cosine_and_neighbours():
    from opfuse.quantization.accuracy import compare_outputs, pooled

    hidden = np.zeros((1, 3, 2), np.float32)
    hidden[0, :2] = [[1, 0], [1, 0]]
    hidden[0, 2] = [0, 100]  # a padded step: the mask drops it
    assert np.allclose(pooled(hidden, np.array([[1, 1, 0]])), [[1, 0]])
    assert not np.allclose(pooled(hidden, None), [[1, 0]])
    rng = np.random.default_rng(5)
    ref = [[rng.normal(0, 1, (1, 4, 8)).astype(np.float32)] for _ in range(6)]
    noisy = [[r[0] + rng.normal(0, 0.005, r[0].shape).astype(np.float32)] for r in ref]
    masks = [np.ones((1, 4), np.int64) for _ in ref]
    [figures] = compare_outputs(["last_hidden_state"], ref, noisy, set(), (),
                                embeddings={"last_hidden_state"}, masks=masks)  # fmt: skip
    assert figures.embedding_cosine is not None and figures.embedding_cosine > 0.99
    assert figures.neighbours == 1.0 and figures.measure == "embedding_cosine"
    gate = Gate.parse("auto")
    assert gate.misses([figures]) == []  # its SQNR is not the measure
    far = [[r[0] + rng.normal(0, 1.0, r[0].shape).astype(np.float32)] for r in ref]
    [worse] = compare_outputs(["last_hidden_state"], ref, far, set(), (),
                              embeddings={"last_hidden_state"}, masks=masks)  # fmt: skip
    assert worse.embedding_cosine is not None and worse.embedding_cosine < 0.99
    assert gate.misses([worse])[0].startswith("last_hidden_state: embedding cosine 0.")
    assert gate.better([figures], [worse])
    assert Gate.parse("cos=0.5").misses([worse]) == []
    assert "cosine" in figures.line() and "nearest neighbour" in figures.line()


def _encoder(path):  # type: ignore[no-untyped-def]
    """input_ids, attention_mask [N, T] -> an embedding table -> MatMul -> Tanh: a
    sentence encoder's last_hidden_state [N, T, 16], built."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    rng = np.random.default_rng(6)
    table = rng.normal(0, 1, (50, 16)).astype(np.float32)
    w = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    graph = h.make_graph(
        [
            h.make_node("Gather", ["table", "input_ids"], ["e"], name="embed"),
            h.make_node("Cast", ["attention_mask"], ["mf"], name="cast", to=T.FLOAT),
            h.make_node("Unsqueeze", ["mf", "axis"], ["m3"], name="unsq"),
            h.make_node("Mul", ["e", "m3"], ["em"], name="masked"),
            h.make_node("MatMul", ["em", "w"], ["mm"], name="dense"),
            h.make_node("Tanh", ["mm"], ["last_hidden_state"], name="act"),
        ],
        "encoder",
        [
            h.make_tensor_value_info("input_ids", T.INT64, ["N", "T"]),
            h.make_tensor_value_info("attention_mask", T.INT64, ["N", "T"]),
        ],
        [h.make_tensor_value_info("last_hidden_state", T.FLOAT, ["N", "T", 16])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([2], np.int64), "axis"),
        ],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def test_quantize_judges_a_built_encoder_by_its_embeddings(tmp_path):
    model = _encoder(tmp_path / "enc.onnx")
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 50, (32, 10)).astype(np.int64)
    mask = np.ones((32, 10), np.int64)
    mask[:, 7:] = 0  # padding
    np.savez(tmp_path / "c.npz", input_ids=ids[:20], attention_mask=mask[:20])
    np.savez(tmp_path / "e.npz", input_ids=ids[20:], attention_mask=mask[20:])
    result = quantize_file(
        model, None, tmp_path / "c.npz", eval=tmp_path / "e.npz", benchmark=False, recipe="minmax"
    )
    [figures] = result.accuracy
    assert figures.embedding_cosine is not None and figures.neighbours is not None
    assert result.passed == (figures.embedding_cosine >= 0.99)
    assert result.to_json()["accuracy"][0]["measure"] == "embedding_cosine"
    assert "embedding cosine >= 0.99 (mean)" in result.gate.describe()


def test_labels_in_the_eval_data_judge_the_accuracy_drop(tmp_path):
    """An eval .npz with a ``labels`` array: the accuracy of both models against them, the
    drop gated (``drop=``, 1 point by default) instead of top-1 agreement."""
    from test_pipeline import many_classes

    import opfuse

    model = many_classes(tmp_path / "m.onnx", classes=8)
    rng = np.random.default_rng(8)
    x = rng.normal(0, 1, (40, 8)).astype(np.float32)
    labels = x.argmax(axis=1)
    labels[:5] = (labels[:5] + 1) % 8  # the float model is wrong on 5 of them
    np.savez(tmp_path / "c.npz", x=x[:24])
    np.savez(tmp_path / "e.npz", x=x[24:], labels=labels[24:])
    result = opfuse.quantize(model, calibration=tmp_path / "c.npz", eval=tmp_path / "e.npz",
                             benchmark=False, recipe="minmax")  # fmt: skip
    [figures] = result.accuracy
    assert figures.task_float == 1.0 and figures.task is not None  # the 16 held are right
    assert figures.measure == "drop" and "accuracy on the labels" in figures.line()
    assert result.passed == (figures.task_float - figures.task <= 0.01)
    np.savez(tmp_path / "bad.npz", x=x[24:], labels=labels[:3])
    with pytest.raises(OpfuseError, match="3 labels for 16 samples"):
        opfuse.quantize(model, calibration=tmp_path / "c.npz", eval=tmp_path / "bad.npz",
                        benchmark=False)  # fmt: skip


def test_the_users_metric_is_called_on_both_models_and_its_drop_gated(tmp_path):
    from test_pipeline import many_classes

    import opfuse

    model = many_classes(tmp_path / "m.onnx", classes=8)
    rng = np.random.default_rng(9)
    x = rng.normal(0, 1, (32, 8)).astype(np.float32)
    seen: list[int] = []

    def top_mass(outputs):  # type: ignore[no-untyped-def]
        seen.append(len(outputs))
        return float(np.mean([o["probs"].max() for o in outputs]))

    result = opfuse.quantize(model, calibration={"x": x[:24]}, eval={"x": x[24:]},
                             benchmark=False, recipe="minmax", metric=top_mass,
                             max_drop="drop=50%")  # fmt: skip
    assert seen[:2] == [8, 8]  # the float model's outputs, then the int8 model's
    task = next(a for a in result.accuracy if a.name == "task metric")
    assert task.task is not None and task.task_float is not None and result.passed
    refused = Gate.parse("drop=0.01").misses(
        [
            OutputAccuracy(
                "task metric",
                float("inf"),
                1.0,
                0.0,
                task=0.5,
                task_float=0.9,
                task_name="the metric given",
            )
        ]  # fmt: skip
    )
    assert refused == [
        "task metric: the metric given 0.5 against 0.9 in float, a drop of 0.4 > 0.01"
    ]
    with pytest.raises(OpfuseError, match="metric"):
        opfuse.quantize(model, calibration={"x": x}, metric="accuracy", benchmark=False)  # type: ignore[arg-type]


def test_eval_activations_far_outside_the_calibrated_ranges_are_named(tmp_path):
    """Calibrated on small inputs, evaluated on large ones: the warning names the tensors
    whose evaluation range reaches well beyond the calibrated one; alike data: none."""
    model = sensitive_mlp(tmp_path / "m.onnx")
    rng = np.random.default_rng(10)
    small = rng.uniform(0.5, 1.0, (16, 16)).astype(np.float32)
    large = rng.uniform(0.5, 1.0, (12, 16)).astype(np.float32) * 4
    np.savez(tmp_path / "c.npz", x=small)
    np.savez(tmp_path / "e.npz", x=large)
    np.savez(tmp_path / "same.npz", x=rng.uniform(0.5, 1.0, (12, 16)).astype(np.float32))
    options = {"benchmark": False, "max_drop": "off", "recipe": "minmax"}
    far = quantize_file(model, None, tmp_path / "c.npz", eval=tmp_path / "e.npz", **options)
    [said] = [w for w in far.warnings if "outside the calibrated ranges" in w]
    assert "does not represent these inputs" in said and " against [" in said
    alike = quantize_file(model, None, tmp_path / "c.npz", eval=tmp_path / "same.npz", **options)
    assert not any("outside the calibrated ranges" in w for w in alike.warnings)


def test_a_missed_gate_is_said_in_at_most_six_lines(tmp_path):
    """What was measured, the gate, the best reached and the command: no more than six
    lines besides the progress and the warnings (the whole report: --report)."""
    from test_quantize import mlp_samples

    model = sensitive_mlp(tmp_path / "m.onnx")
    data = mlp_samples(tmp_path / "x.npz")
    run = subprocess.run(
        [sys.executable, "-m", "opfuse", "quantize", str(model), "-o", str(tmp_path / "o.onnx"),
         "--calibration", str(data), "--max-drop", "sqnr=300", "--no-benchmark"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    said = [
        line
        for line in (run.stdout + run.stderr).splitlines()
        if not line.startswith(("opfuse: [", "warning:"))
    ]
    assert len(said) <= 6, said
    assert said[-1].startswith("opfuse: error: the int8 model misses --max-drop")
    assert "To write that best model anyway: opfuse quantize" in said[-1]
    assert any(line.startswith("gate: ") and "MISSED" in line for line in said)


def test_the_dynamic_recipe_quantizes_the_matmuls_at_run_time(tmp_path):
    """``dynamic``: the MatMuls with constant weights dynamic int8 (onnxruntime fuses each
    into a DynamicQuantizeMatMul), no Q/DQ left where there is no convolution; tried by
    ``--recipe auto`` where there is attention and two such MatMuls or more, not on a CNN."""
    import onnx
    from test_quantize import small_cnn

    from opfuse.quantization.steps import STEPS
    from opfuse.quantization.workspace import Workspace

    model = _two_layer_encoder(tmp_path / "enc.onnx")
    rng = np.random.default_rng(11)
    ids = rng.integers(1, 50, (32, 10)).astype(np.int64)
    mask = np.ones((32, 10), np.int64)
    np.savez(tmp_path / "c.npz", input_ids=ids[:20], attention_mask=mask[:20])
    np.savez(tmp_path / "e.npz", input_ids=ids[20:], attention_mask=mask[20:])
    options = {"eval": tmp_path / "e.npz", "benchmark": False, "max_drop": "off"}
    forced = quantize_file(model, None, tmp_path / "c.npz", recipe="dynamic", **options)
    ops = [n.op_type for n in forced.model.graph.node]
    assert ops.count("MatMulInteger") == 2 and "QuantizeLinear" not in ops
    assert forced.recipe == "minmax,dynamic"
    assert not any("nothing was quantized" in w for w in forced.warnings)
    from opfuse.model.sessions import open_session

    onnx.save(forced.model, str(tmp_path / "dyn.onnx"))  # onnxruntime fuses each MatMul
    open_session(tmp_path / "dyn.onnx", graph_opt="all", optimized_path=tmp_path / "ran.onnx")
    ran = [n.op_type for n in onnx.load(str(tmp_path / "ran.onnx")).graph.node]
    assert ran.count("DynamicQuantizeMatMul") == 2 and "MatMulInteger" not in ran
    [figures] = forced.accuracy
    assert figures.embedding_cosine is not None and figures.embedding_cosine > 0.99
    auto = quantize_file(model, None, tmp_path / "c.npz", **options)
    assert [r["recipe"] for r in auto.recipes][:2] == ["minmax", "minmax,dynamic"]
    cnn = onnx.load(str(small_cnn(tmp_path / "cnn.onnx")))
    ws = Workspace("cnn", cnn, cnn, [], [])
    assert not STEPS["dynamic"].applies(ws)  # one dense head: not tried


def _two_layer_encoder(path):  # type: ignore[no-untyped-def]
    """The built encoder with a self-attention between two dense layers."""
    import onnx
    from onnx import numpy_helper

    _encoder(path)
    model = onnx.load(str(path))
    rng = np.random.default_rng(12)
    w2 = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w2, "w2"))
    act = next(n for n in model.graph.node if n.name == "act")
    act.output[0] = "h1"
    make = onnx.helper.make_node
    model.graph.node.extend(
        [  # a self-attention (Q.K^T and P.V: MatMuls of two activations), then dense
            make("Transpose", ["h1"], ["h1t"], name="keys", perm=[0, 2, 1]),
            make("MatMul", ["h1", "h1t"], ["scores"], name="qk"),
            make("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
            make("MatMul", ["probs", "h1"], ["attended"], name="pv"),
            make("MatMul", ["attended", "w2"], ["mm2"], name="dense2"),
            make("Tanh", ["mm2"], ["last_hidden_state"], name="act2"),
        ]
    )
    onnx.save(model, str(path))
    return path
