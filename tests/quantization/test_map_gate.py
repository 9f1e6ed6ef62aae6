"""A map a Sigmoid makes (N x C x H x W probabilities: a detector's score map) is judged by
its map IoU (the pixels above 0.5 in the float and int8 maps), not by an SQNR floor no int8
detector meets: ``iou=90%`` is the floor, the default where such an output is; ``sqnr=DB``
alone judges every output by its SQNR as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from opfuse.errors import OpfuseError
from opfuse.quantization.accuracy import compare_output, map_iou, probability_maps
from opfuse.quantization.gate import Gate


def map_model() -> onnx.ModelProto:
    """x [1, 3, 16, 16] -> Conv -> Sigmoid -> "map" [1, 1, 16, 16]; and a Sigmoid over a
    vector ("gate", 2-D: no map) and a Relu output ("feat")."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((1, 3, 3, 3)) * 2).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 768], np.int64), "flat"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w"], ["logits"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["logits"], ["prob"], name="sigmoid"),
        h.make_node("Identity", ["prob"], ["map"], name="out"),
        h.make_node("Reshape", ["x", "flat"], ["row"], name="flatten"),
        h.make_node("Sigmoid", ["row"], ["gate"], name="gate_sigmoid"),
        h.make_node("Relu", ["logits"], ["feat"], name="relu"),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [
            h.make_tensor_value_info(n, TensorProto.FLOAT, shape)
            for n, shape in (("map", [1, 1, 16, 16]), ("gate", [1, 768]), ("feat", [1, 1, 16, 16]))
        ],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_the_maps_a_sigmoid_makes_and_their_iou():
    assert probability_maps(map_model()) == {"map", "gate"}
    ref = np.zeros((1, 1, 4, 4), np.float32)
    ref[0, 0, :2, :2] = 0.9  # 4 pixels of "text"
    got = ref.copy()
    got[0, 0, 0, 0] = 0.4  # one lost
    got[0, 0, 3, 3] = 0.7  # one gained
    assert map_iou(ref, got) == pytest.approx(3 / 5)
    assert map_iou(ref, got, threshold=0.3) == pytest.approx(4 / 5)
    assert map_iou(np.zeros_like(ref), np.zeros_like(ref)) == 1.0  # nothing in either
    judged = compare_output("map", ref, got, scores=False, probability_map=True)
    assert judged.map_iou == pytest.approx(0.6) and judged.top1 is None
    assert "map IoU 60.0%" in judged.line()
    assert judged.to_json()["map_iou"] == pytest.approx(0.6)
    # must not fire: a 2-D Sigmoid output (no map), values beyond [0, 1], not a Sigmoid's
    assert compare_output("gate", ref[0, 0], got[0, 0], False, True).map_iou is None
    assert compare_output("map", ref * 3, got * 3, False, True).map_iou is None


def figures(iou: float, sqnr_db: float = 8.0):
    """A map whose IoU is ``iou`` (of 100 pixels) and a feature output at ``sqnr_db``."""
    ref = np.zeros((1, 1, 10, 10), np.float32)
    ref.flat[:100] = 0.9
    got = ref.copy()
    got.flat[: int(round(100 * (1 - iou)))] = 0.1
    feat = np.linspace(1, 2, 50)
    noise = np.sqrt(np.mean(feat**2) / 10 ** (sqnr_db / 10))
    return [
        compare_output("map", ref, got, scores=False, probability_map=True),
        compare_output("feat", feat, feat + noise * np.resize([1, -1], 50), scores=False),
    ]


def test_the_gate_judges_a_map_by_its_iou():
    auto = Gate.parse("auto")
    passing, missing = figures(0.95, sqnr_db=30.0), figures(0.85, sqnr_db=30.0)
    assert passing[0].sqnr_db < 20  # the map's SQNR is low: it is not what is judged
    assert auto.misses(passing) == []
    assert auto.misses(missing) == ["map: map IoU 85.0% < 90.0%"]
    assert Gate.parse("iou=80%").misses(missing) == []
    assert Gate.parse("iou=0.9").map_iou == pytest.approx(0.9)
    # the other outputs keep their measure: a feature below 20 dB still misses
    assert auto.misses(figures(0.95, sqnr_db=10.0)) == ["feat: SQNR 10.0 dB < 20 dB"]
    # sqnr= alone judges every output by its SQNR, the map too (as before this release)
    assert any(m.startswith("map: SQNR") for m in Gate.parse("sqnr=20").misses(passing))
    both = Gate.parse("sqnr=5,iou=90%")
    assert both.misses(missing) == ["map: map IoU 85.0% < 90.0%"]
    assert both.option() == "sqnr=5,iou=90%" and Gate.parse(both.option()) == both
    assert "map IoU >= 90% where a Sigmoid makes a map" in auto.describe()
    assert "map IoU" not in Gate.parse("sqnr=20").describe()
    assert Gate.parse("off").misses(missing) == []
    for text, message in [
        ("iou=40%", "turns the gate off in effect"),
        ("iou=120%", "between 0 and 100%"),
        ("iou=x", "could not convert"),
    ]:
        with pytest.raises(OpfuseError, match=message):
            Gate.parse(text)


def test_quantize_measures_a_sigmoid_map_by_its_iou(tmp_path: Path):
    from opfuse.quantization.conductor import quantize_file

    path = tmp_path / "map.onnx"
    onnx.save(map_model(), str(path))
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((8, 1, 3, 16, 16)).astype(np.float32))
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    by_name = {a.name: a for a in result.accuracy}
    assert by_name["map"].map_iou is not None and 0.5 < by_name["map"].map_iou <= 1.0
    assert by_name["gate"].map_iou is None and by_name["feat"].map_iou is None
    report = result.to_json()
    assert report["schema"] == "opfuse.quantize/3"
    assert [a["map_iou"] is not None for a in report["accuracy"]] == [True, False, False]


def test_iou_alone_keeps_the_class_outputs_floor():
    from opfuse.quantization.accuracy import OutputAccuracy

    classes = OutputAccuracy("scores", 30.0, 0.99, 0.1, top1=0.10, top5=0.5, rows=100)
    gate = Gate.parse("iou=95%")
    assert gate.top1 == pytest.approx(0.99)
    assert gate.misses([classes]) == ["scores: top-1 agreement 10.0% < 99.0%"]


def test_better_compares_maps_by_their_iou_not_their_sqnr():
    auto = Gate.parse("auto")
    sharp, blurred = figures(0.89, sqnr_db=30.0)[:1], figures(0.70, sqnr_db=30.0)[:1]
    # the blurred map's SQNR is the higher one: it must not decide
    blurred[0] = replace(blurred[0], sqnr_db=sharp[0].sqnr_db + 3.0)
    assert auto.better(sharp, blurred) and not auto.better(blurred, sharp)
    # within a point of IoU: a tie, whatever the SQNR
    near = [replace(sharp[0], map_iou=sharp[0].map_iou - 0.005, sqnr_db=sharp[0].sqnr_db + 5)]
    assert not auto.better(near, sharp) and not auto.better(sharp, near)
    # a change judged strictly never wins while its map loses IoU
    assert not auto.better(blurred, sharp, strict=True)
    # sqnr= alone: maps are judged by their SQNR, as before
    assert Gate.parse("sqnr=20").better(blurred, sharp)
