"""opfuse quantize on small built models: deterministic output with fixed calibration
data, the accuracy figures, the gate and the fallback that keeps a deliberately sensitive
layer in float, every bad-data case (exit 2, one line, nothing written), the image
preprocessing against a hand-computed array, and the speed logic on a fake runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.errors import GateError, OpfuseError
from opfuse.quantization import calibration
from opfuse.quantization.accuracy import compare_output, scoring_outputs
from opfuse.quantization.conductor import quantize_file
from opfuse.quantization.gate import Gate
from opfuse.quantization.preprocess import Preprocess
from opfuse.runtime.fake import FakeRuntime

RNG = np.random.default_rng(0)


def small_cnn(path: Path) -> Path:
    """Conv -> BatchNormalization -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm:
    10 classes from 1x3x8x8."""

    def t(name: str, *shape: int, low: float = -0.5, high: float = 0.5) -> onnx.TensorProto:
        return numpy_helper.from_array(RNG.uniform(low, high, shape).astype(np.float32), name)

    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["n1"], name="bn1"),
        h.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        h.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
        h.make_node("Flatten", ["p"], ["f"], name="flatten"),
        h.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    inits = [
        t("w1", 8, 3, 3, 3),
        t("g", 8, low=0.5, high=1.5),
        t("b", 8),
        t("m", 8),
        t("v", 8, low=0.5, high=1.5),
        t("w2", 16, 8, 3, 3),
        t("wf", 10, 16),
        t("bf", 10),
    ]
    graph = h.make_graph(
        nodes,
        "cnn",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["N", 10])],
        initializer=inits,
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def sensitive_mlp(path: Path) -> Path:
    """x (1x16) -> Gemm "normal" -> Relu -> Gemm "sensitive": each output channel of the
    sensitive layer has one huge weight on a feature that is always 0 and small weights
    elsewhere; per-channel int8 rounds the small ones to 0, so that layer alone ruins the
    output (regression output: no classes)."""
    w1 = RNG.uniform(0.5, 1.0, (16, 16)).astype(np.float32)
    w1[0] = 0.0  # feature 0 of the hidden layer is always 0
    w2 = np.full((4, 16), 0.01, np.float32)
    w2[:, 0] = 1000.0
    nodes = [
        h.make_node("Gemm", ["x", "w1"], ["a"], name="normal", transB=1),
        h.make_node("Relu", ["a"], ["r"], name="relu"),
        h.make_node("Sub", ["r", "shift"], ["s"], name="shift"),  # feature 0 -> ~0
        h.make_node("Gemm", ["s", "w2"], ["y"], name="sensitive", transB=1),
    ]
    shift = np.zeros(16, np.float32)
    graph = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(shift, "shift"),
        ],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def samples_npz(path: Path, name: str, shape: tuple[int, ...], n: int = 16, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, **{name: rng.uniform(0, 1, (n, *shape[1:])).astype(np.float32)})
    return path


def mlp_samples(path: Path) -> Path:
    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 1.0, (16, 16)).astype(np.float32)
    np.savez(path, x=x)
    return path


def test_a_small_cnn_is_fused_quantized_and_deterministic(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    data = samples_npz(tmp_path / "calib.npz", "x", (1, 3, 8, 8))
    outs = []
    for k in range(2):
        out = tmp_path / f"int8_{k}.onnx"
        result = quantize_file(model, out, data, benchmark=False)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]  # fixed calibration data: the same bytes
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "int8_0.onnx")).graph.node)
    assert ops["BatchNormalization"] == 0  # fused before quantizing
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    # 16 samples: 4 held back for the figures, 3 of the other 12 for choosing the recipe
    assert result.calibration_samples == 12 and result.eval_samples == 4
    assert result.validation_samples == 3 and result.validation_apart
    [acc] = result.accuracy
    assert acc.top1 is not None and acc.top1 >= 0.99 and acc.sqnr_db > 20
    assert result.kept_float == []
    assert result.coverage is not None and result.coverage.integer_fraction > 0.9
    assert result.to_json()["integer_kernels"]["integer_ops"]


def test_the_gate_keeps_the_sensitive_layer_in_float(tmp_path):
    model = sensitive_mlp(tmp_path / "mlp.onnx")
    data = mlp_samples(tmp_path / "x.npz")
    result = quantize_file(
        model, tmp_path / "out.onnx", data, max_drop="sqnr=25", benchmark=False, recipe="minmax"
    )
    assert [k.node for k in result.kept_float] == ["sensitive"]
    assert min(a.sqnr_db for a in result.accuracy) >= 25
    assert result.error_growth == []  # traced only when the gate is still missed
    assert any(line.startswith("before the fallback (recipe ") for line in result.lines())
    graph = onnx.load(str(tmp_path / "out.onnx")).graph
    sensitive = next(n for n in graph.node if n.name == "sensitive")
    producers = {o: n.op_type for n in graph.node for o in n.output}
    assert producers.get(sensitive.input[1]) != "DequantizeLinear"  # float weights


def test_the_fallback_keeps_only_layers_that_help(tmp_path, monkeypatch):
    """The layer whose rounding is worst ("a") makes the whole model worse when kept in
    float (as on PP-OCR's recognizer): it is tried and dropped, "b" is kept and the gate
    holds; a gate nothing meets stops at the candidates' end with the best reached."""
    in_float_sqnr = {(): 20.0, ("a",): 15.0, ("b",): 26.0, ("a", "b"): 22.0, ("b", "c"): 25.0}
    ranked = (("a", 5.0), ("b", 10.0), ("c", 30.0))
    fb, ws, first = _fake_fallback(monkeypatch, in_float_sqnr, ranked)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert [k.node for k in found.kept] == ["b"] and found.accuracy[0].sqnr_db == 26.0
    assert found.tries == 2 and "gate holds" in found.stopped
    assert [line.split(":")[0] for line in ws.lines] == ["fallback try 1", "fallback try 2"]
    assert "no help" in ws.lines[0] and "kept" in ws.lines[1]
    nothing = fb.fallback(ws, Gate.parse("sqnr=40"), lambda names: names, [], first)
    assert [k.node for k in nothing.kept] == ["b"] and nothing.tries == 3
    assert nothing.stopped == "no candidate left"
    # the time budget stops it: no try after it is spent
    late = fb.fallback(ws, Gate.parse("sqnr=40"), lambda names: names, [], first, tries=0)
    assert late.tries == 0 and "budget" in late.stopped


def _fake_fallback(
    monkeypatch,
    sqnr_in_float,
    ranked=(("a", 5.0), ("b", 10.0), ("c", 12.0), ("d", 30.0)),
    leading=None,
):
    """A fallback on the layers of ``ranked`` (name, the SQNR that ranks it: by default
    "a".."d" ranked a, b, c, d, worst first), whose validation SQNR with the layers kept in
    float is ``sqnr_in_float`` (sorted names -> dB; 20 dB with none); ``leading``: the
    node names of each share of the leading layers (none by default)."""
    from opfuse.quantization import fallback as fb
    from opfuse.quantization.accuracy import OutputAccuracy
    from opfuse.quantization.sensitivity import Candidate

    monkeypatch.setattr(fb.flow, "weighted_nodes", lambda model: [n for n, _ in ranked])
    monkeypatch.setattr(
        fb,
        "leading_nodes",
        lambda model, feed, shares: [list((leading or {}).get(s, [])) for s in shares],
    )
    monkeypatch.setattr(fb, "activation_candidates", lambda f, q, s: [])
    monkeypatch.setattr(
        fb,
        "weight_candidates",
        lambda m, layers, s, pc: [Candidate(n, (n,), db, "weight rounding") for n, db in ranked],
    )

    class FakeWorkspace:
        exclude: list[str] = []
        float_model = None
        calib: list[dict[str, np.ndarray]] = [{}]
        per_channel = True

        def __init__(self):
            self.lines: list[str] = []

        def score(self, model):
            return [OutputAccuracy("y", sqnr_in_float[tuple(sorted(model))], 1.0, 0.0)]

        def say(self, text):
            self.lines.append(text)

    return fb, FakeWorkspace(), [OutputAccuracy("y", 20.0, 1.0, 0.0)]


def test_the_fallback_stops_when_its_worst_parts_at_once_do_not_help(monkeypatch):
    """Where the error is spread (PP-OCR's recognizer), the worst candidates in float all
    at once score no better: one try, no part kept, and why it stopped."""
    fb, ws, first = _fake_fallback(monkeypatch, {("a", "b", "c"): 19.0})
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert found.tries == 1 and found.kept == [] and found.accuracy is first
    assert "at once scoring no better" in found.stopped and "spread" in found.stopped
    assert "the 3 most sensitive parts in float at once" in ws.lines[0]
    assert "no help: stopped" in ws.lines[0] and len(ws.lines) == 1


# the leading layers of the fake: every share but the whole model ("a" is not leading)
LEADING = {0.25: ["d"], 0.5: ["c", "d"], 0.75: ["b", "c", "d"], 0.9: ["b", "c", "d"]}
SPREAD = {("a", "b", "c"): 19.0}  # the worst parts at once do not help


def test_the_fallback_keeps_the_least_leading_share_that_holds_the_gate(monkeypatch):
    """The error spread: the leading layers in float, the largest share first, smaller ones
    while the gate holds; the least that holds is kept (less in float: more speed)."""
    sqnr = {**SPREAD, ("b", "c", "d"): 26.0, ("c", "d"): 25.5, ("d",): 21.0}
    fb, ws, first = _fake_fallback(monkeypatch, sqnr, leading=LEADING)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    [part] = found.kept
    assert part.node == "the leading 50% of the multiply-adds (2 layers)" and part.how == fb.LEADING
    assert found.exclude == ["c", "d"] and found.model == ["c", "d"]
    assert found.accuracy[0].sqnr_db == 25.5 and found.tries == 4  # the group, 75%, 50%, 25%
    assert (
        "the smallest share tried that holds the gate (on validation; the next smaller share "
        "misses it)" in found.stopped
    )
    tries = [line for line in ws.lines if "leading" in line]
    assert [t.split(": ")[1] for t in tries] == [
        "the leading 75% of the multiply-adds (3 layers) in float",
        "the leading 50% of the multiply-adds (2 layers) in float",
        "the leading 25% of the multiply-adds (1 layers) in float",
    ]  # 90% takes the same layers as 75%: one try
    assert part.describe() == part.node  # no SQNR ranked it


def test_the_leading_layers_are_kept_only_when_they_score_better_than_none(monkeypatch):
    fb, ws, first = _fake_fallback(monkeypatch, {**SPREAD, ("b", "c", "d"): 20.05}, leading=LEADING)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert found.kept == [] and found.accuracy is first and found.tries == 2
    # missing the gate but better than none: kept, and said so
    fb, ws, first = _fake_fallback(monkeypatch, {**SPREAD, ("b", "c", "d"): 23.0}, leading=LEADING)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert found.exclude == ["b", "c", "d"] and found.accuracy[0].sqnr_db == 23.0
    assert "misses the gate (on validation) but scores better than none" in found.stopped
    # no leading share short of the whole model: nothing tried
    fb, ws, first = _fake_fallback(monkeypatch, SPREAD, leading={0.25: ["a", "b", "c", "d"]})
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert found.kept == [] and found.tries == 1


def test_the_leading_layers_within_the_seconds_left(monkeypatch):
    """No second left: no share tried (the largest would be scored first otherwise); the
    fallback's own budget spent on its tries leaves none for the leading layers either."""
    sqnr = {**SPREAD, ("b", "c", "d"): 26.0, ("c", "d"): 25.5, ("d",): 21.0}
    fb, ws, first = _fake_fallback(monkeypatch, sqnr, leading=LEADING)
    found = fb._leading(ws, Gate.parse("sqnr=25"), lambda n: n, fb.FallbackResult([], first),
                        ["a", "b", "c", "d"], tries=0)  # fmt: skip
    assert found.kept == [] and found.tries == 0 and ws.lines == []
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda n: n, [], first, tries=0)
    assert found.kept == [] and not any("leading" in line for line in ws.lines)


