"""The fallback's first try, the stem in float (fallback.stem_recipes / stem_first): only
when the recipe misses the gate; the chosen recipe with the stem and, unless forced, the
stem with global min/max ranges; kept only when it scores better, as the search scored
and then on the evaluation samples."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h
from test_float_stem import conv, detector_like, feed, model_of, outlier_stem

import opfuse
from opfuse.errors import GateError, OpfuseError
from opfuse.quantization import fallback, flow, recipes
from opfuse.quantization.accuracy import OutputAccuracy
from opfuse.quantization.float_stem import stem_nodes
from opfuse.quantization.gate import Gate
from opfuse.quantization.workspace import Workspace


def test_the_stem_recipes():
    assert fallback.stem_recipes(("mean-minmax", "bias-correction"), forced=False) == [
        ("float-stem", "mean-minmax", "bias-correction"),
        ("float-stem", "minmax"),
    ]
    # forced: the user's recipe with the stem, nothing else
    assert fallback.stem_recipes(("mse",), forced=True) == [("float-stem", "mse")]
    # already there, or the recipe is plain minmax: nothing, or one
    assert fallback.stem_recipes(("float-stem", "minmax"), forced=False) == []
    assert fallback.stem_recipes(("minmax",), forced=False) == [("float-stem", "minmax")]


def _figures(sqnr: float) -> list[OutputAccuracy]:
    return [OutputAccuracy("y", sqnr, 0.9, 1.0)]


def _workspace() -> Workspace:
    model = detector_like()
    return Workspace(
        name="m", fused_model=model, float_model=model, calib=[feed(1)], valid=[feed(2)] * 3
    )


def _scores(monkeypatch: pytest.MonkeyPatch, sqnr: dict[tuple[str, ...], float]) -> list:
    scored: list = []

    def fake(ws, steps):
        scored.append(steps)
        return recipes.Built(steps, ws, accuracy=_figures(sqnr[steps]))

    monkeypatch.setattr(recipes, "scored", fake)
    return scored


def test_stem_first_keeps_the_best_recipe_that_beats_the_chosen(monkeypatch):
    sqnr = {("float-stem", "mean-minmax"): 14.0, ("float-stem", "minmax"): 18.0}
    scored = _scores(monkeypatch, sqnr)
    chosen = recipes.Built(("mean-minmax",), _workspace(), accuracy=_figures(8.0))
    got = fallback.stem_first(chosen.ws, Gate.parse("sqnr=20"), chosen, [chosen], forced=False)
    assert got is not None and got.steps == ("float-stem", "minmax")
    assert scored == [("float-stem", "mean-minmax"), ("float-stem", "minmax")]


def test_stem_first_keeps_nothing_without_a_gain(monkeypatch):
    _scores(monkeypatch, {("float-stem", "minmax"): 8.0})
    chosen = recipes.Built(("minmax",), _workspace(), accuracy=_figures(8.0))
    assert fallback.stem_first(chosen.ws, Gate.parse("sqnr=20"), chosen, [], False) is None


def test_stem_first_does_not_fire_where_there_is_no_stem(monkeypatch):
    scored = _scores(monkeypatch, {})
    inits: dict = {}
    nodes = [  # the first layer alone holds 96% of the multiply-adds: no stem
        conv("big", "x", "b", 3, 64, 3, inits),
        h.make_node("Relu", ["b"], ["a"], name="relu"),
        conv("small", "a", "y", 64, 1, 1, inits),
    ]
    model = model_of(nodes, inits, 1)
    ws = Workspace(name="m", fused_model=model, float_model=model, calib=[feed(1)], valid=[])
    chosen = recipes.Built(("minmax",), ws, accuracy=_figures(8.0))
    assert fallback.stem_first(ws, Gate.parse("sqnr=20"), chosen, [], False) is None
    assert scored == []


def _data(seeds: range) -> dict[str, np.ndarray]:
    return {"x": np.concatenate([feed(s)["x"] for s in seeds])}


def _model():
    model = outlier_stem()
    del model.graph.output[:]
    model.graph.output.append(h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 96, "h", "w"]))
    return model


def _quantize(
    max_drop: str, recipe: str = "minmax", samples: int = 8, exclude: tuple | list = ()
) -> opfuse.QuantizeResult:
    return opfuse.quantize(
        _model(),
        exclude=list(exclude),
        calibration=_data(range(samples)),
        eval=_data(range(10, 14)),
        max_drop=max_drop,
        recipe=recipe,
        benchmark=False,
    )


@pytest.mark.parametrize("samples", [8, 6])  # 6: no validation part apart
def test_a_missed_gate_is_passed_with_the_stem_in_float(samples):
    missed = _quantize("off", samples=samples)
    floor = missed.accuracy[0].sqnr_db + 5.0
    result = _quantize(f"sqnr={floor:.1f}", samples=samples)
    assert result.passed and result.recipe == "float-stem,minmax"
    assert result.first_recipe == "minmax" and result.to_json()["first_recipe"] == "minmax"
    assert [r["recipe"] for r in result.recipes if r["kept"]] == ["float-stem,minmax"]
    assert result.accuracy[0].sqnr_db >= floor
    assert any("with the stem in float" in n for n in result.notes)
    # the stem's Convs run in float in the model written: no DequantizeLinear feeds them
    producer = {o: n for n in result.model.graph.node for o in n.output}
    stem0 = next(n for n in result.model.graph.node if n.name == "stem0")
    assert all(
        producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in stem0.input
    )


def test_a_gate_the_recipe_meets_keeps_every_layer_in_int8():
    result = _quantize("sqnr=1")
    assert result.passed and result.recipe == "minmax"
    assert not any("stem" in n for n in result.notes)


def test_stem_first_tries_one_recipe_when_the_fallback_tries_are_spent(monkeypatch):
    sqnr = {("float-stem", "mean-minmax"): 14.0, ("float-stem", "minmax"): 18.0}
    scored = _scores(monkeypatch, sqnr)
    chosen = recipes.Built(("mean-minmax",), _workspace(), accuracy=_figures(8.0))
    got = fallback.stem_first(chosen.ws, Gate.parse("sqnr=20"), chosen, [], False, tries=1)
    assert scored == [("float-stem", "mean-minmax")]
    assert got is not None and got.steps == ("float-stem", "mean-minmax")


def test_a_stem_that_does_not_help_is_said_and_listed(monkeypatch):
    """A stem that cannot help (here: a Relu the int8 model's error does not come from):
    its recipe is tried, listed among the recipes (not kept) and said in a note."""
    from opfuse.errors import GateError
    from opfuse.quantization import steps

    monkeypatch.setattr(steps, "stem_nodes", lambda model, feed: ["body_relu"])
    with pytest.raises(GateError) as caught:
        _quantize("sqnr=200")
    result = caught.value.report
    assert result is not None and result.recipe == "minmax"
    listed = [r["recipe"] for r in result.recipes]
    assert "float-stem,minmax" in listed
    assert [r["recipe"] for r in result.recipes if r["kept"]] == ["minmax"]
    assert any("with the stem in float (" in n and "not kept" in n for n in result.notes)


def test_the_leading_layers_in_float_pass_a_gate_the_stem_misses(monkeypatch):
    """No part singled out (no tries), the stem already in the recipe: the fallback keeps
    the leading layers in float (cross-validated over the calibration samples), the gate
    holds, and the summary gives the gate the model before it passes (more in int8)."""
    monkeypatch.setattr(fallback, "MAX_FALLBACK_TRIES", 0)
    monkeypatch.setattr(fallback, "MIN_GROUP", 99)
    stem = _quantize("off", recipe="float-stem,minmax")
    floor = stem.accuracy[0].sqnr_db + 1.0
    result = _quantize(f"sqnr={floor:.1f}", recipe="float-stem,minmax")
    assert result.passed and result.accuracy[0].sqnr_db >= floor
    [part] = result.kept_float
    assert part.how == fallback.LEADING and part.node.startswith("the leading 25% of the")
    assert "(cross-validated over the calibration samples" in result.fallback_stopped
    loose = Gate.parse(result.first_passes)
    assert loose.misses(result.first_accuracy) == [] and loose.sqnr_db < floor
    text = result.summary()
    assert f"passes --max-drop {result.first_passes}" in text
    assert f"kept in float to pass the gate: {part.node}" in text
    assert result.to_json()["kept_float"][0]["sqnr_db"] is None  # JSON has no NaN
    assert result.to_json()["first_passes_max_drop"] == result.first_passes
    # its layers run in float: no DequantizeLinear feeds them
    producer = {o: n for n in result.model.graph.node for o in n.output}
    convs = [n for n in result.model.graph.node if n.name in part.in_float and n.op_type == "Conv"]
    assert convs
    for node in convs:
        assert all(
            producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in node.input
        )


def test_a_missed_gate_gives_the_command_with_the_leading_share(monkeypatch):
    """The leading layers kept as the best reached: the command that writes that model
    names them as ``--exclude leading=SHARE`` (not 100 node names), and that item keeps
    the same nodes in float."""
    monkeypatch.setattr(fallback, "MAX_FALLBACK_TRIES", 0)
    monkeypatch.setattr(fallback, "MIN_GROUP", 99)
    stem = _quantize("off", recipe="float-stem,minmax")
    with pytest.raises(GateError) as caught:
        _quantize(f"sqnr={stem.accuracy[0].sqnr_db + 30:.1f}", recipe="float-stem,minmax")
    report = caught.value.report
    [part] = report.kept_float
    assert part.how == fallback.LEADING and part.exclude_items == ["leading=25%"]
    assert "exclude=['leading=25%']" in report.command
    assert "keeping 1 part in float (the leading 25% of the multiply-adds" in str(caught.value)
    assert "kept in float (the gate still missed): the leading 25%" in report.summary()
    assert report.to_json()["kept_float"][0]["exclude"] == ["leading=25%"]
    # the command's model: the same graph (the same nodes in float), the same figures
    again = _quantize("off", recipe="float-stem,minmax", exclude=["leading=25%"])
    written = caught.value.report.model
    assert [(n.op_type, n.name) for n in again.model.graph.node] == [
        (n.op_type, n.name) for n in written.graph.node
    ]
    assert again.accuracy[0].sqnr_db == pytest.approx(report.accuracy[0].sqnr_db, abs=0.05)


def test_exclude_leading_takes_the_stems_nodes():
    model = _model()
    sample = feed(1)
    assert flow.excluded_names(model, ["leading=25%"], "m", sample) == stem_nodes(
        model, sample, 0.25
    )
    assert flow.excluded_names(model, ["leading=0.25"], "m", sample) == stem_nodes(
        model, sample, 0.25
    )
    for bad in ("leading=0%", "leading=100%", "leading=abc", "leading=1.5"):
        with pytest.raises(OpfuseError, match="leading=SHARE takes a share"):
            flow.excluded_names(model, [bad], "m", sample)
    with pytest.raises(OpfuseError, match="alone is more than that share"):
        flow.excluded_names(model, ["leading=0.1%"], "m", sample)
