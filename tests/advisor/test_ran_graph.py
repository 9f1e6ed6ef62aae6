"""With a model and its Ascend op summary, groups are grown on the operators that ran:
CANN fused names split back into the model's nodes, durations the sums of the rows,
fusion types from the profile's OP Types, the squeeze-excite Mul in its conv's group,
opfuse's removals in a field of their own and unmapped names reported."""

from __future__ import annotations

import csv

import numpy as np
import onnx
import pytest
from advisor_models import make_model
from onnx import helper

from opfuse.advisor.conductor import advise
from opfuse.advisor.executed_graph import split_fused_name

N = helper.make_node
DW = "block2a_dwconv/depthwise"
FUSED = f"{DW}block2a_activation/Sigmoidblock2a_activation/mul"
# op summary rows: name, OP Type, Task Duration(us); the model's nodes are named as Keras's
ROWS = [
    ("cast_in", "Cast", 5.0),
    (FUSED, "DepthwiseConv2D", 100.25),
    ("trans_TransData_9", "TransData", 2.0),  # CANN's own: no model node
    ("block2a_se_squeeze/Mean", "ReduceMeanD", 3.0),
    ("block2a_se_reduce/Conv2Dblock2a_se_reduce/Relu", "Conv2D", 4.0),
    ("block2a_se_expand/Conv2Dblock2a_se_expand/Sigmoid", "Conv2D", 6.0),
    ("block2a_se_excite/mul", "Mul", 20.5),
    ("block2a_project_conv/Conv2D", "Conv2D", 30.0),
    ("cast_out", "Cast", 7.0),
]


def keras_block() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {
        "Wd": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
        "Wr": rng.standard_normal((2, 8, 1, 1)).astype(np.float32),
        "We": rng.standard_normal((8, 2, 1, 1)).astype(np.float32),
        "Wp": rng.standard_normal((8, 8, 1, 1)).astype(np.float32),
    }
    nodes = [
        N("Cast", ["x"], ["xc"], name="cast_in", to=onnx.TensorProto.FLOAT),
        N("Conv", ["xc", "Wd"], ["d"], name=DW, group=8, pads=[1, 1, 1, 1]),
        N("Sigmoid", ["d"], ["s"], name="block2a_activation/Sigmoid"),
        N("Mul", ["d", "s"], ["sw"], name="block2a_activation/mul"),
        N("GlobalAveragePool", ["sw"], ["p"], name="block2a_se_squeeze/Mean"),
        N("Conv", ["p", "Wr"], ["r"], name="block2a_se_reduce/Conv2D"),
        N("Relu", ["r"], ["rr"], name="block2a_se_reduce/Relu"),
        N("Conv", ["rr", "We"], ["e"], name="block2a_se_expand/Conv2D"),
        N("Sigmoid", ["e"], ["gate"], name="block2a_se_expand/Sigmoid"),
        N("Mul", ["sw", "gate"], ["ex"], name="block2a_se_excite/mul"),
        N("Conv", ["ex", "Wp"], ["pc"], name="block2a_project_conv/Conv2D"),
        N("Cast", ["pc"], ["y"], name="cast_out", to=onnx.TensorProto.FLOAT),
    ]
    return make_model(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]}, inits)


def write_summary(path, rows):  # type: ignore[no-untyped-def]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Op Name", "OP Type", "Task Type", "Task Start Time", "Task Duration(us)"])
        for i, (name, op, us) in enumerate(rows):
            out.writerow([name, op, "AI_CORE", 1000 + 100 * i, us])
    return path


@pytest.fixture
def report(tmp_path):  # type: ignore[no-untyped-def]
    model = tmp_path / "block.onnx"
    onnx.save(keras_block(), model)
    return advise(model, op_summary=write_summary(tmp_path / "op_summary_0_1.csv", ROWS))


def test_groups_are_the_operators_that_ran(report) -> None:  # type: ignore[no-untyped-def]
    rows = {name: us for name, _, us in ROWS}
    ub = {g["nodes"][0]: g for g in report["ub_fusion"]}
    se = ub[FUSED]
    # msadvisor's seed 000 example: DepthwiseConv2D+Mul, the fused name, then se_excite/mul
    assert se["fusion_type"] == "DepthwiseConv2D+Mul"
    assert se["nodes"] == [FUSED, "block2a_se_excite/mul"]
    assert se["model_nodes"][0] == [DW, "block2a_activation/Sigmoid", "block2a_activation/mul"]
    for g in report["ub_fusion"]:  # every group: the sum of its operators' rows
        assert g["duration_us"] == pytest.approx(sum(rows[n] for n in g["nodes"]))
    assert report["profile"]["unmapped_nodes"] == ["trans_TransData_9"]
    assert report["profile"]["unmapped_us"] == pytest.approx(2.0)
    assert report["graph"]["analysed"].startswith("the operators of the op summary")
    assert report["graph"]["nodes_analysed"] == len(ROWS) - 1


def test_what_opfuse_removes_is_apart_from_the_measured_time(report) -> None:  # type: ignore[no-untyped-def]
    ub = {g["nodes"][0]: g for g in report["ub_fusion"]}
    project = ub["block2a_project_conv/Conv2D"]
    assert project["nodes"] == ["block2a_project_conv/Conv2D", "cast_out"]
    assert project["duration_us"] == pytest.approx(37.0)  # measured: the Cast ran
    assert project["opfuse_removes_us"] == pytest.approx(7.0)  # the float->float Cast goes
    assert ub[FUSED]["opfuse_removes_us"] == 0.0


def test_split_fused_name() -> None:
    known = {"a/b": 0, "a/bc": 1, "c/d": 2, "e": 3}
    assert split_fused_name("a/bc/d", known) == [0, 2]
    assert split_fused_name("a/bce", known) == [1, 3]
    assert split_fused_name("a/bcx", known) is None


def test_text_report_shows_the_removal_apart(report) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_text

    buf = StringIO()
    render_text(report, Console(file=buf, width=400, color_system=None))
    text = buf.getvalue()
    assert (
        f"Fusion Type: DepthwiseConv2D+Mul; Fusion Operator Detail: {FUSED}, "
        "block2a_se_excite/mul; Fusion Operator Duration: 120.750000;" in text
    )
    line = next(ln for ln in text.splitlines() if "Operator Detail: block2a_project" in ln)
    following = text.splitlines()[text.splitlines().index(line) + 1]
    assert "opfuse removes 7.000 us of this group" in following
    assert "Fusion Operator Duration: 37.000000;" in line  # measured, the Cast included
    assert "time not mapped onto the graph: 2.0 us per run, 1 name(s): trans_TransData_9" in text
    assert "No trial: the profile is from Ascend" in text