def test_the_leading_layers_when_the_cross_validation_cannot_score(monkeypatch):
    """The cross-validated figures missing for the largest share: scored on the validation
    part instead; missing for a smaller share: the search stops there, said, and the
    smallest share that held so far is kept."""
    from opfuse.quantization.accuracy import OutputAccuracy

    sqnr = {**SPREAD, ("b", "c", "d"): 26.0, ("c", "d"): 25.5, ("d",): 25.2}
    fb, ws, first = _fake_fallback(monkeypatch, sqnr, leading=LEADING)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda n: n, [], first, cross=lambda n: None)
    assert found.exclude == ["d"] and "(on validation;" in found.stopped

    def midway(names):
        return None if len(names) < 3 else [OutputAccuracy("y", 27.0, 1.0, 0.0)]

    fb, ws, first = _fake_fallback(monkeypatch, sqnr, leading=LEADING)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda n: n, [], first, cross=midway)
    assert found.exclude == ["b", "c", "d"]
    assert "the leading 50% of the multiply-adds (2 layers) could not be scored" in found.stopped
    assert any("could not be scored" in line for line in ws.lines)


def test_the_leading_layers_are_judged_cross_validated_when_it_can(monkeypatch):
    """Scored by the cross-validated figures (every calibration sample), not the validation
    part's: here the validation part would keep none, the cross-validated figures 50%."""
    from opfuse.quantization.accuracy import OutputAccuracy

    valid = {**SPREAD, ("b", "c", "d"): 20.0, ("c", "d"): 20.0, ("d",): 20.0}
    cross = {(): 18.0, ("b", "c", "d"): 27.0, ("c", "d"): 26.0, ("d",): 22.0}
    fb, ws, first = _fake_fallback(monkeypatch, valid, leading=LEADING)

    def scorer(names):
        return [OutputAccuracy("y", cross[tuple(sorted(names))], 1.0, 0.0)]

    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first, cross=scorer)
    assert found.exclude == ["c", "d"]
    assert found.accuracy[0].sqnr_db == 20.0  # the validation figures of the model kept
    assert "(cross-validated over the calibration samples" in found.stopped
    assert all("cross-validated" in line for line in ws.lines if "leading" in line)


