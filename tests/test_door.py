"""One door (issue 33): the settings objects check themselves and speak the API's terms,
the command line says their refusals with its flags, the commands reach the engine only
through ``opfuse.api``, and every type the API takes or returns is exported."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import opfuse
from opfuse import api
from opfuse.batching.jobs import Job, TaskOptions
from opfuse.batching.runner import BatchRecords, BatchRun
from opfuse.cli import app
from opfuse.errors import OpfuseError, SettingsError
from opfuse.pipeline import conductor as pipeline
from opfuse.pipeline.settings import OptimizeSettings
from opfuse.runtime.settings import RuntimeSettings
from opfuse.verification.settings import VerifySettings

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"
SHAPES_BOTH = (
    "input_shape and verify_inputs in.npz both give the input shapes (the .npz arrays' "
    "shapes are used); drop input_shape"
)


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (
            lambda: RuntimeSettings(bench_seconds=0),
            "bench_seconds",
            "bench_seconds=0: must be more than 0",
        ),
        (
            lambda: RuntimeSettings(bench_seconds=-1.5),
            "bench_seconds",
            "bench_seconds=-1.5: must be more than 0",
        ),
        (
            lambda: OptimizeSettings(fold_size_limit=-1),
            "fold_size_limit",
            "fold_size_limit=-1: must be 0 or more",
        ),
        (
            lambda: OptimizeSettings(layout="nhcw"),
            "layout",
            "layout='nhcw': expected one of keep, nchw, nhwc",
        ),
        (
            lambda: OptimizeSettings(target="tpu"),
            "target",
            "target='tpu': unknown; the known targets are",
        ),
        (
            lambda: VerifySettings(rtol=-1.0),
            "rtol",
            "rtol=-1: must be a finite number of 0 or more",
        ),
        (
            lambda: VerifySettings(atol=float("nan")),
            "atol",
            "atol=nan: must be a finite number of 0 or more",
        ),
        (
            lambda: VerifySettings(input_shape={"x": [1, 4]}, verify_inputs="in.npz"),
            "verify_inputs",
            SHAPES_BOTH,
        ),
    ],
)
def test_settings_refuse_a_value_in_the_apis_terms(make, field, message):
    with pytest.raises(SettingsError) as exc:
        make()
    assert exc.value.field == field
    assert str(exc.value).startswith(message)
    assert "--" not in str(exc.value)  # the API's keyword, not a flag
    assert isinstance(exc.value, OpfuseError) and exc.value.exit_code == 2


def test_settings_accept_the_values_next_to_the_refused_ones():
    assert RuntimeSettings(bench_seconds=0.01).bench_seconds == 0.01
    graph = OptimizeSettings(
        fold_size_limit=0, layout="nhwc", target="cpu", enable="GeluFusionPass"
    )
    assert graph.enable == ("GeluFusionPass",)  # one name, not its letters
    assert graph.options().fold_size_limit == 0 and graph.options().keep_inputs is None
    checks = VerifySettings(input_shape={"x": (np.int64(1), 4)})
    assert checks.shapes == {"x": [1, 4]} and checks.verify_inputs is None
    assert VerifySettings(verify_inputs="in.npz").shapes == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.layout = "keep"  # type: ignore[misc]


def test_a_keyword_beside_the_settings_object_that_holds_it_is_refused():
    with pytest.raises(SettingsError, match="rtol=0.001: give it in the VerifySettings"):
        opfuse.optimize(EXAMPLE, rtol=1e-3, verify_settings=VerifySettings())
    with pytest.raises(SettingsError, match="layout='nchw': give it in the OptimizeSettings"):
        opfuse.optimize(EXAMPLE, layout="nchw", optimize_settings=OptimizeSettings())
    with pytest.raises(OpfuseError, match="expected VerifySettings, got dict"):
        opfuse.verify(EXAMPLE, EXAMPLE, verify_settings={"rtol": 1})  # type: ignore[arg-type]


def test_the_api_says_a_check_between_two_settings_with_its_keywords(tmp_path):
    with pytest.raises(SettingsError) as exc:
        opfuse.optimize(EXAMPLE, static_shapes=True)
    assert str(exc.value) == "static_shapes needs input_shape NAME:D0,D1,... for the inputs"


def test_settings_objects_give_what_the_keywords_give(tmp_path):
    by_keywords = opfuse.optimize(EXAMPLE, disable=["ConvBatchNormFusionPass"], seed=2)
    by_settings = opfuse.optimize(
        EXAMPLE,
        optimize_settings=OptimizeSettings(disable=["ConvBatchNormFusionPass"]),
        verify_settings=VerifySettings(seed=2),
    )
    assert by_settings.after == by_keywords.after
    assert by_settings.verify is not None and by_keywords.verify is not None
    assert by_settings.verify.seed == by_keywords.verify.seed == 2


def cli(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fold-size-limit", "-1"], "--fold-size-limit -1: must be 0 or more"),
        (["--benchmark", "--bench-seconds", "0"], "--bench-seconds 0: must be more than 0"),
        (["--static-shapes"], "--static-shapes needs --input-shape NAME:D0,D1,... for the inputs"),
        (
            ["--input-shape", "input:1,3,32,32", "--verify-inputs", "{d}/in.npz"],
            "--input-shape and --verify-inputs {d}/in.npz both give the input shapes",
        ),
    ],
)
def test_the_command_line_names_the_flag(tmp_path, args, message):
    out = tmp_path / "o.onnx"
    args = [a.format(d=tmp_path) for a in args]
    result = cli("optimize", EXAMPLE, "-o", out, *args)
    assert isinstance(result.exception, OpfuseError)
    assert not isinstance(result.exception, SettingsError)  # said with the flag
    assert str(result.exception).startswith(message.format(d=tmp_path))
    assert not out.exists()


def test_batch_and_verify_name_the_flag_too(tmp_path):
    result = cli("batch", EXAMPLE, "-o", tmp_path / "out", "--fold-size-limit", "-2")
    assert str(result.exception) == "--fold-size-limit -2: must be 0 or more"
    npz = tmp_path / "in.npz"
    result = cli("verify", EXAMPLE, EXAMPLE, "--verify-inputs", npz, "--input-shape", "x:1")
    assert str(result.exception).startswith(f"--input-shape and --verify-inputs {npz} both")
    assert not (tmp_path / "out").exists()


def test_flag_error_keeps_the_apis_name_for_a_setting_the_command_lacks():
    from opfuse.cli.options import flag_error

    exc = SettingsError("static_shapes", True, sentence="{static_shapes} needs {seed}")
    assert str(flag_error(exc)) == "static_shapes needs seed"  # no command running


def test_optimize_reaches_the_engine_only_through_the_api(tmp_path, monkeypatch):
    """The command calls opfuse.api.optimize, which calls the pipeline: the pipeline is
    never called from outside it, and with the settings objects the flags made."""
    inside: list[bool] = []
    calls: list[dict[str, Any]] = []
    real_api, real_file = api.optimize, pipeline.optimize_file

    def through_api(*args: Any, **kwargs: Any) -> Any:
        inside.append(True)
        try:
            return real_api(*args, **kwargs)
        finally:
            inside.pop()

    def engine(*args: Any, **kwargs: Any) -> Any:
        assert inside, "the pipeline was called from outside opfuse.api"
        calls.append(kwargs)
        return real_file(*args, **kwargs)

    from_api = real_api(EXAMPLE, disable=["ConvBatchNormFusionPass"], seed=3).to_json()
    monkeypatch.setattr(api, "optimize", through_api)
    monkeypatch.setattr(pipeline, "optimize_file", engine)
    out = tmp_path / "o.onnx"
    args = ["--disable", "ConvBatchNormFusionPass", "--seed", "3", "--format", "json"]
    result = cli("optimize", EXAMPLE, "-o", out, *args)
    assert result.exit_code == 0, result.output
    (kwargs,) = calls
    assert kwargs["settings"] == OptimizeSettings(disable=("ConvBatchNormFusionPass",))
    assert kwargs["verifier"] == VerifySettings(seed=3)
    from_cli = json.loads(result.stdout)
    for data in (from_cli, from_api):  # the measured times, and where it was written
        for key in ("timings", "seconds", "pass_seconds", "output"):
            data.pop(key, None)
    assert from_cli == from_api


def test_verify_goes_through_the_api_and_saves_the_failing_inputs(tmp_path, monkeypatch):
    broken = onnx.load(str(EXAMPLE))
    for init in broken.graph.initializer:
        arr = onnx.numpy_helper.to_array(init)
        if arr.dtype == np.float32:
            init.CopyFrom(onnx.numpy_helper.from_array(arr + 1.0, init.name))
    bad = tmp_path / "bad.onnx"
    onnx.save(broken, str(bad))
    report = opfuse.verify(EXAMPLE, bad, save_failing_inputs=tmp_path / "api.npz")
    assert not report.ok and report.saved_inputs == tmp_path / "api.npz"
    assert set(np.load(report.saved_inputs)) == {"input"}
    assert opfuse.verify(EXAMPLE, EXAMPLE, save_failing_inputs=tmp_path / "x.npz").ok
    assert not (tmp_path / "x.npz").exists()  # nothing failed: nothing written
    seen: list[VerifySettings] = []
    real = api.verify

    def spy(*args: Any, verify_settings: VerifySettings, **kwargs: Any) -> Any:
        seen.append(verify_settings)
        return real(*args, verify_settings=verify_settings, **kwargs)

    monkeypatch.setattr(api, "verify", spy)
    result = cli("verify", EXAMPLE, bad, "--save-failing-inputs", tmp_path / "cli.npz")
    assert result.exit_code == 1
    assert seen == [VerifySettings(save_failing_inputs=tmp_path / "cli.npz")]
    assert f"inputs saved to {tmp_path / 'cli.npz'}" in result.stderr
    assert (tmp_path / "cli.npz").exists()


def test_batch_goes_through_the_api_with_the_settings_objects(tmp_path, monkeypatch):
    given: dict[str, Any] = {}

    def fake(inputs: Any, outdir: Path, **kwargs: Any) -> BatchRecords:
        given.update(kwargs)
        run = BatchRun(Path(outdir), "local", records=[{"status": "ok"}], total=1)
        return BatchRecords(run)

    monkeypatch.setattr(api, "batch", fake)
    out = tmp_path / "out"
    args = ["--enable", "GeluFusionPass", "--rtol", "0.01", "--input-shape", "input:1,3,32,32"]
    result = cli("batch", EXAMPLE, "-o", out, "--format", "json", *args)
    assert result.exit_code == 0, result.output
    assert given["optimize_settings"] == OptimizeSettings(enable=("GeluFusionPass",))
    assert given["verify_settings"] == VerifySettings(
        rtol=0.01, input_shape={"input": [1, 3, 32, 32]}
    )
    assert json.loads(result.stdout)["records"] == [{"status": "ok"}]


def test_a_batch_task_calls_the_pipeline_as_the_api_does(tmp_path, monkeypatch):
    graph = OptimizeSettings(disable=["ConvBatchNormFusionPass"], layout="nchw")
    checks = VerifySettings(rtol=0.01, input_shape={"input": [1, 3, 32, 32]})
    options = TaskOptions.of(graph, checks, timeout=60.0)
    assert (
        options.key()
        == TaskOptions(
            rtol=0.01,
            input_shape={"input": [1, 3, 32, 32]},
            disable=("ConvBatchNormFusionPass",),
            layout="nchw",
            timeout=60.0,
        ).key()
    )  # the resume key of the same options given flat
    assert options.optimize_settings() == graph and options.verify_settings() == checks
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(pipeline, "optimize_file", lambda *a, **k: calls.append(k))
    from opfuse.batching.task import optimize_model_file

    optimize_model_file(Job(str(EXAMPLE), "m.onnx", options), tmp_path / "m.onnx")
    assert calls[0]["settings"] == graph and calls[0]["verifier"] == checks


def test_batch_refuses_what_a_task_cannot_carry(tmp_path):
    with pytest.raises(SettingsError, match="keep_inputs=.*opfuse.batch does not take it"):
        opfuse.batch(EXAMPLE, tmp_path / "o", optimize_settings=OptimizeSettings(keep_inputs="a"))
    with pytest.raises(SettingsError, match="rtol=0.1: give it in the settings or as a keyword"):
        opfuse.batch(EXAMPLE, tmp_path / "o", rtol=0.1, verify_settings=VerifySettings())
    with pytest.raises(OpfuseError, match="NoSuchPass"):  # before any model runs
        opfuse.batch(EXAMPLE, tmp_path / "o", enable=["NoSuchPass"])
    assert not (tmp_path / "o").exists()


def test_every_type_the_api_takes_or_returns_is_exported():
    for name in (
        "OptimizeResult",
        "VerifyReport",
        "OutputDiff",
        "QuantizeResult",
        "TuneResult",
        "GateError",
        "SettingsError",
        "OpfuseError",
        "VerificationError",
        "OptimizeSettings",
        "VerifySettings",
        "RuntimeSettings",
        "QuantizeSettings",
        "Phases",
        "BatchRecords",
        "BatchRun",
        "BatchInterrupted",
        "BatchProgress",
        "SessionSettings",
    ):
        assert name in opfuse.__all__ and name in api.__all__, name
        assert getattr(opfuse, name) is getattr(api, name), name
    assert issubclass(opfuse.SettingsError, opfuse.OpfuseError)
    assert issubclass(opfuse.BatchInterrupted, KeyboardInterrupt)
    assert opfuse.RuntimeSettings is RuntimeSettings and opfuse.VerifySettings is VerifySettings


def test_quantize_goes_through_the_door_with_its_settings(tmp_path, monkeypatch):
    """opfuse quantize parses its options into a QuantizeSettings and a RuntimeSettings,
    calls opfuse.api.quantize, which calls the conductor with that object; a refused value
    is said in the API's keyword by the API and with its flag by the command line; the
    settings write themselves back as the command line."""
    from opfuse.quantization import conductor
    from opfuse.quantization.settings import QuantizeSettings

    calls: list[QuantizeSettings] = []
    real = conductor.quantize_file

    def engine(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(conductor, "quantize_file", engine)
    out = tmp_path / "q.onnx"
    args = ["--calibration", "random", "--max-drop", "off", "--no-benchmark", "--per-tensor"]
    result = cli("quantize", EXAMPLE, "-o", out, *args, "--recipe", "minmax", "--samples", "8")
    assert result.exit_code == 0, result.output
    (settings,) = calls
    assert settings == QuantizeSettings(
        max_drop="off", benchmark=False, per_channel=False, recipe="minmax", samples=8
    )
    assert settings.command_line(EXAMPLE, out, "random").split()[7:] == [
        "--samples", "8", "--per-tensor", "--recipe", "minmax", "--max-drop", "off"
    ]  # fmt: skip
    for kwargs, message in [
        ({"samples": 0}, "samples=0: a count of at least 1"),
        ({"fallback_tries": -1}, "fallback_tries=-1: a count of at least 0"),
        ({"activation_type": "int4"}, "activation_type='int4': expected uint8 or int8"),
        ({"min_speedup": 1.5, "benchmark": False}, "min_speedup needs the speed measured"),
    ]:
        with pytest.raises(SettingsError, match=message):
            QuantizeSettings(**kwargs)
    flags = cli("quantize", EXAMPLE, "-o", out, "--calibration", "random", "--samples", "0")
    assert str(flags.exception) == "--samples 0: a count of at least 1"
    both = cli("quantize", EXAMPLE, "-o", out, "--calibration", "random", "--min-speedup", "2",
               "--no-benchmark")  # fmt: skip
    assert str(both.exception).startswith("--min-speedup needs the speed measured, which --no-b")
