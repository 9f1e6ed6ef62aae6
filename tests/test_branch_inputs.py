"""Generated inputs that decide a branch: a sample-rate input compared with 16000 (as a
voice-activity detector's ``sr``) gets 16000, so verification, ``--benchmark`` and tune
run the branch real inputs take; where no value can be derived (Less, a flag reaching an
If), every one of them warns and names the input, the node and ``--inputs``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from opfuse.runtime.fake import FakeRuntime
from opfuse.tuning import search as tuning
from opfuse.tuning.measure import measure
from opfuse.verification.compare import compare_files
from opfuse.verification.inputs import BRANCH_HINT, branch_uses


def vad_like(compare: str = "Equal", threshold: int = 16000) -> onnx.ModelProto:
    """x scaled by 2 when ``sr`` (an int64 scalar) <compare> threshold, else by 3; the
    comparison sits behind a Reshape and inside nothing (the If reads it)."""

    def branch(name: str, factor: float) -> onnx.GraphProto:
        return h.make_graph(
            [h.make_node("Mul", ["x", f"k_{name}"], [f"y_{name}"], name=f"mul_{name}")],
            name,
            [],
            [h.make_tensor_value_info(f"y_{name}", T.FLOAT, [1, 16])],
            initializer=[h.make_tensor(f"k_{name}", T.FLOAT, [], [factor])],
        )

    nodes = [
        h.make_node("Reshape", ["sr", "scalar_shape"], ["sr_s"], name="flatten_sr"),
        h.make_node(compare, ["sr_s", "rate"], ["is_rate"], name="is_16k"),
        h.make_node(
            "If",
            ["is_rate"],
            ["y"],
            name="choose",
            then_branch=branch("then", 2.0),
            else_branch=branch("else", 3.0),
        ),
    ]
    graph = h.make_graph(
        nodes,
        "vad",
        [
            h.make_tensor_value_info("x", T.FLOAT, [1, 16]),
            h.make_tensor_value_info("sr", T.INT64, []),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 16])],
        initializer=[
            h.make_tensor("rate", T.INT64, [], [threshold]),
            h.make_tensor("scalar_shape", T.INT64, [0], []),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def flag_model() -> onnx.ModelProto:
    """A bool input reaching an If's condition through Not."""
    model = vad_like()
    graph = model.graph
    graph.input[1].CopyFrom(h.make_tensor_value_info("sr", T.BOOL, []))
    del graph.node[:2]
    graph.node.insert(0, h.make_node("Not", ["sr"], ["is_rate"], name="negate"))
    return model


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def test_an_input_compared_for_equality_gets_the_constant(tmp_path):
    src = _save(vad_like(), tmp_path / "vad.onnx")
    report = compare_files(src, src)
    assert report.feeds["sr"].tolist() == 16000 and report.feeds["sr"].dtype == np.int64
    assert report.input_warnings == []
    assert any("16000" in line and "Equal 'is_16k'" in line for line in report.inputs)


@pytest.mark.parametrize("compare", ["Less", "Greater"])
def test_an_input_compared_by_order_warns(tmp_path, compare):
    src = _save(vad_like(compare), tmp_path / "vad.onnx")
    report = compare_files(src, src)
    [warning] = report.input_warnings
    assert "'sr'" in warning and f"{compare} 'is_16k'" in warning and BRANCH_HINT in warning


def test_a_flag_reaching_an_if_warns():
    [(name, use)] = branch_uses(flag_model()).items()
    assert name == "sr" and use.value is None and "If 'choose'" in use.where


def test_an_input_no_branch_depends_on_is_left_alone():
    model = vad_like()
    assert set(branch_uses(model)) == {"sr"}  # not x, which only flows into the branches


def test_the_benchmark_measurement_carries_the_warning(tmp_path):
    src = _save(vad_like("Less"), tmp_path / "vad.onnx")
    m = measure(src, {"same": src}, FakeRuntime(), seconds=0.01)
    assert len(m.warnings) == 1 and "'sr'" in m.warnings[0]
    m = measure(_save(vad_like(), tmp_path / "eq.onnx"), {}, FakeRuntime(), seconds=0.01)
    assert m.warnings == []


def test_tune_reports_the_warning(tmp_path):
    src = _save(vad_like("Greater"), tmp_path / "vad.onnx")
    settings = tuning.SearchSettings(budget_s=60, bench_seconds=0.01)
    result = tuning.tune(src, FakeRuntime(), settings, keep=lambda *a: None)
    assert len(result.warnings) == 1 and "'sr'" in result.warnings[0]
    assert result.to_json()["warnings"] == result.warnings


@pytest.mark.parametrize(
    "args",
    [
        ["optimize", "{src}", "-o", "{out}"],
        ["optimize", "{src}", "-o", "{out}", "--benchmark", "--bench-seconds", "0.2"],
        ["verify", "{src}", "{src}"],
    ],
)
def test_the_cli_prints_the_warning(tmp_path, args):
    src = _save(vad_like("Less"), tmp_path / "vad.onnx")
    argv = [a.format(src=src, out=tmp_path / "out.onnx") for a in args]
    run = subprocess.run(
        [sys.executable, "-m", "opfuse", *argv], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "warning: input 'sr' decides a branch (compared with 16000 by Less" in run.stderr
    if "--benchmark" in args:
        assert run.stderr.count("decides a branch") == 2  # verification and the measurement