def test_the_fallback_goes_one_at_a_time_when_its_worst_parts_at_once_help(monkeypatch):
    """The group helps: the parts are then tried one at a time and the fewest that pass
    are kept ("b" alone, not the group: each part in float costs speed)."""
    sqnr = {("a", "b", "c"): 27.0, ("a",): 15.0, ("b",): 26.0}
    fb, ws, first = _fake_fallback(monkeypatch, sqnr)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert [k.node for k in found.kept] == ["b"] and found.accuracy[0].sqnr_db == 26.0
    assert found.tries == 3 and "gate holds" in found.stopped
    assert "better: one at a time next" in ws.lines[0]


def test_the_fallback_keeps_the_group_when_one_at_a_time_finds_less(monkeypatch):
    """No part helps alone, the group did: the group is kept (measured better), said."""
    sqnr = {("a", "b", "c"): 24.0, ("a",): 15.0, ("b",): 19.0, ("c",): 18.0, ("d",): 20.0}
    fb, ws, first = _fake_fallback(monkeypatch, sqnr)
    found = fb.fallback(ws, Gate.parse("sqnr=25"), lambda names: names, [], first)
    assert [k.node for k in found.kept] == ["a", "b", "c"] and found.accuracy[0].sqnr_db == 24.0
    assert found.exclude == ["a", "b", "c"] and found.tries == 5
    assert found.stopped == "no candidate left; the 3 parts tried at once scored best: kept"


