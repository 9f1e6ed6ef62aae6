"""``opfuse batch`` on the command line: output formats, exit statuses, --advise,
--benchmark, and bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from batch_models import identity_chain, truncated


def opfuse(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opfuse", "batch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_json_format_progress_lines_and_a_rerun_that_skips(tmp_path):
    model = identity_chain(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    first = opfuse(model, "-o", out, "--workers", "1", "--format", "json")
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["summary"]["status"]["ok"] == 1 and data["summary"]["ran"] == 1
    assert data["summary"]["engine"] == "local"
    assert [r["relpath"] for r in data["records"]] == ["m.onnx"]
    assert "[1/1] m.onnx: ok" in first.stderr
    second = opfuse(model, "-o", out)
    assert second.returncode == 0, second.stderr
    assert "1 of 1 models done before: skipped" in second.stderr
    assert "0 run (none) and 1 skipped" in second.stdout


def test_a_failed_model_makes_exit_status_1(tmp_path):
    truncated(tmp_path / "in" / "bad.onnx")
    identity_chain(tmp_path / "in" / "good.onnx")
    result = opfuse(tmp_path / "in", "-o", tmp_path / "out", "--workers", "2")
    assert result.returncode == 1
    assert "1 ok, 1 refused" in result.stdout
    assert (tmp_path / "out" / "good.onnx").exists()


@pytest.mark.parametrize("columns", ["72", None])
def test_the_summary_stays_within_columns_off_a_terminal(tmp_path, columns):
    """COLUMNS is honoured off a terminal, 100 without it (it was 240 whatever COLUMNS
    said); the error folds within the table instead of running over."""
    truncated(tmp_path / "in" / "a-model-with-a-rather-long-file-name-that-fails.onnx")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    result = opfuse(tmp_path / "in", "-o", tmp_path / "out", "--workers", "1", env=env)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= int(columns or 100), result.stdout
    first_column = "".join(line.split("│")[1].strip() for line in lines if line.count("│") == 6)
    assert "a-model-with-a-rather-long-file-name-that-fails.onnx" in first_column  # folded, whole


def test_advise_and_benchmark_add_reports_and_a_latency_ratio(tmp_path):
    model = identity_chain(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    result = opfuse(model, "-o", out, "--advise", "--benchmark", "--format", "json")
    assert result.returncode == 0, result.stderr
    (record,) = json.loads(result.stdout)["records"]
    assert record["reports"] == {
        "fusion_result": "m.fusion_result.json",
        "advise_json": "m.advise.json",
        "advise_html": "m.advise.html",
    }
    assert json.loads((out / "m.advise.json").read_text())["schema"].startswith("opfuse.advise")
    assert (out / "m.advise.html").read_text().lower().startswith("<!doctype html>")
    assert 'href="m.advise.html"' in (out / "summary.html").read_text()
    assert record["latency_ratio"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.onnx"], "missing.onnx: no such file or folder"),
        (["{model}", "--max-memory", "lots"], "--max-memory 'lots': give a size"),
        (["{model}", "--enable", "NoSuchFusionPass"], "NoSuchFusionPass"),
        (["{model}", "--timeout", "0"], "--timeout 0"),
        (["{model}", "--target", "bogus"], "'bogus' is not one of"),
        (["{model}", "--fusion-switch-file", "{model}"], "switch"),
        (["--ray", "{model}", "{model}"], "not a cluster address; put --ray after the inputs"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, message):
    model = identity_chain(tmp_path / "m.onnx")
    out = tmp_path / "out"
    result = opfuse(*[a.format(model=model) for a in args], "-o", out)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opfuse: error:"), result.stderr
    assert message in lines[0]
    assert not out.exists()


def test_outdir_over_the_input_folder_is_refused(tmp_path):
    identity_chain(tmp_path / "m.onnx")
    result = opfuse(tmp_path, "-o", tmp_path)
    assert result.returncode == 2
    assert "over the input model" in result.stderr
    assert not (tmp_path / "results.jsonl").exists()
