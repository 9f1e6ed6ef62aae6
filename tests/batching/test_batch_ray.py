"""The Ray engine on a local cluster this test starts (``ray start --head``, joined by
address as an existing cluster would be): the same records as the local engine except the
measured fields, resuming, the CLI's --ray ADDRESS, and models a node cannot see."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
from batch_models import EXPECTED, identity_chain, small_zoo

import opfuse
from opfuse.batching.engines import RayEngine
from opfuse.batching.jobs import Job
from opfuse.batching.task import TIMING_FIELDS
from opfuse.errors import OpfuseError

LIMITS = {"timeout": 6.0, "max_memory": 1 << 30}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A two-CPU head node of our own, stopped by its own process (never `ray stop`,
    which would stop every Ray cluster on the machine). Token authentication off for the
    head, the test's driver and the CLI it starts, whatever ~/.ray holds."""
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must be short
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its daemons stop with it below
    )  # fmt: skip
    deadline = time.monotonic() + 120
    try:
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)
    if saved is None:
        del os.environ["RAY_AUTH_MODE"]
    else:
        os.environ["RAY_AUTH_MODE"] = saved


def _results(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def test_ray_gives_the_local_engines_records_except_timings(cluster, tmp_path):
    zoo = small_zoo(tmp_path / "models")
    local = opfuse.batch([zoo], tmp_path / "local", workers=2, **LIMITS)
    on_ray = opfuse.batch([zoo], tmp_path / "ray", engine="ray", ray_address=cluster, **LIMITS)
    assert {r["relpath"]: r["status"] for r in on_ray} == EXPECTED
    assert _results(on_ray) == _results(local)
    for relpath, status in EXPECTED.items():
        written = (tmp_path / "ray" / relpath).exists()
        assert written == (status == "ok")
    lines = (tmp_path / "ray" / "results.jsonl").read_text()
    again = opfuse.batch([zoo], tmp_path / "ray", engine="ray", ray_address=cluster, **LIMITS)
    assert again == on_ray and (tmp_path / "ray" / "results.jsonl").read_text() == lines


def test_cli_joins_a_cluster_by_address(cluster, tmp_path):
    model = identity_chain(tmp_path / "in" / "m.onnx")
    result = subprocess.run(
        [sys.executable, "-m", "opfuse", "batch", str(model), "-o", str(tmp_path / "out"),
         "--ray", cluster, "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["summary"]["engine"] == "ray"
    assert [r["status"] for r in data["records"]] == ["ok"]


def test_models_a_node_cannot_see_are_refused_before_submitting(cluster, tmp_path):
    import ray

    identity_chain(tmp_path / "m.onnx")
    missing = Job(str(tmp_path / "elsewhere" / "m.onnx"), "m.onnx")
    ray.init(address=cluster, log_to_driver=False)
    try:
        with pytest.raises(OpfuseError, match="cannot see .*elsewhere/m.onnx: models and"):
            RayEngine().check_paths(ray, [missing], str(tmp_path))
        RayEngine().check_paths(ray, [Job(str(tmp_path / "m.onnx"), "m.onnx")], str(tmp_path))
    finally:
        ray.shutdown()


def test_an_address_without_a_cluster_is_one_error(tmp_path):
    model = identity_chain(tmp_path / "m.onnx")
    with pytest.raises(OpfuseError, match="no Ray cluster answers there"):
        opfuse.batch(model, tmp_path / "out", engine="ray", ray_address=f"127.0.0.1:{_free_port()}")