def test_a_gate_no_mix_meets_writes_nothing_and_exits_1(tmp_path):
    model = sensitive_mlp(tmp_path / "mlp.onnx")
    data = mlp_samples(tmp_path / "x.npz")
    out = tmp_path / "out.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "opfuse", "quantize", str(model), "-o", str(out),
         "--calibration", str(data), "--max-drop", "sqnr=300", "--no-benchmark", "--recipe", "minmax",
         "--report", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    [error] = [line for line in run.stderr.splitlines() if line.startswith("opfuse: error:")]
    assert "misses --max-drop" in error and "the error grows most at y (Gemm, " in error
    # the first and the best figures, and the command that writes that best model
    assert "recipe minmax reached top-1 100.0%, SQNR 0.0 dB" in error
    assert (
        "the best after the fallback" in error and "(keeping 1 part in float (sensitive)" in error
    )
    command = error.split("To write that best model anyway: ")[1]
    assert "--max-drop off" in command and "--exclude sensitive" in command
    # a progress line per try on stderr, the report written on exit 1 too
    assert "fallback try 1: sensitive in float" in run.stderr
    assert not out.exists()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is False and report["command"] == command
    # the command writes that model
    again = subprocess.run(
        [sys.executable, "-m", "opfuse", *command.split()[1:], "--no-benchmark"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert out.exists()


def write_png(path: Path, pixels: np.ndarray) -> Path:
    from PIL import Image

    Image.fromarray(pixels.astype(np.uint8), "RGB").save(path)
    return path


def test_image_preprocessing_matches_the_hand_computed_array(tmp_path):
    pixels = np.array([[[255, 0, 10], [20, 30, 40]], [[50, 60, 70], [80, 90, 100]]], np.uint8)
    png = write_png(tmp_path / "a.png", pixels)
    pre = Preprocess.parse(
        "size=2,layout=NCHW,order=BGR,scale=1/255,mean=0.5:0.4:0.3,std=0.2:0.25:0.5"
    )
    got = pre.image(png)
    bgr = pixels[..., ::-1].astype(np.float32) / 255.0
    want = (bgr - np.array([0.5, 0.4, 0.3], np.float32)) / np.array([0.2, 0.25, 0.5], np.float32)
    np.testing.assert_allclose(got, want.transpose(2, 0, 1)[None], rtol=1e-6)
    assert Preprocess.parse("layout=nhwc,size=2").image(png).shape == (1, 2, 2, 3)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: np.savez(d / "c.npz", y=np.zeros((4, 3, 8, 8), np.float32)), "do not match"),
        (lambda d: np.savez(d / "c.npz", x=np.zeros((4, 3, 9, 8), np.float32)), "fixes dim 2"),
        (lambda d: np.savez(d / "c.npz", x=np.zeros((4, 3, 8, 8), np.float64)), "is float64"),
        (lambda d: np.savez(d / "c.npz", x=np.zeros((1, 3, 8, 8), np.float32)), "at least 2"),
        (lambda d: (d / "c.npz").write_bytes(b"PK\x03\x04 truncated"), "not a readable .npz"),
    ],
)
def test_bad_calibration_files(tmp_path, make, message):
    model = small_cnn(tmp_path / "cnn.onnx")
    make(tmp_path)
    out = tmp_path / "out.onnx"
    with pytest.raises(OpfuseError, match=message) as info:
        quantize_file(model, out, tmp_path / "c.npz", benchmark=False)
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    assert not out.exists()


