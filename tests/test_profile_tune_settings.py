"""The settings of ``opfuse profile``, ``advise`` and ``tune`` (issue 33): typed objects that
check themselves in the API's terms (``threads=-1: must be 0 or more``), said with the
flag on the command line (``--threads -1: must be 0 or more``); the profiling options
declared once for both commands; the commands reaching the work only through
``opfuse.api``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import opfuse
from helpers import run_cli
from opfuse import api, cli
from opfuse.cli.options import PROFILE_OPTIONS, flag_error
from opfuse.errors import OpfuseError, SettingsError

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threads": -1}, "threads=-1: must be 0 or more"),
        ({"runs": 0}, "runs=0: must be 1 or more"),
        ({"warmup": -2}, "warmup=-2: must be 0 or more"),
        ({"runs": 2.5}, "runs=2.5: expected an int"),
        ({"graph_opt": "off"}, "graph_opt='off': expected one of disable, basic, extended, all"),
        ({"provider": ""}, "provider='': expected an onnxruntime execution provider's name"),
    ],
)
def test_profile_settings_refuse_bad_values_in_the_apis_terms(kwargs, message):
    for settings_type in (opfuse.ProfileSettings, opfuse.AdviseOptions):
        with pytest.raises(SettingsError) as exc:
            settings_type(**kwargs)
        assert str(exc.value) == message
        assert exc.value.field == next(iter(kwargs))


def test_profile_settings_take_good_values_and_advise_options_extend_them():
    settings = opfuse.ProfileSettings(runs=1, warmup=0, threads=0, graph_opt="disable")
    options = opfuse.AdviseOptions.of(settings, target="cpu", top=3)
    assert options.profiling() == settings and options.target == "cpu" and options.top == 3
    assert opfuse.AdviseOptions().profiling() == opfuse.ProfileSettings()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": 0}, "budget=0: must be more than 0"),
        ({"budget": -1.5}, "budget=-1.5: must be more than 0"),
        ({"max_threads": 0}, "max_threads=0: must be 1 or more"),
        ({"rtol": -1}, "rtol=-1: must be a finite number of 0 or more"),
        ({"layout": ["nchw", "nhcw"]}, "layout='nhcw': expected nchw or nhwc"),
        ({"runtimes": ["tvm"]}, "runtimes='tvm': expected some of onnxruntime, openvino"),
        ({"static_shapes": True}, "static_shapes needs input_shape NAME:D0,D1,"),
        (
            {"verify_inputs": "x.npz", "input_shape": {"x": [1, 4]}},
            "input_shape and verify_inputs x.npz both give the input shapes",
        ),
        (
            {"inputs": "x.npz", "input_shape": {"x": [1, 4]}},
            "input_shape and inputs x.npz both give the input shapes",
        ),
        (
            {"inputs": "x.npz", "verify_inputs": "y.npz"},
            "inputs x.npz and verify_inputs both give the input arrays",
        ),
    ],
)
def test_tune_settings_refuse_bad_values_in_the_apis_terms(kwargs, message, tmp_path):
    with pytest.raises(SettingsError, match="^" + message.replace("(", r"\(")):
        opfuse.TuneSettings(**kwargs)
    with pytest.raises(SettingsError, match="^" + message.replace("(", r"\(")):
        opfuse.tune(EXAMPLE, tmp_path / "t.onnx", **kwargs)  # before any work
    assert list(tmp_path.iterdir()) == []


def test_tune_settings_normalize_and_convert_for_the_search():
    settings = opfuse.TuneSettings(budget=3, layout=["nhwc"], runtimes=["onnxruntime"])
    assert settings.layout == ("nhwc",) and settings.runtimes == ("onnxruntime",)
    search = settings.search_settings(opfuse.RuntimeSettings(threads=2, bench_seconds=0.5))
    assert (search.budget_s, search.bench_seconds, search.layouts) == (3, 0.5, ("nhwc",))
    assert search.session_start.intra_op_num_threads == 2 and search.session_search
    # no runtimes: the one measured on
    assert opfuse.TuneSettings().search_settings(opfuse.RuntimeSettings()).runtimes == (
        "onnxruntime",
    )


def test_tune_refuses_a_settings_object_beside_its_keywords(tmp_path):
    with pytest.raises(
        OpfuseError, match=r"^budget=3: give it in the TuneSettings or as a keyword, not both"
    ):
        opfuse.tune(EXAMPLE, tmp_path / "t.onnx", settings=opfuse.TuneSettings(), budget=3)
    with pytest.raises(
        OpfuseError, match=r"^threads=4: give it in the RuntimeSettings or as a keyword"
    ):
        opfuse.tune(
            EXAMPLE, tmp_path / "t.onnx", runtime_settings=opfuse.RuntimeSettings(), threads=4
        )
    with pytest.raises(SettingsError, match="^bench_seconds=0: must be more than 0"):
        opfuse.tune(EXAMPLE, tmp_path / "t.onnx", bench_seconds=0)
    assert list(tmp_path.iterdir()) == []


# -- the command line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["profile", str(EXAMPLE), "--threads", "-1"], "--threads -1: must be 0 or more"),
        (["advise", str(EXAMPLE), "--threads", "-1"], "--threads -1: must be 0 or more"),
        (["advise", str(EXAMPLE), "--warmup", "-1"], "--warmup -1: must be 0 or more"),
        (["tune", str(EXAMPLE), "-o", "OUT", "--budget", "0"], "--budget 0: must be more than 0"),
        (
            ["tune", str(EXAMPLE), "-o", "OUT", "--bench-seconds", "0"],
            "--bench-seconds 0: must be more than 0",
        ),
        (
            ["tune", str(EXAMPLE), "-o", "OUT", "--verify-inputs", "x.npz", "--input-shape", "x:1"],
            "--input-shape and --verify-inputs x.npz both give the input shapes (the .npz "
            "arrays' shapes are used); drop --input-shape",
        ),
        (
            ["tune", str(EXAMPLE), "-o", "OUT", "--inputs", "x.npz", "--input-shape", "x:1"],
            "--input-shape and --inputs x.npz both give the input shapes (the .npz "
            "arrays' shapes are used); drop --input-shape",
        ),
        (
            ["advise", str(EXAMPLE), "--inputs", "x.npz", "--input-shape", "x:1"],
            "--input-shape and --inputs x.npz both give the input shapes (the .npz "
            "arrays' shapes are used); drop --input-shape",
        ),
    ],
)
def test_the_cli_names_the_flag(args, message, monkeypatch, capsys, tmp_path):
    args = [str(tmp_path / "t.onnx") if a == "OUT" else a for a in args]
    status, stderr = run_cli(args, monkeypatch, capsys)
    assert status == 2
    assert stderr.strip() == f"opfuse: error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_flag_error_says_a_value_and_a_flag_with_the_commands_options():
    @click.command()
    @click.option("--max-threads", type=int)
    @click.option("--static-shapes", is_flag=True)
    @click.option("--input-shape", multiple=True)
    def command(**_: Any) -> None: ...

    with click.Context(command):
        said = flag_error(SettingsError("max_threads", 0, "must be 1 or more"))
        assert str(said) == "--max-threads 0: must be 1 or more"
        needs = SettingsError("static_shapes", True, sentence="{static_shapes} needs {input_shape}")
        assert str(flag_error(needs)) == "--static-shapes needs --input-shape"
        other = SettingsError("budget", 0.0, "must be more than 0")  # no option of this command
        assert str(flag_error(other)) == "budget 0: must be more than 0"


def test_profile_and_advise_declare_the_same_profiling_options():
    """One option group: the same flags, types, help and defaults (ProfileSettings'),
    but --graph-opt's default, which is each command's own (profile: all; advise:
    disable, or all for a QDQ model)."""

    def options(command: click.Command) -> dict[str, dict[str, Any]]:
        return {
            p.name: {**p.to_info_dict(), "default": p.default}
            for p in command.params
            if p.name in PROFILE_OPTIONS
        }

    profile, advise = options(cli.profile), options(cli.advise)
    assert set(profile) == set(advise) == set(PROFILE_OPTIONS)
    for name in PROFILE_OPTIONS:
        if name == "graph_opt":
            continue
        assert profile[name] == advise[name], name
    defaults = opfuse.ProfileSettings()
    for field in ("runs", "warmup", "threads", "provider"):
        assert profile[field]["default"] == getattr(defaults, field) == advise[field]["default"]
    assert profile["threads"]["default"] == 1  # as --threads everywhere else
    assert (profile["graph_opt"]["default"], advise["graph_opt"]["default"]) == ("all", None)
    # the order in --help is each command's: the group stays together
    names = [p.name for p in cli.advise.params]
    start = names.index("runs")
    assert names[start : start + len(PROFILE_OPTIONS)] == list(PROFILE_OPTIONS)


class Stop(OpfuseError):
    pass


@pytest.fixture
def calls(monkeypatch) -> dict[str, Any]:
    """opfuse.api's profile, advise and tune replaced: each records its call and stops."""
    seen: dict[str, Any] = {}

    def fake(name: str):  # type: ignore[no-untyped-def]
        def call(*args: Any, **kwargs: Any) -> None:
            seen[name] = (args, kwargs)
            raise Stop(f"{name} reached through opfuse.api")

        return call

    for name in ("profile", "advise", "tune"):
        monkeypatch.setattr(api, name, fake(name))
    return seen


def test_profile_reaches_the_work_through_the_api(calls):
    result = CliRunner().invoke(
        cli.app, ["profile", str(EXAMPLE), "--threads", "3", "--input-shape", "x:1,3,8,8"]
    )
    assert isinstance(result.exception, Stop)
    (model, settings), kwargs = calls["profile"]
    assert model == EXAMPLE and kwargs["top"] == 20
    assert settings == opfuse.ProfileSettings(
        threads=3, graph_opt="all", input_shapes={"x": [1, 3, 8, 8]}
    )


def test_advise_reaches_the_work_through_the_api(calls):
    result = CliRunner().invoke(
        cli.app, ["advise", str(EXAMPLE), "--runs", "4", "--no-trial", "--target", "cpu"]
    )
    assert isinstance(result.exception, Stop)
    (model,), kwargs = calls["advise"]
    options = kwargs["options"]
    assert model == EXAMPLE and isinstance(options, opfuse.AdviseOptions)
    assert options.profiling() == opfuse.ProfileSettings(runs=4, input_shapes={})
    assert (options.target, options.next_steps, options.top) == ("cpu", False, 10)


def test_tune_reaches_the_work_through_the_api(calls, tmp_path):
    out = tmp_path / "t.onnx"
    args = ["tune", str(EXAMPLE), "-o", str(out), "--budget", "7", "--layout", "nhwc"]
    result = CliRunner().invoke(cli.app, [*args, "--threads", "2", "--runtimes", "onnxruntime"])
    assert isinstance(result.exception, Stop)
    (model, output), kwargs = calls["tune"]
    assert (model, output) == (EXAMPLE, out)
    assert kwargs["settings"] == opfuse.TuneSettings(
        budget=7, layout=("nhwc",), runtimes=("onnxruntime",), input_shape={}
    )
    assert kwargs["runtime_settings"] == opfuse.RuntimeSettings(threads=2)


def test_profile_json_is_the_api_reports(tmp_path):
    settings = opfuse.ProfileSettings(runs=1, warmup=0)
    report = opfuse.profile(EXAMPLE, settings, top=2)
    assert isinstance(report, opfuse.ProfileReport) and report.graph_opt == "all"
    data = report.to_json()
    assert set(data) == {
        "nodes", "graph_opt", "runs", "warmup", "total_us", "inputs", "inputs_fed",
        "op_statistic", "top_nodes",
    }  # fmt: skip
    assert data["runs"] == 1 and len(data["top_nodes"]) == 2
    assert data["inputs_fed"]["shapes"] == {"input": [1, 3, 32, 32]}
    assert data["inputs_fed"]["generated"] is True
    json.dumps(data)


def test_the_settings_and_reports_are_exported_from_opfuse():
    for name in (
        "AdviceReport",
        "AdviseOptions",
        "ProfileReport",
        "ProfileSettings",
        "RuntimeSettings",
        "SettingsError",
        "TuneResult",
        "TuneSettings",
        "profile",
        "advise",
        "tune",
    ):
        assert name in opfuse.__all__ and getattr(opfuse, name) is getattr(api, name), name
    assert opfuse.profile.__module__ == opfuse.advise.__module__ == "opfuse.api"
    assert dataclasses.is_dataclass(opfuse.TuneSettings) and dataclasses.is_dataclass(
        opfuse.ProfileSettings
    )
    from opfuse.advisor.report_types import AdviceReport

    assert opfuse.AdviceReport is AdviceReport


def test_advise_help_names_the_schema_the_json_has():
    from opfuse.advisor.sections import SCHEMA

    out = CliRunner().invoke(cli.app, ["advise", "--help"], terminal_width=200).output
    assert f"schema {SCHEMA}" in " ".join(out.split())
