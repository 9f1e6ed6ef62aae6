"""The user's inputs everywhere (issue 41): `--inputs samples.npz` for optimize
(--benchmark and verification), tune, advise, profile, verify and a batch manifest's
`inputs` key: the timings and the verification run on those arrays; without them every
report names the shapes timed and says they were generated. The fake runtime remembers
the shapes it was fed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opfuse
from helpers import run_command
from opfuse.advisor.conductor import AdviseOptions, advise
from opfuse.advisor.render import render_text
from opfuse.advisor.report import plain_text
from opfuse.runtime.fake import FakeRuntime
from opfuse.runtime.settings import RuntimeSettings

GIVEN = (2, 3, 16, 12)
GENERATED = (1, 3, 224, 224)  # a free image size gets one images have


def conv_bn(path: Path) -> Path:
    """x[N, 3, H, W] -> Conv 1x1 -> BatchNormalization -> Relu: an image input with a
    free size, and a fold for the default passes."""
    rng = np.random.default_rng(0)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "g"),
        onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "m"),
        onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "v"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
            helper.make_node("Relu", ["n"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return conv_bn(tmp_path / "m.onnx")


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    path = tmp_path / "samples.npz"
    np.savez(path, x=np.random.default_rng(1).standard_normal(GIVEN).astype(np.float32))
    return path


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    """The runtime every command measures on (``RuntimeSettings.make``)."""
    runtime = FakeRuntime({"Conv": 0.002, "BatchNormalization": 0.001}, default=0.0005)
    monkeypatch.setattr(RuntimeSettings, "make", lambda self: runtime)
    return runtime


def fed(*shape: int) -> set[tuple[tuple[str, tuple[int, ...]], ...]]:
    return {(("x", shape),)}


def run(args: list[object], monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "1000")  # a long path stays whole
    status, out, err = run_command(args, monkeypatch, capsys)
    return status, " ".join(out.split()), err


# --- optimize --benchmark ------------------------------------------------------------------


def test_benchmark_names_the_generated_shapes_it_timed(model, tmp_path, fake, monkeypatch, capsys):
    args = ["optimize", model, "-o", tmp_path / "o.onnx", "--benchmark", "--bench-seconds", "0.01"]
    status, out, err = run(args, monkeypatch, capsys)
    assert status == 0, err
    assert "verification: ok on inputs x[1,3,224,224] (generated, seed 0)" in out
    assert "timed on inputs x[1,3,224,224] (generated, seed 0): give the shapes" in out
    assert fake.fed == fed(*GENERATED)


def test_benchmark_and_verification_run_on_the_given_inputs(
    model, samples, tmp_path, fake, monkeypatch, capsys
):
    out_model = tmp_path / "o.onnx"
    base = ["optimize", model, "-o", out_model, "--benchmark", "--bench-seconds", "0.01"]
    status, out, err = run([*base, "--inputs", samples], monkeypatch, capsys)
    assert status == 0, err
    assert f"verification: ok on inputs x[2,3,16,12] (from {samples})" in out
    assert f"timed on inputs x[2,3,16,12] (from {samples})" in out
    assert "generated" not in out
    assert fake.fed == fed(*GIVEN)
    # JSON: the benchmark with the inputs it timed, and the verification's
    status, text, err = run([*base, "--inputs", samples, "--format", "json"], monkeypatch, capsys)
    data = json.loads(text)
    assert data["benchmark"]["inputs"]["shapes"] == {"x": list(GIVEN)}
    assert data["benchmark"]["inputs"]["generated"] is False and data["benchmark"]["ratio"] > 0
    assert data["verification"]["inputs_npz"] == str(samples)
    assert data["verification"]["inputs_generated"] is False
    # the older name feeds both too
    fake.fed.clear()
    status, out, err = run([*base, "--verify-inputs", samples], monkeypatch, capsys)
    assert status == 0 and fake.fed == fed(*GIVEN), err


def test_inputs_and_verify_inputs_together_are_refused(
    model, samples, tmp_path, monkeypatch, capsys
):
    args = ["optimize", model, "-o", tmp_path / "o.onnx", "--inputs", samples]
    status, _, err = run([*args, "--verify-inputs", samples], monkeypatch, capsys)
    assert status == 2
    assert f"--inputs {samples} and --verify-inputs both give the input arrays" in err
    status, _, err = run([*args, "--input-shape", "x:1,3,8,8"], monkeypatch, capsys)
    assert status == 2 and f"--input-shape and --inputs {samples} both give" in err
    assert not (tmp_path / "o.onnx").exists()


def test_inputs_time_with_no_verify_and_are_refused_without_benchmark(
    model, samples, tmp_path, fake, monkeypatch, capsys
):
    args = ["optimize", model, "-o", tmp_path / "o.onnx", "--no-verify", "--inputs", samples]
    status, _, err = run(args, monkeypatch, capsys)
    assert status == 2 and "--inputs has no effect with --no-verify" in err
    status, out, err = run([*args, "--benchmark", "--bench-seconds", "0.01"], monkeypatch, capsys)
    assert status == 0, err
    assert fake.fed == fed(*GIVEN)


def test_the_api_verifies_on_the_given_inputs(model, samples):
    result = opfuse.optimize(model, inputs=samples)
    assert result.verify is not None and result.verify.input_shapes == {"x": list(GIVEN)}
    assert not result.verify.fed.generated and result.verify.fed.npz == str(samples)
    report = opfuse.verify(model, model, inputs=samples)
    assert report.ok and report.input_shapes == {"x": list(GIVEN)}
    assert opfuse.verify(model, model).fed.shapes == {"x": list(GENERATED)}


# --- verify -------------------------------------------------------------------------------


def test_verify_names_where_its_inputs_came_from(model, samples, monkeypatch, capsys):
    status, out, err = run(["verify", model, model, "--inputs", samples], monkeypatch, capsys)
    assert status == 0, err
    assert f"inputs x[2,3,16,12] (from {samples})" in out
    status, out, err = run(["verify", model, model], monkeypatch, capsys)
    assert "inputs x[1,3,224,224] (generated, seed 0)" in out
    status, text, err = run(
        ["verify", model, model, "--inputs", samples, "--format", "json"], monkeypatch, capsys
    )
    data = json.loads(text)
    assert data["input_shapes"] == {"x": list(GIVEN)} and data["inputs_generated"] is False


# --- tune ---------------------------------------------------------------------------------


def tune_args(model: Path, tmp_path: Path) -> list[object]:
    out = tmp_path / "t.onnx"
    return [
        "tune", model, "-o", out, "--budget", "30", "--bench-seconds", "0.01",
        "--no-session-search", "--report", tmp_path / "tune.json",
    ]  # fmt: skip


def test_tune_names_the_generated_shapes_in_its_table_report_and_deployment_file(
    model, tmp_path, fake, monkeypatch, capsys
):
    status, out, err = run(tune_args(model, tmp_path), monkeypatch, capsys)
    assert status == 0, err
    assert "tune on fake 1.0; inputs x[1,3,224,224] (generated, seed 0)" in out  # the title
    assert "timed on inputs x[1,3,224,224] (generated, seed 0)" in out
    assert fake.fed == fed(*GENERATED)
    report = json.loads((tmp_path / "tune.json").read_text())
    assert report["inputs"]["shapes"] == {"x": list(GENERATED)}
    assert report["inputs"]["generated"] is True
    deployment = json.loads((tmp_path / "t.onnx.session.json").read_text())
    assert deployment["measured"]["inputs"]["shapes"] == {"x": list(GENERATED)}
    assert deployment["measured"]["inputs"]["generated"] is True


def test_tune_verifies_and_times_on_the_given_inputs(
    model, samples, tmp_path, fake, monkeypatch, capsys
):
    args = [*tune_args(model, tmp_path), "--inputs", samples]
    status, out, err = run(args, monkeypatch, capsys)
    assert status == 0, err
    assert f"timed on inputs x[2,3,16,12] (from {samples})" in out
    assert fake.fed == fed(*GIVEN)
    report = json.loads((tmp_path / "tune.json").read_text())
    assert report["inputs"]["npz"] == str(samples) and report["inputs"]["generated"] is False
    deployment = json.loads((tmp_path / "t.onnx.session.json").read_text())
    assert deployment["measured"]["inputs"]["shapes"] == {"x": list(GIVEN)}


def test_tune_settings_take_inputs(samples):
    settings = opfuse.TuneSettings(inputs=samples)
    assert settings.inputs_npz == samples
    assert settings.search_settings(RuntimeSettings()).inputs_npz == samples
    assert opfuse.TuneSettings(verify_inputs=samples).inputs_npz == samples


# --- advise and profile -------------------------------------------------------------------


def advice(model: Path, fake: FakeRuntime, **options: object) -> opfuse.AdviceReport:
    o = AdviseOptions(
        runs=1, warmup=0, runtime=fake, compare_onnxruntime=False, calibrate=False,
        trial_seconds=0.01, **options,  # type: ignore[arg-type]
    )  # fmt: skip
    return advise(model, options=o)


def test_advise_profiles_and_times_on_the_given_inputs(model, samples, fake):
    report = advice(model, fake, inputs=samples)
    profile = report["profile"]
    assert profile["inputs"][0]["shape"] == list(GIVEN)
    assert profile["inputs_fed"]["npz"] == str(samples) and profile["input_shape_hint"] is None
    steps = report["next_steps"]
    assert steps["commands"] and steps["inputs"]["shapes"] == {"x": list(GIVEN)}
    assert fake.fed == fed(*GIVEN)  # the trial's measurement
    text = " ".join(plain_text(lambda c: render_text(report, c)).split())
    assert f"inputs profiled: x [2, 3, 16, 12] (declared [N, 3, H, W]), from {samples}" in text
    assert f"timed on inputs x[2,3,16,12] (from {samples})" in text


def test_advise_names_the_generated_shapes_it_profiled_and_timed(model, fake):
    report = advice(model, fake)
    assert report["profile"]["inputs_fed"]["generated"] is True
    assert report["next_steps"]["inputs"]["shapes"] == {"x": list(GENERATED)}
    text = " ".join(plain_text(lambda c: render_text(report, c)).split())
    assert "x [1, 3, 224, 224] (declared [N, 3, H, W]), generated (seed 0)" in text
    assert "--input-shape x:N,3,H,W with your sizes" in text  # not the generated shape
    assert "timed on inputs x[1,3,224,224] (generated, seed 0)" in text


def test_profile_runs_on_the_given_inputs(model, samples, monkeypatch, capsys):
    base = ["profile", model, "--runs", "1", "--warmup", "0"]
    status, text, err = run([*base, "--inputs", samples, "--format", "json"], monkeypatch, capsys)
    assert status == 0, err
    data = json.loads(text)
    assert data["inputs"][0]["shape"] == list(GIVEN) and data["inputs_fed"]["generated"] is False
    status, out, err = run(base, monkeypatch, capsys)
    assert "inputs profiled: x [1, 3, 224, 224] (declared [N, 3, H, W]), generated (seed 0)" in out
    settings = opfuse.ProfileSettings(inputs=samples)
    assert opfuse.profile(model, settings).profile.inputs[0].shape == list(GIVEN)


# --- batch --------------------------------------------------------------------------------


def test_a_manifests_inputs_key_feeds_its_models_verification_and_timing(
    model, samples, tmp_path, monkeypatch
):
    from opfuse.batching import task
    from opfuse.batching.jobs import TaskOptions, collect_jobs

    manifest = tmp_path / "models.jsonl"
    manifest.write_text(json.dumps({"path": model.name, "inputs": samples.name}) + "\n")
    # the model's own arrays over the run's --input-shape
    (job,) = collect_jobs([manifest], TaskOptions(input_shape={"x": [1, 3, 8, 8]}))
    assert job.options.verify_inputs == str(samples) and job.options.input_shape is None
    record = task.run_task(job, str(tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    assert record["verification"]["input_shapes"] == {"x": list(GIVEN)}
    assert record["verification"]["inputs_generated"] is False
    runtime = FakeRuntime()
    monkeypatch.setattr("opfuse.runtime.get_runtime", lambda *a, **k: runtime)
    ratio, inputs = task.latency(job, tmp_path / "out" / model.name, seconds=0.01)
    assert ratio > 0 and inputs is not None and inputs["shapes"] == {"x": list(GIVEN)}
    assert runtime.fed == fed(*GIVEN)
    # summary.html says what the ratio was timed on
    from opfuse.batching.summary import _row

    row = _row({**record, "latency_ratio": ratio, "latency_inputs": inputs})
    assert f'title="timed on inputs x[2,3,16,12] ({samples})"' in row


def test_a_manifest_line_with_inputs_and_verify_inputs_is_refused(model, samples, tmp_path):
    from opfuse.batching.jobs import TaskOptions, collect_jobs
    from opfuse.errors import OpfuseError

    manifest = tmp_path / "models.jsonl"
    line = {"path": model.name, "inputs": samples.name, "verify_inputs": samples.name}
    manifest.write_text(json.dumps(line) + "\n")
    with pytest.raises(OpfuseError, match="models.jsonl:1: inputs and verify_inputs"):
        collect_jobs([manifest], TaskOptions())