def test_bad_calibration_folders_on_the_command_line(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    empty = tmp_path / "empty"
    empty.mkdir()
    images = tmp_path / "images"
    images.mkdir()
    write_png(images / "good.png", np.zeros((8, 8, 3)))
    (images / "bad.png").write_bytes(b"not an image")
    four = tmp_path / "four.npz"
    np.savez(four, x=RNG.standard_normal((4, 3, 8, 8)).astype(np.float32))
    cases = [
        ([str(empty)], "no .npz files or images"),
        ([str(images), "--preprocess", "size=8"], "bad.png: not a readable image"),
        ([str(images)], "images need --preprocess"),
        ([str(tmp_path / "missing.npz")], "no such file"),
        ([str(images), "--preprocess", "size=8", "--samples", "0"], "--samples 0: a count"),
        ([str(four), "--samples", "5"], "4 samples, --samples asks for 5"),
    ]
    for args, message in cases:
        run = subprocess.run(
            [sys.executable, "-m", "opfuse", "quantize", str(model), "-o",
             str(tmp_path / "out.onnx"), "--no-benchmark", "--calibration", *args],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 2 and message in run.stderr, (args, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out.onnx").exists()


def test_a_folder_of_images_calibrates(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    images = tmp_path / "images"
    images.mkdir()
    for i in range(8):
        write_png(images / f"{i}.png", RNG.integers(0, 255, (12, 12, 3)))
    result = quantize_file(
        model,
        tmp_path / "out.onnx",
        images,
        preprocess=Preprocess.parse("size=8"),
        benchmark=False,
        max_drop="off",  # 2 held-back samples of a random network: the reading is tested
    )
    assert result.calibration_samples == 6 and result.eval_samples == 2
    assert not result.validation_apart  # 6: too few to hold 2 apart
    fewer = quantize_file(
        model,
        tmp_path / "out4.onnx",
        images,
        samples=4,
        preprocess=Preprocess.parse("size=8"),
        benchmark=False,
        max_drop="off",
    )
    assert fewer.calibration_samples == 3 and fewer.eval_samples == 1  # the first 4, split
    assert not fewer.validation_apart  # too few to hold a validation part: said


def test_the_speed_logic_on_a_fake_runtime(tmp_path):
    """QuantizeLinear made expensive: int8 is slower, said plainly, and --min-speedup
    turns it into exit 1 with no model written, the report written (its figures)."""
    model = small_cnn(tmp_path / "cnn.onnx")
    data = samples_npz(tmp_path / "calib.npz", "x", (1, 3, 8, 8))
    slow_q = FakeRuntime({"QuantizeLinear": 0.01, "DequantizeLinear": 0.01}, default=0.001)
    result = quantize_file(model, tmp_path / "out.onnx", data, runtime=slow_q, write_slower=True)
    assert result.pays() is False and result.speedup is not None and result.speedup < 1
    assert any("int8 does not pay on this machine" in line for line in result.lines())
    report = tmp_path / "r.json"
    said = r"below --min-speedup 1.5: no model written; the report is \(the same command without"
    with pytest.raises(GateError, match=said):
        quantize_file(
            model,
            tmp_path / "o2.onnx",
            data,
            runtime=slow_q,
            min_speedup=1.5,
            report=report,
            write_slower=True,
        )
    assert not (tmp_path / "o2.onnx").exists()
    assert json.loads(report.read_text())["speed"]["runtime"]
    fast_q = FakeRuntime({"Conv": 0.01, "BatchNormalization": 0.01}, default=0.0)
    result = quantize_file(model, tmp_path / "o3.onnx", data, runtime=fast_q, write_slower=True)
    assert result.speed is not None and result.to_json()["speed"] is not None


def test_random_calibration_warns_loudly(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    result = quantize_file(model, tmp_path / "out.onnx", "random", benchmark=False)
    assert any("RANDOM" in w for w in result.warnings)
    report = tmp_path / "r.json"
    quantize_file(model, tmp_path / "o2.onnx", "random", benchmark=False, report=report)
    assert "RANDOM" in json.loads(report.read_text())["warnings"][0]


def test_accuracy_figures():
    ref = np.array([[1.0, 3.0, 2.0], [5.0, 1.0, 0.0]], np.float32)
    same = compare_output("y", ref, ref)
    assert same.sqnr_db == float("inf") and same.top1 == 1.0 and same.cosine == pytest.approx(1)
    swapped = compare_output("y", ref, np.array([[3.0, 1.0, 2.0], [5.0, 1.0, 0.0]], np.float32))
    assert swapped.top1 == 0.5 and swapped.top5 == 1.0 and swapped.max_abs == 2.0


def test_which_outputs_score_classes():
    """Top-1 agreement is judged where a classifier head makes the output (through
    data-moving ops), not on any 2-D or 3-D float output: a state or a pooled feature
    of the same shape is judged by its SQNR."""
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    b = numpy_helper.from_array(np.ones(4, np.float32), "b")
    shape = numpy_helper.from_array(np.array([1, 4], np.int64), "shape")
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["mm"]),
        h.make_node("Softmax", ["mm"], ["sm"]),
        h.make_node("Reshape", ["sm", "shape"], ["probs"]),
        h.make_node("MatMul", ["x", "w"], ["mm2"]),
        h.make_node("Add", ["mm2", "b"], ["logits"]),
        h.make_node("Tanh", ["mm"], ["state"]),
        h.make_node("Add", ["state", "b"], ["state_plus"]),
        h.make_node("ReduceMean", ["x"], ["pooled"], axes=[0], keepdims=1),
    ]
    out = [
        h.make_tensor_value_info(n, T.FLOAT, None)
        for n in ("probs", "logits", "state", "state_plus", "pooled")
    ]
    graph = h.make_graph(
        nodes, "heads", [h.make_tensor_value_info("x", T.FLOAT, [1, 8])], out, [w, b, shape]
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert scoring_outputs(model) == {"probs", "logits"}
    ref = np.array([[1.0, 3.0, 2.0]], np.float32)
    assert compare_output("state", ref, ref, scores=False).top1 is None
    assert compare_output("probs", ref, ref, scores=True).top1 == 1.0


def test_gate_keys_are_floors():
    """top1=99% and sqnr=25 are both floors; a floor that turns the gate off in effect is
    refused (top1=1% meant a drop of one point before: now it is refused, not a 1% floor)."""
    assert Gate.parse("top1=97%").top1 == pytest.approx(0.97)
    assert Gate.parse("top1=0.97").top1 == pytest.approx(0.97)
    assert Gate.parse("sqnr=25").sqnr_db == 25 and Gate.parse("sqnr=25").top1 is None
    both = Gate.parse("top1=99%,sqnr=30")
    probs = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], np.float32)
    flipped = probs.copy()
    flipped[0] = [0.9, 0.1]  # 3 of 4 rows agree: 75%
    figures = [compare_output("p", probs, flipped)]
    assert Gate.parse("top1=75%").misses(figures) == []  # agreement >= 75% passes
    assert Gate.parse("top1=76%").misses(figures) == ["p: top-1 agreement 75.0% < 76.0%"]
    assert any("SQNR" in m for m in both.misses(figures))
    assert Gate.parse("auto").misses([compare_output("p", probs, probs)]) == []
    assert Gate.parse("off").misses([compare_output("y", np.ones(3), -np.ones(3))]) == []
    for text, message in [
        ("top1=1%", "turns the gate off in effect"),
        ("top1=49%", "turns the gate off in effect"),
        ("sqnr=0", "turns the gate off in effect"),
        ("sqnr=-3", "turns the gate off in effect"),
        ("top1=150%", "between 0 and 100%"),
        ("accuracy=3", "floors: top1=99%"),
        (",", "floors"),
    ]:
        with pytest.raises(OpfuseError, match=message):
            Gate.parse(text)
    assert Gate.parse("top1=50%").option() == "top1=50%"


def test_a_bad_leading_share_is_refused_before_any_work(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    data = tmp_path / "x.npz"
    np.savez(data, x=RNG.standard_normal((4, 3, 8, 8)).astype(np.float32))
    run = subprocess.run(
        [sys.executable, "-m", "opfuse", "quantize", str(model), "-o", str(tmp_path / "o.onnx"),
         "--calibration", str(data), "--no-benchmark", "--exclude", "leading=150%"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "opfuse: error: --exclude 'leading=150%': leading=SHARE takes a share of the "
        "multiply-adds above 0 and below 1, as a percentage (leading=25%) or a fraction "
        "(leading=0.25)"
    ]  # no "fusing": refused before any work
    assert not (tmp_path / "o.onnx").exists()


def test_calibration_split_holds_back_every_fourth():
    samples = [{"x": np.full(1, i)} for i in range(8)]
    calib, held = calibration.split(samples)
    assert [int(s["x"][0]) for s in held] == [3, 7] and len(calib) == 6


def test_an_old_opset_is_converted_for_per_channel_weights(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    proto = onnx.load(str(model))
    proto.opset_import[0].version = 11
    onnx.save(proto, str(model))
    data = samples_npz(tmp_path / "calib.npz", "x", (1, 3, 8, 8))
    # the conversion is the point, not the gate: its 4 held-back samples of a small_cnn
    # whose weights depend on how many models the module's RNG made before
    result = quantize_file(model, tmp_path / "out.onnx", data, benchmark=False, max_drop="off")
    assert any("opset 11 to 13" in w for w in result.warnings)
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out, full_check=True)
    assert out.opset_import[0].version >= 13


def windowed_model(path: Path) -> Path:
    """x (N x L) -> Reshape to (-1, 4, 16) -> MatMul: only windows of 64k samples run (the
    inputs verification would generate for L do not)."""
    w = RNG.uniform(-1, 1, (16, 8)).astype(np.float32)
    graph = h.make_graph(
        [
            h.make_node("Reshape", ["x", "shape"], ["frames"], name="frame"),
            h.make_node("MatMul", ["frames", "w"], ["y"], name="project"),
        ],
        "windowed",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", "L"])],
        [h.make_tensor_value_info("y", T.FLOAT, ["B", 4, 8])],
        initializer=[
            numpy_helper.from_array(np.array([-1, 4, 16], np.int64), "shape"),
            numpy_helper.from_array(w, "w"),
        ],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def test_the_fused_model_is_verified_on_a_calibration_sample(tmp_path):
    """Generated inputs (L = 32) cannot run this model; the calibration samples (L = 64)
    can, and quantize verifies its fusions and its clean-up on them."""
    model = windowed_model(tmp_path / "w.onnx")
    data = tmp_path / "x.npz"
    np.savez(data, x=RNG.uniform(-1, 1, (8, 1, 64)).astype(np.float32))
    result = quantize_file(model, tmp_path / "out.onnx", data, max_drop="off", benchmark=False)
    assert (tmp_path / "out.onnx").exists() and result.accuracy[0].sqnr_db > 20
    assert "project" in {n.name for n in onnx.load(str(tmp_path / "out.onnx")).graph.node}


def rate_switch_model(path: Path) -> Path:
    """y = If(sr == 16000) {x @ w16} else {x @ w8}: the compute is in the branches (a voice
    detector's sample-rate switch); sr is a scalar input."""
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 8])
    branches = {}
    for rate in (16, 8):
        w = numpy_helper.from_array(RNG.uniform(-1, 1, (8, 4)).astype(np.float32), f"w{rate}")
        branches[rate] = h.make_graph(
            [h.make_node("MatMul", ["x", f"w{rate}"], [f"y{rate}"], name=f"mm{rate}")],
            f"rate{rate}",
            [],
            [h.make_tensor_value_info(f"y{rate}", T.FLOAT, [1, 4])],
            initializer=[w],
        )
    graph = h.make_graph(
        [
            h.make_node("Equal", ["sr", "rate"], ["is16k"], name="is16k"),
            h.make_node(
                "If", ["is16k"], ["y"], name="by_rate",
                then_branch=branches[16], else_branch=branches[8],
            ),
        ],
        "vad",
        [x, h.make_tensor_value_info("sr", T.INT64, [])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.array(16000, np.int64), "rate")],
    )  # fmt: skip
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def test_scalar_inputs_and_a_model_the_quantizer_cannot_enter(tmp_path):
    """sr is one number per sample (N values in the .npz); the MatMuls are inside If
    branches, which onnxruntime's QDQ quantizer leaves alone: the summary says nothing
    was quantized and why, instead of presenting the float model as int8."""
    model = rate_switch_model(tmp_path / "vad.onnx")
    data = tmp_path / "x.npz"
    n = 8
    np.savez(
        data,
        x=RNG.uniform(-1, 1, (n, 1, 8)).astype(np.float32),
        sr=np.full((n,), 16000, np.int64),
    )
    assert (
        calibration.read_samples(data, calibration.model_inputs(model), None)[0]["sr"].shape == ()
    )
    result = quantize_file(model, tmp_path / "out.onnx", data, benchmark=False)
    assert any("nothing was quantized" in w and "If/Loop/Scan" in w for w in result.warnings)
    assert result.accuracy[0].sqnr_db == float("inf")
    assert result.accuracy[0].top1 is None  # an If's output: no classifier head in sight


def test_the_exit_1_command_keeps_the_options_that_change_the_model():
    """--runtime openvino writes OpenVINO's form: the command that rebuilds the best model
    keeps it; the defaults are left out (``QuantizeSettings.command_line``)."""
    from opfuse.quantization.settings import QuantizeSettings

    settings = QuantizeSettings(calibrate_method="minmax", per_channel=False, enable=("X",))
    line = settings.command_line(Path("m.onnx"), Path("o.onnx"), "c.npz", "openvino")
    assert line.split() == [
        "opfuse", "quantize", "m.onnx", "-o", "o.onnx", "--calibration", "c.npz",
        "--runtime", "openvino", "--per-tensor", "--enable", "X",
    ]  # fmt: skip
    assert "--runtime" not in QuantizeSettings().command_line(
        Path("m.onnx"), Path("o.onnx"), "c.npz", "onnxruntime"
    )


def test_int8_slower_than_the_float_optimized_model_is_not_written(tmp_path):
    """The fastest model that keeps the answers (issue 41): int8 that passes the gate but
    is not faster than the float optimized model beyond the noise is exit 1, nothing
    written, the report written, the faster model named with the command that writes it;
    --write-slower writes the int8 model anyway."""
    model = small_cnn(tmp_path / "cnn.onnx")
    data = samples_npz(tmp_path / "calib.npz", "x", (1, 3, 8, 8))
    slow_q = FakeRuntime({"QuantizeLinear": 0.01, "DequantizeLinear": 0.01}, default=0.001)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    with pytest.raises(GateError) as caught:
        quantize_file(model, out, data, runtime=slow_q, max_drop="off", report=report)
    message = str(caught.value)
    assert message.startswith("int8 is not faster than the float models on fake")
    assert "x the float optimized model's time" in message and "(paired, the figures" in message
    assert f"as fast or faster, and exact: opfuse optimize {model} -o {out} writes it" in message
    assert "--write-slower writes the int8 model anyway" in message
    assert not out.exists() and json.loads(report.read_text())["speed"]["int8_pays"] is False
    assert caught.value.report is not None and caught.value.report.passed
    assert any(line.startswith("the float optimized model, as fast or faster: opfuse optimize")
               for line in caught.value.report.lines())  # fmt: skip
    written = quantize_file(model, out, data, runtime=slow_q, max_drop="off", write_slower=True)
    assert written.output == out and out.exists() and written.pays() is False
    fast_q = FakeRuntime({"Relu": 0.01}, default=0.0)  # the clean-up removes it in int8
    fast = quantize_file(model, tmp_path / "o2.onnx", data, runtime=fast_q, max_drop="off")
    assert fast.pays() and fast.output is not None


def test_the_speed_names_the_inputs_it_was_timed_on(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    data = samples_npz(tmp_path / "calib.npz", "x", (1, 3, 8, 8))
    fake = FakeRuntime({"Relu": 0.01}, default=0.001)
    result = quantize_file(model, None, data, runtime=fake, max_drop="off", write_slower=True)
    said = "timed on the first evaluation sample (x[1,3,8,8])"
    assert said in result.speed_verdict() and result.to_json()["speed"]["timed_on"] in said
