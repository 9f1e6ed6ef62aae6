"""opfuse.batch on the local engine, end to end: each model's status, the mirrored
outputs (numerically equal to their inputs), results.jsonl, the summary page, resuming,
--force, crashes of the worker process, and Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batch_models import EXPECTED, identity_chain, small_zoo

import opfuse
from opfuse.batching import results
from opfuse.batching.isolate import run_isolated
from opfuse.batching.jobs import Job, TaskOptions
from opfuse.batching.task import STATUSES, status_of
from opfuse.errors import OpfuseError, VerificationError
from opfuse.verification.compare import compare_files

LIMITS = {"timeout": 6.0, "max_memory": 1 << 30}
FIELDS = {
    "schema", "model", "relpath", "sha256", "options_key", "limits", "status", "error",
    "nodes_before", "nodes_after", "passes", "verification", "latency_ratio", "latency_inputs",
    "tune", "output",
    "reports", "started", "seconds", "optimize_seconds", "peak_memory", "versions",
}  # fmt: skip


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_zoo(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def first_run(zoo: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("out")
    return out, opfuse.batch([zoo], out, workers=2, **LIMITS)


def test_each_model_gets_its_own_status(first_run):
    _, records = first_run
    assert {r["relpath"]: r["status"] for r in records} == EXPECTED
    for r in records:
        assert set(r) == FIELDS
        assert (r["error"] is None) == (r["status"] == "ok")
    by_path = {r["relpath"]: r for r in records}
    assert "truncated" in by_path["broken/truncated.onnx"]["error"]
    assert "timeout" in by_path["hang.onnx"]["error"]
    assert "Failed to allocate" in by_path["oom.onnx"]["error"]


def test_ok_models_are_written_mirrored_and_equal_to_their_inputs(first_run, zoo):
    out, records = first_run
    for r in records:
        if r["status"] != "ok":
            assert r["output"] is None
            assert not (out / r["relpath"]).exists()
            continue
        assert r["output"] == r["relpath"]
        assert (out / r["reports"]["fusion_result"]).is_file()
        report = compare_files(zoo / r["relpath"], out / r["output"])  # both at ORT_DISABLE_ALL
        assert report.ok, report.failure()
        assert r["verification"]["ok"] is True
        assert r["peak_memory"] > 0
    chain = next(r for r in records if r["relpath"] == "nested/chain.onnx")
    assert (chain["nodes_before"], chain["nodes_after"]) == (3, 1)
    assert chain["passes"] == {"IdentityRemovalFusionPass": 2}


def test_results_jsonl_holds_one_line_per_model(first_run):
    out, records = first_run
    lines = (out / "results.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["relpath"] for line in lines) == sorted(EXPECTED)
    assert sorted(map(json.loads, lines), key=lambda r: r["relpath"]) == sorted(
        records, key=lambda r: r["relpath"]
    )


def test_summary_page_counts_and_links(first_run):
    out, _ = first_run
    page = (out / "summary.html").read_text()
    for relpath in EXPECTED:
        assert relpath in page
    assert 'href="convnet.fusion_result.json"' in page
    assert 'href="nested/chain.fusion_result.json"' in page
    assert "<th>timeout</th>" in page and 'data-sort="num">nodes removed' in page


def test_rerun_skips_everything_and_force_redoes_it(first_run, zoo, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(first_run[0], out)  # records are relative to OUTDIR: a moved one resumes
    before = (out / "results.jsonl").read_text()
    again = opfuse.batch([zoo], out, workers=2, **LIMITS)
    assert again == first_run[1]  # the records of the first run, nothing redone
    assert (out / "results.jsonl").read_text() == before
    forced = opfuse.batch([zoo], out, workers=2, force=True, **LIMITS)
    assert {r["relpath"]: r["status"] for r in forced} == EXPECTED
    assert len((out / "results.jsonl").read_text().splitlines()) == 2 * len(EXPECTED)


def test_changed_input_or_options_or_limits_are_redone(tmp_path):
    model = identity_chain(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    first = opfuse.batch(model, out, workers=1)
    assert opfuse.batch(model, out, workers=1) == first
    (out / "m.onnx").unlink()  # its output is gone: redo
    assert opfuse.batch(model, out, workers=1)[0] != first[0]
    other = opfuse.batch(model, out, workers=1, rtol=1e-3)
    assert other[0]["options_key"] != first[0]["options_key"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 3


def test_a_timeout_is_retried_with_a_longer_timeout(tmp_path):
    model = identity_chain(tmp_path / "in" / "m.onnx")
    record = {"status": "timeout", "limits": {"timeout": 1.0, "max_memory": 0}}
    assert results.reusable(record, {"timeout": 1.0, "max_memory": 0}, tmp_path)
    assert not results.reusable(record, {"timeout": 9.0, "max_memory": 0}, tmp_path)
    assert not results.reusable({"status": "crashed"}, record["limits"], tmp_path)
    assert results.reusable({"status": "refused"}, record["limits"], tmp_path)
    assert not results.reusable({"status": "ok", "output": "m.onnx"}, {}, tmp_path)
    assert results.reusable({"status": "ok", "output": "m.onnx"}, {}, model.parent)


def test_a_manifests_own_tolerance_reaches_the_verifier(tmp_path):
    """A .jsonl line's rtol/atol are the ones the verifier applies to that model only.
    (Zero tolerance no longer fails the convnet: its BatchNorm fold gives onnxruntime's
    own bits and the float64 judge accepts rounding; the failure status itself is
    covered by test_status_of_each_kind_of_failure.)"""
    models = small_zoo(tmp_path / "models")
    manifest = models / "list.jsonl"
    manifest.write_text(
        '{"path": "convnet.onnx", "rtol": 0, "atol": 0}\n'
        "# a comment line\n"
        '{"path": "nested/chain.onnx", "input_shape": {"x": [2, 3]}}\n'
    )
    records = opfuse.batch(manifest, tmp_path / "out", workers=2)
    by_path = {r["relpath"]: r for r in records}
    strict = by_path["convnet.onnx"]["verification"]
    assert (strict["rtol"], strict["atol"]) == (0, 0)
    assert all(o["abs_bound"] == 0 for o in strict["outputs"])
    default = by_path["nested/chain.onnx"]["verification"]
    assert (default["rtol"], default["atol"]) == (1e-4, 1e-5)
    assert default["input_shapes"] == {"x": [2, 3]}
    assert by_path["nested/chain.onnx"]["status"] == "ok"


def _abort(job: Job, outdir: str, conn) -> None:
    os.abort()


def _exit_3(job: Job, outdir: str, conn) -> None:
    sys.exit(3)


@pytest.mark.parametrize(("task", "message"), [(_abort, "SIGABRT"), (_exit_3, "status 3")])
def test_a_worker_that_dies_is_a_crashed_record(tmp_path, task, message):
    model = identity_chain(tmp_path / "m.onnx")
    record = run_isolated(Job(str(model), "m.onnx", TaskOptions()), str(tmp_path), task=task)
    assert record["status"] == "crashed"
    assert message in record["error"]
    assert record["sha256"] is not None and record["output"] is None


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (VerificationError("verification failed: output 'y' differs"), "verify_failed"),
        (OpfuseError("m.onnx: not an ONNX model or truncated"), "refused"),
        (OpfuseError("m.onnx: ... Failed to allocate memory for requested buffer"), "oom"),
        (MemoryError(), "oom"),
        (ValueError("a bug"), "crashed"),
    ],
)
def test_status_of_each_kind_of_failure(exc, status):
    assert status_of(exc) == status
    assert status in STATUSES


def test_ctrl_c_stops_cleanly_and_keeps_finished_records(tmp_path):
    models = tmp_path / "models"
    identity_chain(models / "a_chain.onnx")
    from batch_models import hangs

    hangs(models / "b_hang.onnx")
    hangs(models / "c_hang.onnx")
    out = tmp_path / "out"
    args = [sys.executable, "-m", "opfuse", "batch", str(models), "-o", str(out)]
    proc = subprocess.Popen(
        [*args, "--workers", "2", "--timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (out / "results.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # the hanging models run now
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)  # long before the 120 s timeout
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout and "run the same command to resume" in stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["relpath"] for line in lines] == ["a_chain.onnx"]
    assert (out / "summary.html").exists()


def test_tune_writes_a_verified_tuned_model_beside_the_output(tmp_path):
    model = identity_chain(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    (record,) = opfuse.batch(model, out, tune=2.0, timeout=120)
    assert record["status"] == "ok", record["error"]
    tuned = record["tune"]
    assert set(tuned) == {"best", "beat_original", "latency_ratio", "model", "switch_file"}
    assert (tuned["model"], tuned["switch_file"]) == ("m.tuned.onnx", "m.fusion_switch.cfg")
    assert compare_files(model, out / tuned["model"]).ok
    assert json.loads((out / tuned["switch_file"]).read_text()).get("Switch") is not None
    assert json.loads((out / record["reports"]["tune"]).read_text())["trials"]
    assert record["options_key"] != opfuse.batch(model, out)[0]["options_key"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tune": 30.0, "timeout": 20.0}, "--tune 30: the budget must be above 0 and below"),
        ({"timeout": 0.0}, "--timeout 0"),
        ({"max_memory": -1}, "--max-memory -1"),
        ({"speed": 3}, "unknown options ['speed']"),
    ],
)
def test_options_no_model_could_run_under_are_refused_before_any_work(tmp_path, options, message):
    model = identity_chain(tmp_path / "m.onnx")
    with pytest.raises(OpfuseError) as info:
        opfuse.batch(model, tmp_path / "out", **options)
    assert message in str(info.value)
    assert not (tmp_path / "out").exists()
