"""Next steps: each suggested command is measured with the runtime given (here the fake one:
a cost per op type, its clock advanced only by runs), and running the command as printed
reproduces its ratio."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from advisor_models import make_model
from click.testing import CliRunner
from onnx import helper

from opfuse.advisor.conductor import AdviseOptions, advise
from opfuse.advisor.nextsteps import NO_CHANGE, dominant, same_nodes
from opfuse.cli import app
from opfuse.runtime.fake import FakeRuntime

N = helper.make_node
COST = {"Transpose": 30.0, "Conv": 50.0, "Relu": 5.0}


def fake() -> FakeRuntime:
    return FakeRuntime(COST, default=2.0)


def cost(path: Path) -> float:
    return fake().latency(path)


def nhwc_model() -> onnx.ModelProto:
    """An NHWC image input: Transpose to NCHW -> Conv -> Relu -> output."""
    inits = {"W": np.random.default_rng(0).standard_normal((8, 3, 1, 1)).astype(np.float32)}
    nodes = [
        N("Transpose", ["x"], ["t"], name="to_nchw", perm=[0, 3, 1, 2]),
        N("Conv", ["t", "W"], ["c"], name="conv"),
        N("Relu", ["c"], ["y"], name="relu"),
    ]
    return make_model(nodes, {"x": [1, 6, 6, 3]}, {"y": [1, 8, 6, 6]}, inits)


def test_suggested_commands_reproduce_their_ratio(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "nhwc.onnx"
    onnx.save(nhwc_model(), model)
    options = AdviseOptions(runs=1, warmup=0, runtime=fake(), compare_onnxruntime=False)
    report = advise(model, options=options)
    steps = report["next_steps"]
    assert steps["skipped"] is None
    commands = {tuple(c["flags"]): c for c in steps["commands"]}
    assert ("--layout", "nchw") in commands and () in commands
    layout = commands[("--layout", "nchw")]
    assert layout["ratio"] == pytest.approx(55 / 85, abs=1e-4) and layout["helps"] is True
    assert "Transpose -1" in layout["effect"]
    # the default passes change no node of it: not measured, not recommended
    assert commands[()]["effect"] == NO_CHANGE and commands[()]["helps"] is False
    assert commands[()]["ratio"] is None and commands[()]["runs"] == 0
    assert steps["commands"][0] is layout  # the best first
    assert steps["helps"] is True
    monkeypatch.chdir(tmp_path)
    for c in steps["commands"]:  # run as printed
        if c["effect"] == NO_CHANGE:
            continue
        args = shlex.split(c["command"])
        assert args[:2] == ["opfuse", "optimize"]
        result = CliRunner().invoke(app, args[1:])
        assert result.exit_code == 0, result.output
        out = tmp_path / args[args.index("-o") + 1]
        assert cost(out) / cost(model) == pytest.approx(c["ratio"], abs=1e-4)


def test_nothing_helps_names_the_dominant_ops(tmp_path) -> None:  # type: ignore[no-untyped-def]
    inits = {"W": np.ones((8, 8, 1, 1), np.float32)}
    nodes = [N("Conv", ["x", "W"], ["c"], name="conv"), N("Relu", ["c"], ["y"], name="relu")]
    model = tmp_path / "plain.onnx"
    onnx.save(make_model(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]}, inits), model)
    options = AdviseOptions(runs=1, warmup=0, runtime=fake(), compare_onnxruntime=False)
    steps = advise(model, options=options)["next_steps"]
    assert [c["flags"] for c in steps["commands"]] == [[]]
    assert steps["helps"] is False
    assert steps["dominant"] and steps["dominant"][0]["suggestion"]


def test_a_command_that_changes_no_node_is_never_recommended(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 41: advise recommended (in green) an ``opfuse optimize`` that changed no node,
    on a timing of two identical files. A runtime on which the model's second session runs
    faster than its first would have called the copy faster: it is not measured at all, and
    the report says why in text, HTML and JSON."""
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_html, render_text
    from opfuse.model import io
    from opfuse.runtime.fake import OrderEffects

    inits = {"W": np.ones((8, 8, 1, 1), np.float32)}
    nodes = [N("Conv", ["x", "W"], ["c"], name="conv"), N("Relu", ["c"], ["y"], name="relu")]
    model = tmp_path / "plain.onnx"
    onnx.save(make_model(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]}, inits), model)
    runtime = FakeRuntime(COST, default=2.0, effects=OrderEffects(slow_first=1, slow_by=1.3))
    options = AdviseOptions(runs=1, warmup=0, runtime=runtime, compare_onnxruntime=False)
    report = advise(model, options=options)
    steps = report["next_steps"]
    [default] = steps["commands"]
    assert default["effect"] == NO_CHANGE and default["ratio"] is None
    assert default["helps"] is False and default["runs"] == 0 and default["error"] is None
    assert steps["helps"] is False and runtime.loaded == []  # nothing timed
    buf = StringIO()
    render_text(report, Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    section = text[text.index("====Next steps====") : text.index("====UBModel====")]
    assert "changes no node of this model, nothing to recommend" in section
    assert "-o " not in section and "x time" not in section  # no command to run
    assert "Nothing opfuse does makes this model faster here" in section
    page = render_html(report)
    assert "changes no node of this model, nothing to recommend" in page
    assert 'class="good"' not in page[page.index("Next steps") : page.index("UBModel")]
    # the comparison is of what the nodes compute, not of their names or order
    a = io.read_model(model)
    b = io.read_model(model)
    b.graph.node(0).name = "renamed"
    assert same_nodes(a, b)
    b.graph.node(1).op_type = "Sigmoid"
    assert not same_nodes(a, b)


def test_dominant_ops_get_the_guides_suggestion() -> None:
    stats = [
        {"op_type": "Gemm", "share": 0.46},
        {"op_type": "Reshape", "share": 0.2},
        {"op_type": "Add", "share": 0.05},
    ]
    rows = dominant(stats)
    assert [r["op_type"] for r in rows] == ["Gemm", "Reshape"]
    assert "quantize" in str(rows[0]["suggestion"])


def test_op_summary_skips_the_trial(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from advisor_models import FIXTURES

    steps = advise(None, op_summary=FIXTURES / "op_summary_0_1.csv")["next_steps"]
    assert steps["skipped"] == "no model given" and steps["commands"] == []


def test_opset_upgrade_is_suggested_where_a_pass_needs_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An erf GELU at opset 17: --target-opset 20 lets GeluFusionPass fuse it."""
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((8, 8)).astype(np.float32),
        "sqrt2": np.array(1.4142135, np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        N("MatMul", ["x", "W"], ["h"], name="mm"),
        N("Div", ["h", "sqrt2"], ["d"], name="div"),
        N("Erf", ["d"], ["e"], name="erf"),
        N("Add", ["e", "one"], ["p"], name="add1"),
        N("Mul", ["h", "p"], ["m"], name="mul"),
        N("Mul", ["m", "half"], ["y"], name="half"),
    ]
    model = tmp_path / "gelu.onnx"
    onnx.save(make_model(nodes, {"x": [2, 8]}, {"y": [2, 8]}, inits), model)
    options = AdviseOptions(runs=1, warmup=0, runtime=fake(), compare_onnxruntime=False)
    report = advise(model, options=options)
    (group,) = report["ub_fusion"]
    assert group["activations"][0]["name"] == "GELU"
    commands = {tuple(c["flags"]): c for c in report["next_steps"]["commands"]}
    upgrade = commands[("--target-opset", "20")]
    assert "GeluFusionPass: 1 matches" in upgrade["why"]
    assert "Gelu +1" in upgrade["effect"] and upgrade["helps"] is True
    assert upgrade["ratio"] == pytest.approx((50.0 * 0 + 2.0 * 2) / (2.0 * 6), abs=1e-4)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(upgrade["command"])  # run as printed: the same graph, the same ratio
    result = CliRunner().invoke(app, args[1:])
    assert result.exit_code == 0, result.output
    out = tmp_path / args[args.index("-o") + 1]
    assert cost(out) / cost(model) == pytest.approx(upgrade["ratio"], abs=1e-4)


def test_first_screen_has_next_steps_and_the_groups_the_runtime_does_not_fuse(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """swish_net on the cpu target: onnxruntime fuses Conv+Relu itself, not the Conv+SiLU;
    the text report shows Next steps, then the unfused group with its share, and counts
    the fused one in one line after it."""
    from io import StringIO

    from advisor_models import swish_net
    from rich.console import Console

    from opfuse.advisor.render import render_text

    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    options = AdviseOptions(runs=2, warmup=1, runtime=fake())
    report = advise(model, options=options)
    fuses = [g["onnxruntime"]["fuses"] for g in report["ub_fusion"]]
    # ranked by time the fused Conv+Relu (55 us) comes before GlobalAveragePool+Add+Relu
    # (12 us); it is listed after every group onnxruntime does not fuse
    assert fuses[-1] == "yes" and "yes" not in fuses[:-1]
    assert report["ub_fusion"][-1]["fusion_type"] == "Conv+Relu"
    buf = StringIO()
    render_text(report, Console(file=buf, width=300, color_system=None), top=3)
    lines = buf.getvalue().splitlines()
    steps = lines.index("====Next steps====")
    ub = lines.index("====UBModel====")
    assert steps < ub < 30  # both on the first screen
    # no pass changes swish_net: said, and no command to run
    assert lines[steps + 1] == (
        "  opfuse optimize (opfuse's default passes): changes no node of this model, "
        "nothing to recommend"
    )
    listed = [ln for ln in lines if ln.startswith("Fusion Type: ")]
    unfused = [g for g in report["ub_fusion"] if g["onnxruntime"]["fuses"] != "yes"]
    assert len(listed) == len(unfused) and "% of the time)" in listed[0]
    assert any("group(s) onnxruntime already runs as one kernel" in ln for ln in lines)


def hardswish_written_out(blocks: int = 2) -> onnx.ModelProto:
    """Conv -> x * HardSigmoid(x) per block, at opset 13: HardSwishFusionPass folds each
    pair into one HardSwish only with --target-opset 14."""
    rng = np.random.default_rng(0)
    inits, nodes, x = {}, [], "x"
    for i in range(blocks):
        inits[f"W{i}"] = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
        nodes += [
            N("Conv", [x, f"W{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            N("HardSigmoid", [f"c{i}"], [f"h{i}"], name=f"hsig{i}", alpha=1 / 6, beta=0.5),
            N("Mul", [f"c{i}", f"h{i}"], [f"m{i}"], name=f"hmul{i}"),
        ]
        x = f"m{i}"
    return make_model(nodes, {"x": [1, 8, 8, 8]}, {x: [1, 8, 8, 8]}, inits, opset=13)


def test_a_group_a_next_step_fuses_is_labelled_with_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One truth per report: --target-opset 14 makes the HardSwish groups one op, so the
    groups name that command (measured), not "no pass"; without the trial, no label."""
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_html, render_text

    model = tmp_path / "hsw.onnx"
    onnx.save(hardswish_written_out(), model)
    costs = FakeRuntime({"HardSigmoid": 20.0, "Mul": 20.0, "HardSwish": 10.0}, default=2.0)
    options = AdviseOptions(runs=1, warmup=0, runtime=costs, compare_onnxruntime=False)
    report = advise(model, options=options)
    opset = next(c for c in report["next_steps"]["commands"] if "--target-opset" in c["flags"])
    assert opset["flags"] == ["--target-opset", "14"] and opset["helps"] is True
    assert report["ub_fusion"]
    for g in report["ub_fusion"]:
        assert g["next_step"] == {
            "command": opset["command"],
            "ratio": opset["ratio"],
            "helps": True,
        }
        assert g["opfuse"]["pass"] == "HardSwishFusionPass" and g["opfuse"]["fires"] is True
    buf = StringIO()
    render_text(report, Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    assert f"HardSwishFusionPass fuses it with Next steps' {opset['command']}" in text
    assert "opfuse: no pass" not in text
    assert "fuses it with Next steps&#x27;" in render_html(report)
    # without the trial there is no measured command to name
    quiet = AdviseOptions(runs=1, warmup=0, next_steps=False, compare_onnxruntime=False)
    for g in advise(model, options=quiet)["ub_fusion"]:
        assert g["next_step"] is None and g["opfuse"]["pass"] is None
