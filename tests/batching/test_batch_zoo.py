"""The acceptance run on the whole materialized zoo (slow): every model ok except the
three planted ones, a second run skips everything, --force redoes everything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from batch_models import hangs, needs_16_gib, truncated

pytestmark = pytest.mark.slow
BAD = {"hang.onnx": "timeout", "oom.onnx": "oom", "truncated.onnx": "refused"}


def opfuse_batch(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opfuse", "batch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=3600,
    )


def test_zoo_batch_with_a_truncated_a_hanging_and_a_memory_hungry_model(zoo_dir, tmp_path):
    models = tmp_path / "zoo"
    shutil.copytree(zoo_dir, models, copy_function=os.link)
    hangs(models / "hang.onnx")
    needs_16_gib(models / "oom.onnx")
    truncated(models / "truncated.onnx")
    out = tmp_path / "out"
    args = [models, "-o", out, "--workers", "2", "--timeout", "90", "--max-memory", "4G"]
    first = opfuse_batch(*args, "--format", "json")
    assert first.returncode == 1, first.stderr  # three models failed
    records = json.loads(first.stdout)["records"]
    names = sorted(p.name for p in models.glob("*.onnx"))
    assert sorted(r["relpath"] for r in records) == names
    for r in records:
        assert r["status"] == BAD.get(r["relpath"], "ok"), (r["relpath"], r["error"])
    second = opfuse_batch(*args, "--format", "json")
    summary = json.loads(second.stdout)["summary"]
    assert (summary["ran"], summary["skipped"]) == (0, len(names))
    lines = len((out / "results.jsonl").read_text().splitlines())
    forced = opfuse_batch(*args, "--force", "--format", "json")
    assert json.loads(forced.stdout)["summary"]["ran"] == len(names)
    assert len((out / "results.jsonl").read_text().splitlines()) == lines + len(names)
    assert Path(out / "summary.html").exists()
