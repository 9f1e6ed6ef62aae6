"""cpu/cuda peaks are measured once on this machine and cached; a user's target file is
taken as it is; no report calls a built-in target too low for the machine."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from advisor_models import SWISH_TIMES, ort_profile, swish_net, write_json

from opfuse.advisor import machine_peaks as calibrate
from opfuse.advisor.conductor import AdviseOptions, advise


def test_peaks_are_measured_once_and_cached(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measure(provider: str, threads: int) -> tuple[float, float]:
        calls.append((provider, threads))
        return 1e11, 2e10

    first = calibrate.machine_peaks("CPUExecutionProvider", 1, measure)
    again = calibrate.machine_peaks("CPUExecutionProvider", 1, measure)
    other = calibrate.machine_peaks("CPUExecutionProvider", 2, measure)
    assert calls == [("CPUExecutionProvider", 1), ("CPUExecutionProvider", 2)]
    assert (first.flops, first.bandwidth, first.cached) == (1e11, 2e10, False)
    assert (again.flops, again.bandwidth, again.cached) == (1e11, 2e10, True)
    assert "threads 1" in first.key and "threads 2" in other.key
    cache = json.loads((tmp_path / "cache" / "calibration.json").read_text())
    assert set(cache) == {first.key, other.key}


def test_the_real_measurement_gives_positive_figures() -> None:
    flops, bandwidth = calibrate.measure_onnxruntime("CPUExecutionProvider", 1)
    assert flops > 1e8 and bandwidth > 1e8  # any machine does better than 0.1 G/s


def test_advise_uses_the_measured_peaks(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    prof = write_json(tmp_path / "p.json", ort_profile(SWISH_TIMES, runs=2))

    def measure(provider: str, threads: int) -> tuple[float, float]:
        return 3e11, 4e10

    base = dict(warmup=1, compare_onnxruntime=False, next_steps=False, measure_peaks=measure)
    report = advise(model, profile_path=prof, options=AdviseOptions(**base))  # type: ignore[arg-type]
    target = report["target"]
    assert (target["peak_flops"], target["bandwidth_bytes_per_s"]) == (3e11, 4e10)
    assert target["peaks"] == "measured" and "CPUExecutionProvider" in target["peaks_measured_on"]
    conv1 = next(n for n in report["top_nodes"] if n["name"] == "conv1")
    assert conv1["of_peak"] is None  # the synthetic profile has no shapes
    off = advise(
        model,
        profile_path=prof,
        options=AdviseOptions(**{**base, "calibrate": False}),  # type: ignore[arg-type]
    )
    assert off["target"]["peaks"] == "file" and off["target"]["peak_flops"] == pytest.approx(1.9e11)


def test_spread_over_runs_and_the_variance_warning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "swish.onnx"
    onnx.save(swish_net(), model)
    options = AdviseOptions(warmup=0, compare_onnxruntime=False, next_steps=False)
    steady = write_json(tmp_path / "s.json", ort_profile(SWISH_TIMES, runs=4, warmup_factor=1.0))
    report = advise(model, profile_path=steady, options=options)
    assert report["profile"]["variance_warning"] is None
    assert all(n["iqr_us"] == 0 for n in report["top_nodes"])
    events = ort_profile(SWISH_TIMES, runs=4, warmup_factor=1.0)
    conv1 = [e for e in events if e.get("name") == "conv1_kernel_time"]
    conv1[1]["dur"] *= 5  # one run of conv1 took 500 us instead of 100
    noisy = write_json(tmp_path / "n.json", events)
    report = advise(model, profile_path=noisy, options=options)
    node = next(n for n in report["top_nodes"] if n["name"] == "conv1")
    assert node["duration_us"] == 100.0 and node["iqr_us"] == 100.0  # median kept, spread shown
    prof = report["profile"]
    assert prof["total_iqr_us"] == pytest.approx(100.0)
    assert prof["variance_warning"].startswith("runs vary")


def test_profile_and_advise_count_nodes_alike(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Constant node: counted by neither command."""
    from click.testing import CliRunner
    from onnx import helper

    from opfuse.cli import app

    proto = swish_net()
    constant = onnx.numpy_helper.from_array(np.ones(1, np.float32))
    proto.graph.node.insert(
        0, helper.make_node("Constant", [], ["unused_k"], name="k", value=constant)
    )
    model = tmp_path / "swish_k.onnx"
    onnx.save(proto, model)
    profiled = CliRunner().invoke(app, ["profile", str(model), "--runs", "1", "--format", "json"])
    assert profiled.exit_code == 0, profiled.output
    advised = CliRunner().invoke(
        app, ["advise", str(model), "--runs", "1", "--no-trial", "--format", "json"]
    )
    assert advised.exit_code == 0, advised.output
    nodes = json.loads(profiled.output)["nodes"]
    graph = json.loads(advised.output)["graph"]
    assert nodes == graph["nodes_original"] == len(proto.graph.node) - 1
    assert graph["constant_nodes_counted"] is False
