"""The int8 benchmark's harness (bench/quant.py) without downloads: the accuracy figures
against hand-computed values, the text-line finder on a drawn page, a built CNN through
onnxruntime's pipeline and the report, the docs section replaced in place."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdq_models import calibration, cnn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import quant  # noqa: E402


def test_accuracy_figures_by_hand() -> None:
    ref = [np.array([[3.0, 4.0]])]
    got = [np.array([[3.0, 3.0]])]
    acc = quant.accuracy(ref, got, classes=True)
    assert acc["sqnr_db"] == pytest.approx(10 * np.log10(25 / 1))
    assert acc["cosine"] == pytest.approx(21 / (5 * np.sqrt(18)))
    assert acc["max_abs"] == 1.0
    assert acc["top1"] == 0.0  # float says class 1, int8 ties to class 0
    assert "top5" not in acc  # two classes: no top-5


def test_top5_and_the_common_class() -> None:
    # 4 steps of 6 classes: float picks 0 (blank) on 3 steps and 5 on one
    ref = np.zeros((1, 4, 6))
    ref[0, :3, 0] = 1.0
    ref[0, 3, 5] = 1.0
    got = ref.copy()
    got[0, 3] = [0.0, 0.9, 0.8, 0.7, 0.6, 0.5]  # int8's best is 1; 5 is its 5th best
    acc = quant.accuracy([ref], [got], classes=True)
    assert acc["top1"] == 0.75 and acc["top5"] == 1.0
    assert acc["top1_rare"] == 0.0 and acc["common_share"] == 0.75
    assert quant.top1_text(acc) == "75.0% (0.0% off the common class)"


def test_text_lines_of_a_drawn_page() -> None:
    from PIL import Image

    page = np.full((100, 200), 230, np.uint8)
    page[10:22, 5:190] = 20  # two lines of "ink", 12 rows each
    page[50:62, 5:150] = 20
    lines = quant.text_lines(Image.fromarray(page).convert("RGB"))
    assert [ln.size for ln in lines] == [(200, 18), (200, 18)]  # 3 rows of margin
    crops = quant.text_crops(lines, 48, 96, rotate=True)
    assert all(c.shape == (1, 3, 48, 96) for c in crops)
    assert min(c.min() for c in crops) >= -1.0 and max(c.max() for c in crops) <= 1.0


def test_rendered_lines_are_text_and_the_same_each_run() -> None:
    """The recognizer's second data set: dark words on a light line, the same pixels for
    the same seed (every tool and every run measures the same windows), other lines for
    another seed."""
    lines = quant.rendered_lines(3)
    again = quant.rendered_lines(3)
    assert len(lines) == 3
    for line, same in zip(lines, again, strict=True):
        pixels = np.asarray(line.convert("L"), np.float32)
        assert line.size[0] > 4 * line.size[1]  # a line of several words
        assert pixels.min() < 100 < 200 < np.median(pixels)  # ink on paper
        assert np.array_equal(pixels, np.asarray(same.convert("L"), np.float32))
    other = quant.rendered_lines(1, seed=8)[0]
    assert other.size != lines[0].size or not np.array_equal(
        np.asarray(other), np.asarray(lines[0])
    )
    windows = quant.text_crops(lines, 48, 320, False)
    assert windows and all(w.shape == (1, 3, 48, 320) for w in windows)


def test_a_built_cnn_through_onnxruntime_and_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # quant_pre_process may leave files in the cwd
    model = cnn()
    path = tmp_path / "cnn.onnx"
    onnx.save_model(model, str(path))
    samples = calibration(model, 8)
    case = quant.Case("cnn", path, samples[:4], samples[4:], True, "a built CNN")
    out = tmp_path / "int8.onnx"
    quant.ort_quantize(case, out, tmp_path)
    ref = quant.outputs(path, case.evaluation)
    acc = quant.accuracy(ref, quant.outputs(out, case.evaluation), True)
    assert acc["sqnr_db"] > 15 and acc["cosine"] > 0.97
    results = {
        "cpu": "AVX2; no VNNI, no AMX",
        "models": {
            "cnn": {
                "note": case.note,
                "float_nodes": 7,
                "tools": {
                    "onnxruntime": {"quantize_s": 1.0, "nodes": 20, "accuracy": acc},
                    "nncf": {"error": "RuntimeError: nncf is not installed"},
                },
                "latency": {"onnxruntime": {"noise": 0.01, "ratio": {"onnxruntime": 0.8}}},
            }
        },
    }
    section = quant.table(results, "python -m bench.quant --models cnn")
    assert section.startswith(quant.MARK_BEGIN) and section.rstrip().endswith(quant.MARK_END)
    assert "| cnn | onnxruntime |" in section and "0.80x (+-1%)" in section
    assert "| cnn | nncf | RuntimeError: nncf is not installed |" in section
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text("# Benchmarks\n\ntext\n")
    quant.write_docs(docs, section)
    quant.write_docs(docs, section.replace("0.80x", "0.70x"))  # replaced, not appended
    text = docs.read_text()
    assert text.count(quant.MARK_BEGIN) == 1 and "0.70x" in text and "0.80x" not in text
    assert text.startswith("# Benchmarks\n\ntext\n")


def test_unknown_model_or_tool_is_refused() -> None:
    with pytest.raises(SystemExit):
        quant.parse_args(["--models", "nosuch"])
    with pytest.raises(SystemExit):
        quant.parse_args(["--tools", "nosuch"])


def test_probability_map_iou_at_the_detectors_threshold() -> None:
    ref = np.array([[0.0, 0.5, 0.9, 0.2]])
    got = np.array([[0.4, 0.1, 0.8, 0.2]])  # above 0.3: ref {1, 2}, got {0, 2}
    acc = quant.accuracy([ref], [got], classes=False)
    assert acc["map_iou"] == pytest.approx(1 / 3)
    assert quant.top1_text(acc).startswith("map IoU 33.3% (regions ")
    assert "map_iou" not in quant.accuracy([ref * 3], [got * 3], classes=False)  # not a map


def test_text_regions_keep_what_paddleocrs_box_score_keeps() -> None:
    """Two regions above 0.3: one with a mean score of 0.9 (kept), one of 0.35 (dropped); a
    map clipped at 0.3002 (a range calibrated too narrow) passes map IoU, not regions."""
    ref = np.zeros((1, 1, 8, 8))
    ref[0, 0, 1:3, 1:3] = 0.9
    ref[0, 0, 5:7, 5:7] = 0.35
    kept = quant.text_regions(ref)
    assert kept[0, 0, 1:3, 1:3].all() and not kept[0, 0, 5:7, 5:7].any()
    assert kept.sum() == 4
    clipped = np.minimum(ref, 0.3002)
    acc = quant.accuracy([ref], [clipped], classes=False)
    assert acc["map_iou"] == pytest.approx(1.0)  # every pixel above 0.3 still is
    assert acc["region_iou"] == 0.0  # no region reaches a mean of 0.6
    same = quant.accuracy([ref], [ref], classes=False)
    assert same["region_iou"] == 1.0


# ------------------------------------------------------------ the models of other kinds


def test_samples_stack_on_a_new_axis_and_come_back() -> None:
    samples = [
        {"x": np.full((1, 3), i, np.float32), "h": np.zeros((2, 1), np.int32)} for i in range(4)
    ]
    arrays = quant.stack(samples)
    assert arrays["x"].shape == (4, 1, 3) and arrays["h"].shape == (4, 2, 1)
    back = quant.unstack(arrays)
    assert len(back) == 4 and all(
        np.array_equal(a["x"], b["x"]) for a, b in zip(back, samples, strict=True)
    )


def test_magika_features_as_magika_reads_a_file(tmp_path: Path) -> None:
    from bench import quant_data as qd

    small = tmp_path / "small.txt"
    small.write_bytes(b"  \n hello world \n\n")
    x = qd.magika_features(small)
    assert x is not None and x.shape == (1, 2048) and x.dtype == np.int32
    # the start: lstrip only, padded after; the end: rstrip only, padded before
    assert list(x[0, :14]) == list(b"hello world \n\n") and x[0, 14] == 256
    assert list(x[0, 2048 - 15 :]) == list(b"  \n hello world") and x[0, 2048 - 16] == 256
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 40)  # 10240 bytes: only the first and last 4096 read
    y = qd.magika_features(big)
    assert y is not None and list(y[0, :3]) == [0, 1, 2] and list(y[0, -2:]) == [254, 255]
    tiny = tmp_path / "tiny.txt"
    tiny.write_bytes(b"   ab   ")
    assert qd.magika_features(tiny) is None  # too few bytes: magika runs no model


def test_vad_windows_carry_64_samples_of_context() -> None:
    from bench import quant_data as qd

    audio = np.arange(512 * 3, dtype=np.float32)
    w = qd.vad_windows(audio)
    assert w.shape == (3, 576)
    assert np.all(w[0, :64] == 0) and w[0, 64] == 0.0 and w[0, -1] == 511
    assert w[1, 0] == 512 - 64 and w[1, -1] == 1023
    feed = qd.vad_feed(audio)
    assert feed["h"].shape == (1, 1, 128) and feed["c"].shape == (1, 1, 128)


def layout_outputs(boxes: list[tuple[int, int, int, float]]) -> list[np.ndarray]:
    """The layout model's 8 outputs with one confident cell per (level, cell, class, score);
    every side 2 bins (of 8) away from the cell's centre, in the level's stride."""
    from bench import quant_data as qd

    sizes = [
        int(np.ceil(qd.LAYOUT_SIZE[0] / s)) * int(np.ceil(qd.LAYOUT_SIZE[1] / s))
        for s in qd.STRIDES
    ]
    scores = [np.zeros((1, n, 10), np.float32) for n in sizes]
    dists = [np.full((1, n, 32), -20.0, np.float32) for n in sizes]
    for level, cell, cls, score in boxes:
        scores[level][0, cell, cls] = score
        dists[level][0, cell] = -20.0
        dists[level][0, cell].reshape(4, 8)[:, 2] = 20.0
    return scores + dists


def test_layout_boxes_and_their_agreement() -> None:
    from bench import quant_data as qd

    ref = layout_outputs([(0, 0, 0, 0.9), (1, 100, 4, 0.8)])
    boxes = qd.layout_boxes(ref)
    assert sorted(boxes[:, 0].tolist()) == [0, 4]
    first = boxes[boxes[:, 0] == 0][0]
    assert np.allclose(first[2:], [4 - 16, 4 - 16, 4 + 16, 4 + 16], atol=1e-3)  # stride 8
    assert qd.box_agreement([boxes], [boxes]) == 1.0
    moved = layout_outputs([(0, 0, 1, 0.9), (1, 100, 4, 0.8)])  # the first box's class changes
    assert qd.box_agreement([boxes], [qd.layout_boxes(moved)]) == 0.5
    weak = layout_outputs([(0, 0, 0, 0.3), (1, 100, 4, 0.8)])  # below 0.5: not a box
    assert len(qd.layout_boxes(weak)) == 1
    assert qd.box_agreement([np.zeros((0, 6))], [np.zeros((0, 6))]) == 1.0
    acc = quant.accuracy([ref], [moved], False, "boxes")
    assert acc["box_f1"] == 0.5 and acc["boxes"] == 2
    assert quant.top1_text(acc) == "box F1 50.0%"


def test_vad_agreement_by_hand() -> None:
    ref = [np.array([[0.9], [0.1], [0.6], [0.4]])]
    got = [np.array([[0.8], [0.2], [0.4], [0.4]])]
    acc = quant.accuracy(ref, got, False, "vad")
    assert acc["vad_agreement"] == 0.75 and acc["speech_share"] == 0.5
    assert quant.top1_text(acc) == "speech decision 75.0%"


def test_a_tool_in_its_own_process(tmp_path: Path) -> None:
    model = cnn()
    path = tmp_path / "cnn.onnx"
    onnx.save_model(model, str(path))
    samples = calibration(model, 6)
    case = quant.Case("cnn", path, samples[:4], samples[4:], True, "a built CNN")
    done = quant.quantize_in_child(case, "onnxruntime-movingavg", tmp_path / "int8.onnx")
    assert done.out is not None and done.error == "", done.error
    assert done.peak_mb > 0 and done.quantize_s is not None
    acc = quant.accuracy(
        quant.outputs(path, case.evaluation), quant.outputs(done.out, case.evaluation), True
    )
    assert acc["cosine"] > 0.97
    # the scale runs' cases may hold no held-back sample: the child still gets one to read
    case.evaluation = []
    again = quant.quantize_in_child(case, "onnxruntime", tmp_path / "again.onnx")
    assert again.out is not None, again.error
    failed = quant.quantize_in_child(case, "opfuse:no-such-recipe", tmp_path / "bad.onnx")
    assert failed.out is None and failed.error  # a failure is the cell's, with its reason


def test_openvino_form_rows_and_latency(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    model = cnn()
    path = tmp_path / "cnn.onnx"
    onnx.save_model(model, str(path))
    samples = calibration(model, 6)
    case = quant.Case("cnn", path, samples[:4], samples[4:], True, "a built CNN")
    int8 = tmp_path / "int8.onnx"
    quant.ort_quantize(case, int8, tmp_path)
    form = tmp_path / "int8.ov.onnx"
    quant.ov_form(int8, form)
    lat = quant.openvino_latency(case, {"onnxruntime": int8, "onnxruntime+ov": form}, 0.05)
    assert set(lat["ratio"]) == {"onnxruntime", "onnxruntime+ov"}
    assert set(lat["ratio_default"]) == set(lat["ratio"])
    assert lat["default_precision"] in ("f32", "bf16", "f16") and lat["rounds"] > 0


def test_the_report_with_ov_rows_and_the_scale_table() -> None:
    acc = {"sqnr_db": 20.0, "cosine": 0.99, "max_abs": 0.1, "top1": 1.0}
    results = {
        "cpu": "AVX2; no VNNI, no AMX",
        "models": {
            "m": {
                "note": "a model",
                "float_nodes": 7,
                "tools": {
                    "onnxruntime": {"wall_s": 3.0, "peak_mb": 120.0, "nodes": 20, "accuracy": acc},
                    "onnxruntime+ov": {"derived": True, "nodes": 12, "accuracy": acc},
                },
                "latency": {
                    "openvino": {
                        "float_ms": 2.0,
                        "noise": 0.02,
                        "default_precision": "bf16",
                        "default_ratio": 0.5,
                        "ratio": {"onnxruntime": 0.9, "onnxruntime+ov": 0.4},
                        "ratio_default": {"onnxruntime": 1.8, "onnxruntime+ov": 0.8},
                    }
                },
            }
        },
        "scale": {
            "m": {
                "onnxruntime": {
                    "10": {"wall_s": 2.0, "peak_mb": 100.0, "error": ""},
                    "200": {"wall_s": 9.0, "peak_mb": 300.0, "error": ""},
                },
                "nncf": {"10": {"error": "RuntimeError: nncf is not installed"}, "200": {}},
                "note": "m repeated",
            }
        },
    }
    section = quant.table(results, "python -m bench.quant")
    assert "| m | onnxruntime | 100.0% | 20.0 | - | 0.90x | 1.80x |" in section
    assert "| m | onnxruntime+ov | 100.0% | 20.0 | - | 0.40x | 0.80x |" in section
    assert "| 12 (7) | - | - |" in section  # a derived row has no quantize time of its own
    assert "OpenVINO's default precision here: bf16, the float model at it 0.50x" in section
    assert "| m | onnxruntime | 2.0 s, 100 MB | 9.0 s, 300 MB |" in section
    assert "| m | nncf | RuntimeError: nncf is not installed |" in section


def test_recipes_become_opfuse_columns() -> None:
    args = quant.parse_args(["--recipes", "mean-minmax,cle", "--tools", "onnxruntime"])
    assert args.tools == ["onnxruntime", "opfuse:mean-minmax", "opfuse:cle"]
    assert "opfuse:cle" in args.scale_tools
    with pytest.raises(SystemExit):
        quant.parse_args(["--scale-samples", "ten"])
    with pytest.raises(SystemExit):
        quant.parse_args(["--scale-models", "nosuch"])


def test_a_model_whose_inputs_need_a_missing_program_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import quant_data as qd

    monkeypatch.setattr(qd, "espeak_available", lambda: False)
    with pytest.raises(quant.MissingTool, match="espeak-ng"):
        quant.other_case("silero_vad", tmp_path, [], None)


def test_quant_regions_counts_near_ties_blank_flips_and_decoded_windows():
    """bench.quant_regions' figures on hand-made CTC scores: one window whose int8 twin
    moves a character one step (the decoded text the same), one that drops a space (the
    decoded text differs); the margins of the differing rows are the float model's."""
    from bench.quant_regions import decode, figures

    assert decode(np.array([0, 3, 3, 0, 3, 5, 5, 0]), blank=0) == [3, 3, 5]
    ref = np.zeros((2, 4, 6), np.float32)
    for k, steps in enumerate([[3, 3, 0, 0], [2, 0, 5, 0]]):
        ref[k, np.arange(4), steps] = 1.0
    ref[1, 2, 0] = 0.96  # step 2 of window 1: a near-tie (5: 1.0 against the blank 0.96)
    got = ref.copy()
    got[0, 1] = 0.0
    got[0, 1, 0] = 1.0  # window 0: 3 3 0 0 -> 3 0 0 0 (the same text)
    got[1, 2] = 0.0
    got[1, 2, 0] = 1.0  # window 1: the 5 is lost
    out = figures(ref, got, blank=0)
    assert out["rows"] == 8 and out["differ"] == 2 and out["top1"] == 0.75
    assert out["differ_margins"] == [0.04, 1.0]
    assert out["differ_margin_below_0.05"] == 1 and out["differ_margin_below_0.01"] == 0
    assert out["differ_blank_vs_class"] == 2
    assert out["windows_decoded_differ"] == 1 and out["windows"] == 2
    # no blank given: no CTC figures; the same model: nothing differs
    same = figures(ref, ref + 1e-3, blank=None)
    assert same["differ"] == 0 and "windows_decoded_differ" not in same


