"""Advice that holds on real models: no fold across a value read elsewhere, no traffic
charged to ops that move no data, no alignment hint for heads and inputs of <= 4 channels
and a stated gain for the others."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from advisor_models import make_model, ort_profile, write_json
from onnx import helper

from opfuse.advisor.conductor import AdviseOptions, advise, read_outside
from opfuse.advisor.constraints import alignment_hints
from opfuse.advisor.graph import from_model
from opfuse.advisor.l2 import estimate_ratios
from opfuse.runtime.targets import load_target

N = helper.make_node


def hardswish_net() -> onnx.ModelProto:
    """Conv -> x * Clip(x + 3, 0, 6) / 6 (HardSwish written out, as Keras exports it), at
    opset 13: from 14 on HardSwishFusionPass folds it before ConvAdd can be refused."""
    inits = {
        "W": np.random.default_rng(0).standard_normal((16, 16, 1, 1)).astype(np.float32),
        "three": np.array(3.0, np.float32),
        "zero": np.array(0.0, np.float32),
        "six": np.array(6.0, np.float32),
    }
    nodes = [
        N("Conv", ["x", "W"], ["c"], name="conv"),
        N("Add", ["c", "three"], ["t"], name="add3"),
        N("Clip", ["t", "zero", "six"], ["cl"], name="clip"),
        N("Mul", ["c", "cl"], ["m"], name="mul"),
        N("Div", ["m", "six"], ["y"], name="div6"),
    ]
    return make_model(nodes, {"x": [1, 16, 8, 8]}, {"y": [1, 16, 8, 8]}, inits, opset=13)


def test_no_fold_suggested_across_a_value_read_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "hswish.onnx"
    onnx.save(hardswish_net(), path)
    times = {n: ("X", 5.0) for n in ("conv", "add3", "clip", "mul", "div6")}
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=2))
    report = advise(
        path, profile_path=prof, options=AdviseOptions(warmup=1, compare_onnxruntime=False)
    )
    (group,) = report["ub_fusion"]
    assert group["nodes"] == ["conv", "add3", "clip", "mul", "div6"]
    assert group["activations"] == [{"name": "HardSwish", "nodes": ["add3", "clip", "mul", "div6"]}]
    # ConvAddFusionPass matched conv + add3 and was refused (the Conv's output is read by
    # the Mul too): that fold is never valid, so the group names no pass
    refused = [
        r
        for row in report["graph_fusion"]
        for r in row["reasons"]
        if row["pass"] == "ConvAddFusionPass"
    ]
    assert refused, "the refused fold is still in the trial log"
    # not the refused fold: Next steps' --target-opset 14 fuses the written-out HardSwish,
    # and the group says so (one truth per report)
    assert group["opfuse"]["pass"] == "HardSwishFusionPass" and group["opfuse"]["fires"]
    assert group["next_step"]["command"].endswith("--target-opset 14")


def test_read_outside() -> None:
    g = from_model(ir.from_proto(hardswish_net()))
    assert read_outside(g, frozenset({"conv", "add3"}))  # c is read by mul as well
    assert not read_outside(g, frozenset({"add3", "clip"}))  # t is read by clip only
    assert not read_outside(g, frozenset({"conv", "add3", "clip", "mul"}))


@pytest.mark.parametrize("op", ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"])
def test_no_copy_ops_are_charged_no_traffic(op: str) -> None:
    target = load_target("cpu")
    ratios = estimate_ratios(op, [[64, 1024]], [[65536]], 1.0, target, 4)
    assert ratios is not None
    assert ratios["mte2_ratio"] == ratios["mte3_ratio"] == ratios["vec_ratio"] == 0.0
    moved = estimate_ratios("Transpose", [[64, 1024]], [[1024, 64]], 1.0, target, 4)
    assert moved is not None and moved["mte2_ratio"] > 0 and moved["mte3_ratio"] > 0


def conv_graph(cin: int, cout: int, head: int):  # type: ignore[no-untyped-def]
    """x (cin) -> conv (cout) -> head conv (head channels) -> y."""
    inits = {
        "W": np.ones((cout, cin, 1, 1), np.float32),
        "H": np.ones((head, cout, 1, 1), np.float32),
    }
    nodes = [N("Conv", ["x", "W"], ["c"], name="conv"), N("Conv", ["c", "H"], ["y"], name="head")]
    proto = make_model(nodes, {"x": [1, cin, 4, 4]}, {"y": [1, head, 4, 4]}, inits)
    return from_model(ir.from_proto(proto))


def test_alignment_skips_small_inputs_and_heads_and_states_the_gain() -> None:
    g = conv_graph(3, 20, 1)  # RGB in, 20 channels (not a multiple of 8), 1-channel head
    hints = alignment_hints(g, {0: 50.0, 1: 10.0}, 8)
    by_node = {h.node: h for h in hints}
    assert set(by_node) == {"conv", "head"}
    assert by_node["conv"].message.startswith("output channels 20 not a multiple of 8")
    assert "input channels 3" not in by_node["conv"].message
    assert by_node["head"].message.startswith("input channels 20 not a multiple of 8")
    assert "output channels 1 " not in by_node["head"].message
    assert by_node["conv"].gain_us == pytest.approx(10.0)  # the guide's ~20% of 50 us
    assert "estimated gain 10.0 us per run" in by_node["conv"].message
    # 4 channels in and a 2-channel head around an aligned 16: nothing to say
    assert alignment_hints(conv_graph(4, 16, 2), {0: 50.0, 1: 10.0}, 8) == []
