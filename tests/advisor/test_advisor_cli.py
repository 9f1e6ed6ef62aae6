"""`opfuse profile` and `opfuse advise` from the command line."""

from __future__ import annotations

import json

import onnx
import pytest
from advisor_models import FIXTURES, swish_net
from click.testing import CliRunner

from opfuse.cli import app
from opfuse.errors import OpfuseError


def test_profile_prints_op_statistic_and_writes_the_profile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(model),
            "--runs",
            "3",
            "--warmup",
            "1",
            "--graph-opt",
            "disable",
            "-o",
            str(out),
            "--top",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    # per run, as advise's table of the same name
    assert "Op Statistic (per run, each node's median over the runs)" in result.output
    assert "Top 3 slow nodes (per run)" in result.output
    for op in ("Conv", "Sigmoid", "GlobalAveragePool"):
        assert op in result.output
    again = tmp_path / "again.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(model),
            "--runs",
            "2",
            "--warmup",
            "0",
            "--format",
            "json",
            "-o",
            str(again),
        ],
    )
    stats = json.loads(result.output)
    # advise reads the same profile into the same per-run Op Statistic
    result = CliRunner().invoke(
        app, ["advise", str(model), "--profile", str(again), "--warmup", "0", "--format", "json"]
    )
    advised = {s["op_type"]: s for s in json.loads(result.output)["op_statistic"]}
    for s in stats["op_statistic"]:
        assert advised[s["op_type"]]["count"] == s["count"]
        assert advised[s["op_type"]]["total_us"] == pytest.approx(s["total_us"], abs=1e-3)
    conv = next(s for s in stats["op_statistic"] if s["op_type"] == "Conv")
    assert conv["count"] == 2  # two Conv nodes, per run
    assert conv["mean_us"] == pytest.approx(conv["total_us"] / 2)
    slowest = stats["top_nodes"][0]
    assert slowest["count"] == 1 and slowest["total_us"] == pytest.approx(slowest["mean_us"])
    assert stats["total_us"] == pytest.approx(sum(s["total_us"] for s in stats["op_statistic"]))
    events = json.loads(out.read_text())
    assert sum(e.get("name") == "model_run" for e in events) == 4  # warm-up kept in the file
    # the written profile is read back by advise, the warm-up run dropped again
    result = CliRunner().invoke(
        app, ["advise", str(model), "--profile", str(out), "--warmup", "1", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["profile"]["runs"] == 3 and report["profile"]["unmapped_us"] == 0
    assert "Conv+Sigmoid+Mul" in {g["fusion_type"] for g in report["ub_fusion"]}
    # the same profile gives the same per-run Op Statistic in both commands
    result = CliRunner().invoke(app, ["advise", str(model), "--profile", str(out), "--warmup", "1"])
    assert "Op Statistic (per run, each node's median over the runs)" in result.output


def test_advise_writes_text_json_and_html(tmp_path) -> None:  # type: ignore[no-untyped-def]
    csv = FIXTURES / "op_summary_0_1.csv"
    for fmt, name in (("text", "r.txt"), ("json", "r.json"), ("html", "r.html")):
        out = tmp_path / name
        result = CliRunner().invoke(
            app, ["advise", "--op-summary", str(csv), "--format", fmt, "-o", str(out)]
        )
        assert result.exit_code == 0, result.output
        assert result.output == ""  # the report went to the file
        text = out.read_text()
        if fmt == "json":
            assert json.loads(text)["schema"] == "opfuse.advise/2"
        elif fmt == "html":
            assert text.startswith("<!DOCTYPE html>") and "<svg" in text
        else:
            assert "====UBModel====" in text and "====L2Model====" in text


def test_advise_errors_are_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = CliRunner()
    result = runner.invoke(app, ["advise"], standalone_mode=False)
    assert "give a MODEL" in str(result.exception)
    result = runner.invoke(
        app,
        ["advise", "--op-summary", str(FIXTURES / "op_summary_0_1.csv"), "--target", "tpu"],
        standalone_mode=False,
    )
    assert "unknown; built-in targets are ascend310, cpu, cuda" in str(result.exception)


def test_profile_rejects_a_missing_provider(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    result = CliRunner().invoke(
        app,
        ["profile", str(model), "--provider", "NoSuchExecutionProvider"],
        standalone_mode=False,
    )
    assert "--provider NoSuchExecutionProvider: not available here" in str(result.exception)


def test_the_profile_function_gives_what_the_command_prints(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``opfuse profile --format json`` is the JSON of ``opfuse.profile``."""
    from opfuse import ProfileSettings, profile

    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    report = profile(model, ProfileSettings(runs=2, warmup=1, graph_opt="disable"), top=3)
    data = report.to_json()
    assert data["nodes"] == len(swish_net().graph.node) and data["runs"] == 2
    assert len(data["top_nodes"]) == 3 and set(report.originals) == {r.name for r in report.slow}
    assert {r["name"]: r["nodes"] for r in data["top_nodes"]} == {
        r.name: [r.name] for r in report.slow
    }  # at ORT_DISABLE_ALL every profiled name is the model's node
    args = ["profile", str(model), "--runs", "2", "--warmup", "1", "--graph-opt", "disable"]
    printed = json.loads(CliRunner().invoke(app, [*args, "--top", "3", "--format", "json"]).output)
    assert printed.keys() == data.keys() and printed["nodes"] == data["nodes"]
    # the same op types (their order is by measured time, which differs between runs)
    assert sorted(s["op_type"] for s in printed["op_statistic"]) == sorted(
        s["op_type"] for s in data["op_statistic"]
    )


def test_profile_maps_fused_kernel_names_to_the_models_nodes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """At ORT_ENABLE_ALL onnxruntime names kernels after tensors (``c1_nchwc``) or fusions
    (``mul1/QuickGeluFusion/``); the original node(s) column names the model's nodes."""
    model = tmp_path / "swish.onnx"
    proto = swish_net()
    onnx.save(proto, model)
    names = [n.name for n in proto.graph.node]
    args = ["profile", str(model), "--runs", "2", "--warmup", "1", "--graph-opt", "all"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    kernels = {r["name"]: r for r in json.loads(result.output)["top_nodes"]}
    assert set(kernels) - set(names), "onnxruntime fused something"
    # every node once, nothing invented (a layout reorder names the node it converts)
    covered = [n for r in kernels.values() if "Reorder" not in r["op_type"] for n in r["nodes"]]
    assert sorted(covered) == sorted(names)
    assert all(len(r["nodes"]) == 1 for r in kernels.values() if "Reorder" in r["op_type"])
    for r in kernels.values():
        if r["op_type"] == "QuickGelu":
            assert r["nodes"] == ["sig1", "mul1"]
        if "relu2" in r["nodes"]:  # Conv + Relu run as one kernel
            assert r["nodes"] == ["conv2", "relu2"]
    result = CliRunner().invoke(app, args)
    assert "Original Node(s)" in result.output and "conv2, relu2" in result.output


@pytest.mark.parametrize("command", ["profile", "advise"])
@pytest.mark.parametrize("output", ["nowhere/r.json", "model"])
def test_a_bad_output_fails_before_profiling(tmp_path, monkeypatch, command, output) -> None:  # type: ignore[no-untyped-def]
    """-o is checked before the model runs (it used to fail, or replace the model,
    only after the whole profiling run)."""
    import opfuse.advisor.conductor
    import opfuse.advisor.profile_readers
    import opfuse.advisor.profile_report

    def profiled(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("profiled before checking -o")

    monkeypatch.setattr(opfuse.advisor.profile_readers, "run_onnxruntime", profiled)
    monkeypatch.setattr(opfuse.advisor.conductor, "run_onnxruntime", profiled)
    monkeypatch.setattr(opfuse.advisor.profile_report, "run_onnxruntime", profiled)
    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    before = model.read_bytes()
    target = model if output == "model" else tmp_path / output
    result = CliRunner().invoke(app, [command, str(model), "-o", str(target)])
    assert result.exit_code != 0
    assert isinstance(result.exception, OpfuseError), result.exception
    message = str(result.exception)
    assert ("is the input model" if output == "model" else "does not exist") in message
    assert model.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swish.onnx"]


def test_profile_and_advise_write_their_files_atomically(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An existing report is replaced whole, and no temporary file is left."""
    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    prof, report = tmp_path / "p.json", tmp_path / "r.json"
    for path in (prof, report):
        path.write_text("old")
    args = ["--runs", "1", "--warmup", "0"]
    result = CliRunner().invoke(app, ["profile", str(model), *args, "-o", str(prof)])
    assert result.exit_code == 0, result.output
    assert any(e.get("name") == "model_run" for e in json.loads(prof.read_text()))
    result = CliRunner().invoke(
        app, ["advise", str(model), "--profile", str(prof), "--format", "json", "-o", str(report)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["schema"] == "opfuse.advise/2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "r.json", "swish.onnx"]


def test_narrow_tables_drop_constant_and_repeated_columns():
    from opfuse.advisor.profile_report import fit_columns

    columns = ("Op Name", "Count", "Total", "Avg", "Provider")
    rows = [("a", "1", "5.0", "5.0", "CPU"), ("b", "1", "3.0", "3.0", "CPU")]
    shown, cells, same = fit_columns(columns, rows, width=20, keep=("Op Name", "Total"))
    assert shown == ["Op Name", "Total"] and cells == [["a", "5.0"], ["b", "3.0"]]
    assert same == "Count 1, Provider CPU"
    assert fit_columns(columns, rows, width=200)[0] == list(columns)  # it fits: all of it


def test_advise_prints_the_input_shapes_it_profiled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every per-op figure depends on the input shapes: the report says which, that they
    were generated, and for a dynamic dim opfuse chose what to give instead (text, JSON,
    HTML); a static model, or a size given, gets no hint."""
    from advisor_models import make_model
    from onnx import helper

    n = helper.make_node
    dynamic = make_model(
        [n("Relu", ["x"], ["y"], name="relu")], {"x": ["N", 3, 4]}, {"y": ["N", 3, 4]}
    )
    path = tmp_path / "dyn.onnx"
    onnx.save(dynamic, path)
    base = ["advise", str(path), "--runs", "1", "--warmup", "0", "--no-trial"]
    result = CliRunner().invoke(app, [*base, "--format", "json"])
    assert result.exit_code == 0, result.output
    prof = json.loads(result.output)["profile"]
    assert prof["inputs"] == [
        {"name": "x", "shape": [1, 3, 4], "declared": ["N", 3, 4], "dynamic": True}
    ]
    hint = "--inputs samples.npz, or --input-shape x:N,3,4 with your sizes"
    assert prof["input_shape_hint"] == hint  # the dims to choose, not the toy shape
    assert prof["inputs_fed"]["generated"] is True
    assert prof["inputs_fed"]["shapes"] == {"x": [1, 3, 4]}
    text = CliRunner().invoke(app, base, env={"COLUMNS": "300"}).output
    assert "inputs profiled: x [1, 3, 4] (declared [N, 3, 4]), generated (seed 0)" in text
    assert hint in text
    page = CliRunner().invoke(app, [*base, "--format", "html"]).output
    assert "inputs profiled: x [1, 3, 4]" in page and hint in page
    # the shape given is the one profiled, with no hint
    given = CliRunner().invoke(app, [*base, "--input-shape", "x:2,3,4", "--format", "json"])
    assert json.loads(given.output)["profile"]["inputs"][0]["shape"] == [2, 3, 4]
    assert json.loads(given.output)["profile"]["input_shape_hint"] is None
    static = tmp_path / "static.onnx"
    onnx.save(make_model([n("Relu", ["x"], ["y"], name="r")], {"x": [1, 3]}, {"y": [1, 3]}), static)
    text = (
        CliRunner()
        .invoke(app, ["advise", str(static), "--runs", "1", "--warmup", "0", "--no-trial"])
        .output
    )
    assert "inputs profiled: x [1, 3]" in text and "--input-shape" not in text


# msadvisor's records: one line each whatever the width (everything else folds)
RECORDS = ("Fusion Type: ", "Op Name: ")


def widths(output: str) -> int:
    """The widest line that is not one of msadvisor's records."""
    lines = [line for line in output.splitlines() if not line.startswith(RECORDS)]
    return max((len(line) for line in lines), default=0)


def records(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(RECORDS)]


@pytest.mark.parametrize("columns", ["100", "72", None])
def test_output_fits_the_columns(tmp_path, columns) -> None:  # type: ignore[no-untyped-def]
    """COLUMNS is honoured off a terminal (CliRunner's output is not one); without it the
    width is 100. Long node names and the passes' summaries fold, never run over."""
    from advisor_models import long_chain_net, long_chain_target, ort_profile, write_json

    limit = int(columns or 100)
    env = {"COLUMNS": columns}  # None: unset
    for args in (["passes"], ["passes", "--verbose"]):
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 0 and widths(result.output) <= limit, args
        assert "ConvBatchNormFusionPass" in result.output
    model = long_chain_net()
    path = tmp_path / "long.onnx"
    onnx.save(model, path)
    times = {x.name: (x.op_type, 10.0 + i) for i, x in enumerate(model.graph.node)}
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=2))
    target = long_chain_target(tmp_path / "wide.json")
    args = ["advise", str(path), "--profile", str(prof), "--target", str(target), "--no-trial"]
    result = CliRunner().invoke(app, [*args, "--warmup", "1"], env=env)
    assert result.exit_code == 0, result.output
    assert widths(result.output) <= limit
    assert "/backbone/stage3/block.12/expand/activation/Conv_output_0_conv" in "".join(
        result.output.split()
    )  # folded, whole
    out = tmp_path / "report.txt"
    result = CliRunner().invoke(app, [*args, "--warmup", "1", "-o", str(out)], env=env)
    assert result.exit_code == 0 and widths(out.read_text()) <= limit


@pytest.mark.parametrize("columns", ["40", "72", None])
def test_msadvisor_records_stay_one_line_at_any_width(tmp_path, columns) -> None:  # type: ignore[no-untyped-def]
    """``opfuse advise model.onnx > report.txt`` (no terminal: 100 columns, or COLUMNS) and
    ``-o report.txt``: each ``Fusion Type: ...; Fusion Operator Detail: ...; Fusion
    Operator Duration: ...;`` record and each L2 ``Op Name: ...;`` record is one line, as
    msadvisor prints them and users grep them; the prose around them still folds."""
    from advisor_models import long_chain_net, long_chain_target, ort_profile, write_json

    model = long_chain_net()
    path = tmp_path / "long.onnx"
    onnx.save(model, path)
    times = {x.name: (x.op_type, 10.0 + i) for i, x in enumerate(model.graph.node)}
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=2))
    target = long_chain_target(tmp_path / "wide.json")
    env = {"COLUMNS": columns}
    base = ["advise", str(path), "--profile", str(prof), "--target", str(target), "--no-trial"]
    out = tmp_path / "report.txt"
    for args, text in (
        (base, lambda r: r.output),
        ([*base, "-o", str(out)], lambda r: out.read_text()),
        (["advise", "--op-summary", str(FIXTURES / "op_summary_0_1.csv")], lambda r: r.output),
    ):
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
        report = text(result)
        found = records(report)
        assert any(line.startswith("Fusion Type: ") for line in found), report
        for line in found:
            assert line.rstrip().endswith(";") or line.endswith("of the time)"), line
            if line.startswith("Fusion Type: "):
                assert "; Fusion Operator Detail: " in line, line
                assert "; Fusion Operator Duration: " in line, line
        assert max(map(len, found)) > int(columns or 100)  # wider than the page, unbroken
        assert widths(report) <= int(columns or 100)
        if "op_summary" in args[-1]:
            assert any(line.startswith("Op Name: ") for line in found)
            assert all("; mte3_ratio: " in line for line in found if "Op Name" in line)
