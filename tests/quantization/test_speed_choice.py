"""The fastest model that keeps the answers (``quantization.speed_choice``, issue 41 item
3): a recipe of another form that passes the gate too replaces the most accurate one only
when it is faster beyond the noise, timed with it in one paired measurement."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_task_measures import _two_layer_encoder

from opfuse.quantization import speed_choice
from opfuse.quantization.conductor import quantize_file
from opfuse.quantization.gate import Gate
from opfuse.quantization.recipes import Built
from opfuse.quantization.result import FLOAT_OPT, INT8
from opfuse.quantization.workspace import Workspace
from opfuse.runtime.fake import FakeRuntime
from opfuse.tuning.measure import AGAIN, ORIGINAL, Measurement


def _data(tmp_path):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    ids = rng.integers(1, 50, (32, 10)).astype(np.int64)
    mask = np.ones((32, 10), np.int64)
    np.savez(tmp_path / "c.npz", input_ids=ids[:20], attention_mask=mask[:20])
    np.savez(tmp_path / "e.npz", input_ids=ids[20:], attention_mask=mask[20:])
    return tmp_path / "c.npz", tmp_path / "e.npz"


@pytest.mark.parametrize("slow", ["MatMulInteger", "QuantizeLinear"])
def test_the_faster_form_that_passes_is_kept(tmp_path, slow):
    """On a built encoder the search keeps ``minmax,dynamic`` (the most accurate); where
    the dynamic MatMuls are slow, the static recipe, which passes too, is kept and said;
    where the static Q/DQ are slow, the dynamic one stays."""
    model = _two_layer_encoder(tmp_path / "enc.onnx")
    calib, held = _data(tmp_path)
    fake = FakeRuntime({slow: 0.05}, default=0.001)
    report = tmp_path / "r.json"
    result = quantize_file(
        model, None, calib, eval=held, runtime=fake, max_drop="off", write_slower=True,
        report=report,
    )  # fmt: skip
    notes = " ".join(result.notes)
    assert "the most accurate recipe, minmax,dynamic" in notes  # the search's, by accuracy
    ops = {n.op_type for n in result.model.graph.node}
    ratios = json.loads(report.read_text())["speed"]["ratios"]
    if slow == "MatMulInteger":
        assert "dynamic" not in result.recipe.split(",")
        assert "MatMulInteger" not in ops and "QuantizeLinear" in ops
        assert any(n.startswith("the fastest model that keeps the answers") for n in result.notes)
        assert speed_choice.label(("minmax", "dynamic")) in ratios
        assert ratios[INT8] < ratios[speed_choice.label(("minmax", "dynamic"))]
    else:
        assert result.recipe == "minmax,dynamic" and "MatMulInteger" in ops
        assert any("not faster beyond the noise, the most accurate kept" in n for n in result.notes)
    assert [r["recipe"] for r in result.recipes if r["kept"]] in ([result.recipe], [])


def test_nothing_else_is_built_without_the_speed_or_with_a_forced_recipe(tmp_path):
    model = _two_layer_encoder(tmp_path / "enc.onnx")
    calib, held = _data(tmp_path)
    fake = FakeRuntime({"MatMulInteger": 0.05}, default=0.001)
    options = {"eval": held, "max_drop": "off", "write_slower": True, "runtime": fake}
    forced = quantize_file(model, None, calib, recipe="minmax,dynamic", **options)
    assert forced.recipe == "minmax,dynamic" and forced.speed is not None
    assert set(forced.speed.times) == {ORIGINAL, AGAIN, FLOAT_OPT, INT8}
    quiet = quantize_file(model, None, calib, eval=held, max_drop="off", benchmark=False)
    assert quiet.recipe == "minmax,dynamic"
    assert not any("keeps the answers" in n or "also pass" in n for n in quiet.notes)


def _built(steps: tuple[str, ...], top1: float) -> Built:
    from opfuse.quantization.accuracy import OutputAccuracy

    ws = Workspace("m", None, None, [], [])  # type: ignore[arg-type]
    figures = OutputAccuracy("y", 30.0, 0.999, 0.1, top1=top1, rows=1000)
    return Built(steps, ws, accuracy=[figures])


def test_other_forms_take_the_best_of_each_form_that_passes():
    gate = Gate.parse("top1=0.99")
    tried = [
        _built(("minmax",), 0.995),
        _built(("minmax", "dynamic"), 0.999),
        _built(("mean-minmax",), 0.999),  # the same form as minmax, more accurate
        _built(("minmax", "float-requant"), 0.95),  # misses the gate: never a candidate
        _built(("float-stem", "minmax"), 0.999),  # the restorer's: not a form of its own
    ]
    got = speed_choice.other_forms(gate, tried, ("minmax", "dynamic"), 2)
    assert got == [("mean-minmax",)]
    stem = speed_choice.other_forms(gate, tried, ("float-stem", "minmax"), 2)
    assert stem == [("float-stem", "minmax", "dynamic")]
    assert speed_choice.other_forms(gate, tried, ("minmax",), 0) == []
    # parts kept in float by the restorer: a form that missed on its own may pass with them
    restored = speed_choice.other_forms(gate, tried, ("minmax", "dynamic"), 2, restored=True)
    assert restored == [("mean-minmax",), ("minmax", "float-requant")]


def _measurement(times: dict[str, float], noise: float = 0.0) -> Measurement:
    rng = np.random.default_rng(0)
    rounds = 30
    out = {}
    for label, t in times.items():
        out[label] = [t * (1 + noise * (2 * rng.random() - 1)) for _ in range(rounds)]
    return Measurement("fake", rounds, out)


def test_choose_switches_only_beyond_the_noise():
    others = {speed_choice.label(("minmax",)): ("minmax",)}
    base = {ORIGINAL: 10.0, AGAIN: 10.0, FLOAT_OPT: 9.0}
    clear = _measurement({**base, INT8: 6.0, speed_choice.label(("minmax",)): 4.0})
    choice = speed_choice.choose(clear, ("minmax", "dynamic"), others)
    assert choice.kept == speed_choice.label(("minmax",))
    assert choice.speed.medians[INT8] == pytest.approx(4.0)
    assert choice.speed.medians[speed_choice.label(("minmax", "dynamic"))] == pytest.approx(6.0)
    close = _measurement({**base, INT8: 6.0, speed_choice.label(("minmax",)): 5.9}, noise=0.05)
    assert speed_choice.choose(close, ("minmax", "dynamic"), others).kept == INT8
    slower = _measurement({**base, INT8: 6.0, speed_choice.label(("minmax",)): 8.0})
    kept = speed_choice.choose(slower, ("minmax", "dynamic"), others)
    assert kept.kept == INT8 and kept.speed is slower
    assert speed_choice.choose(clear, ("minmax",), {}).note == ""


def test_a_switch_needs_a_second_run_in_the_reverse_order_to_agree():
    fast = speed_choice.label(("minmax",))
    others = {fast: ("minmax",)}
    base = {ORIGINAL: 10.0, AGAIN: 10.0, FLOAT_OPT: 9.0}
    first = _measurement({**base, INT8: 6.0, fast: 4.0})
    choice = speed_choice.choose(first, ("minmax", "dynamic"), others)
    agrees = _measurement({ORIGINAL: 10.0, AGAIN: 10.0, INT8: 6.0, fast: 4.1})
    assert speed_choice.confirmed(choice, agrees, ("minmax", "dynamic")) is choice
    differs = _measurement({ORIGINAL: 10.0, AGAIN: 10.0, INT8: 6.0, fast: 6.0})
    kept = speed_choice.confirmed(choice, differs, ("minmax", "dynamic"))
    assert kept.kept == INT8 and kept.speed.medians[INT8] == pytest.approx(6.0)
    assert "not confirmed, the most accurate kept" in kept.note
    assert "passes the gate too: kept" not in kept.note


def test_openvino_s_search_leaves_out_the_dynamic_matmuls_it_runs_slower(tmp_path):
    """OpenVINO ran the trained MiniLM's dynamic int8 MatMuls at 2.28x its float time
    (recipes.SLOWER_ON): with --runtime openvino the search does not try them, and says
    why; onnxruntime's search does."""
    from opfuse.runtime.settings import RuntimeSettings

    model = _two_layer_encoder(tmp_path / "enc.onnx")
    calib, held = _data(tmp_path)
    options = {"eval": held, "max_drop": "off", "benchmark": False}
    openvino = RuntimeSettings(runtime="openvino")
    made = quantize_file(model, None, calib, runtime=openvino, **options)
    assert "dynamic" not in made.recipe.split(",") and made.form == "openvino"
    assert not any("dynamic" in str(r["recipe"]) for r in made.recipes)
    [why] = [s for s in made.skipped if s.startswith("dynamic ")]
    assert "OpenVINO runs dynamic int8 MatMuls slower than float" in why
    onnxruntime = quantize_file(model, None, calib, **options)
    assert "minmax,dynamic" in {str(r["recipe"]) for r in onnxruntime.recipes}