def test_quant_regions_figures_of_an_exact_model():
    """An int8 twin without error (no noise) gives an infinite SQNR, not a division by 0."""
    from bench.quant_regions import figures

    scores = np.random.default_rng(0).random((2, 5, 4)).astype(np.float32)
    out = figures(scores, scores.copy(), blank=0)
    assert out["top1"] == 1.0 and out["differ"] == 0 and out["sqnr_db"] == float("inf")


def test_gptq_rounds_a_conv_closer_to_its_float_output_than_round_to_nearest() -> None:
    """bench.quant_gptq: on the calibration samples, the first Conv's output with its
    weights rounded by GPTQ is closer to the float Conv's (on the same quantized input)
    than with the quantizer's own round-to-nearest; an exact im2col of a strided, padded,
    grouped Conv."""
    from bench import quant_gptq
    from bench.measure import session as open_session

    import opfuse

    model = cnn((8,), size=12, seed=3)
    samples = calibration(model, n=16, seed=4)
    qdq = opfuse.quantize(
        model, calibration=samples, max_drop="off", benchmark=False, recipe="minmax"
    ).model
    conv = next(n for n in qdq.graph.node if n.op_type == "Conv")
    rewritten = quant_gptq.gptq_convs(qdq, model, samples)

    def conv_output(m: onnx.ModelProto) -> tuple[np.ndarray, np.ndarray]:
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        del probe.graph.output[:]
        for name in (conv.input[0], conv.output[0]):
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, 1, None))
        session = open_session(probe.SerializeToString(), "all")
        got = [session.run(None, s) for s in samples]
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    x, rtn = conv_output(qdq)
    _, gptq = conv_output(rewritten)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    float_conv = next(n for n in model.graph.node if n.name == conv.name)
    w, b = weights[float_conv.input[1]], weights[float_conv.input[2]]
    cols = quant_gptq.im2col(x, w.shape[2:], {"pads": [1, 1, 1, 1]})
    want = (cols @ w.reshape(len(w), -1).T + b).reshape(len(x), 12, 12, -1).transpose(0, 3, 1, 2)
    assert np.sum((gptq - want) ** 2) < np.sum((rtn - want) ** 2)
    assert not np.array_equal(gptq, rtn)
    # im2col against onnxruntime's own Conv: stride 2, asymmetric pads, groups of 2
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    ws = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    attrs = {"strides": [2, 1], "pads": [1, 0, 0, 1], "group": 2}
    node = onnx.helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = onnx.helper.make_graph(
        [node], "g",
        [onnx.helper.make_tensor_value_info("x", 1, list(xs.shape))],
        [onnx.helper.make_tensor_value_info("y", 1, None)],
        [onnx.numpy_helper.from_array(ws, "w")],
    )  # fmt: skip
    conv_model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    ref = open_session(conv_model.SerializeToString(), "all").run(None, {"x": xs})[0]
    for g in range(2):
        cols = quant_gptq.im2col(xs[:, 2 * g : 2 * g + 2], (3, 2), attrs)
        mine = cols @ ws[3 * g : 3 * g + 3].reshape(3, -1).T
        expect = ref[:, 3 * g : 3 * g + 3].transpose(0, 2, 3, 1).reshape(-1, 3)
        np.testing.assert_allclose(mine, expect, rtol=1e-5, atol=1e-5)
