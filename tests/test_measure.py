"""Paired, interleaved measurement on a runtime: deterministic with the fake runtime (real
timing is only in bench/), and `optimize --benchmark` end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opfuse.errors import OpfuseError
from opfuse.runtime import get_runtime
from opfuse.runtime.fake import FakeRuntime
from opfuse.tuning.measure import (
    AGAIN,
    MIN_ROUNDS,
    NOISE_FLOOR,
    ORIGINAL,
    SESSION_SETS,
    Measurement,
    measure,
    schedule,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"


def opfuse(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opfuse", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> Path:
    from opfuse.pipeline.conductor import optimize_file

    out = tmp_path_factory.mktemp("m") / "convnet.opt.onnx"
    optimize_file(EXAMPLE, out)
    return out


def test_fake_runtime_latency_is_the_sum_of_op_costs(optimized):
    runtime = FakeRuntime({"Conv": 0.01}, default=0.001)
    found = measure(EXAMPLE, {"opfuse": optimized}, runtime, seconds=1.0)
    # convnet: 3 Conv + 12 other nodes; the output: 3 Conv + 6 others
    assert found.medians[ORIGINAL] == pytest.approx(0.03 + 0.012)
    assert found.medians[AGAIN] == found.medians[ORIGINAL]
    assert found.medians["opfuse"] == pytest.approx(0.03 + 0.006)
    assert found.noise == 0.0
    assert found.ratio("opfuse") == pytest.approx(0.036 / 0.042)
    assert found.faster("opfuse", ORIGINAL)
    assert not found.faster(ORIGINAL, "opfuse")
    assert found.line("opfuse") == "latency 42 -> 36 ms (0.86x; noise +-0.0%) fake 1.0"


def test_rounds_fill_the_budget_and_interleave(optimized):
    runtime = FakeRuntime(default=0.001)
    found = measure(EXAMPLE, {"opfuse": optimized}, runtime, seconds=1.0)
    # one round costs 0.015 + 0.015 + 0.009 s: 1 s holds 25 of them, rounded up to whole
    # periods of the schedule (6 rounds for 3 models), in 3 sets of fresh sessions
    assert found.rounds == 30 and found.sets == [10, 10, 10]
    assert len(runtime.loaded) == 3 * SESSION_SETS
    assert found.to_json()["session_sets"] == SESSION_SETS
    few = measure(EXAMPLE, {"opfuse": optimized}, FakeRuntime(default=1.0), seconds=0.001)
    assert few.rounds == len(schedule(3)) >= MIN_ROUNDS


def test_noise_is_the_original_measured_twice():
    def rounds(*seconds: float) -> list[float]:
        return [s * f for s, f in zip(seconds, (1.0, 1.2, 0.9), strict=True)]  # load varies

    m = Measurement(
        "r",
        3,
        {
            ORIGINAL: rounds(0.100, 0.100, 0.100),
            AGAIN: rounds(0.104, 0.104, 0.104),
            "a": rounds(0.097, 0.097, 0.097),
            "b": rounds(0.090, 0.090, 0.090),
        },
    )
    assert m.noise == pytest.approx(0.04)
    assert m.ratio("b") == pytest.approx(0.9) and m.ratio("b", "a") == pytest.approx(0.9 / 0.97)
    assert m.threshold == pytest.approx(0.04)
    assert not m.faster("a", ORIGINAL)  # 3% faster is within 4% noise
    assert m.faster("b", ORIGINAL)
    quiet = Measurement("r", 1, {ORIGINAL: [0.100], AGAIN: [0.100], "a": [0.0985]})
    assert quiet.threshold == NOISE_FLOOR
    assert not quiet.faster("a", ORIGINAL)


def test_reserved_labels_are_refused(optimized):
    with pytest.raises(ValueError):
        measure(EXAMPLE, {ORIGINAL: optimized}, FakeRuntime())


def test_unknown_runtime_and_provider_are_one_line_errors():
    with pytest.raises(OpfuseError, match="--provider NoSuchExecutionProvider: not available"):
        get_runtime("onnxruntime", provider="NoSuchExecutionProvider")
    with pytest.raises(OpfuseError, match="--runtime 'tvm'"):
        get_runtime("tvm")


def test_onnxruntime_describes_its_version_and_settings():
    import onnxruntime

    runtime = get_runtime("onnxruntime", threads=1, graph_opt="all")
    assert runtime.describe() == (
        f"onnxruntime {onnxruntime.__version__} CPUExecutionProvider, ORT_ENABLE_ALL, 1 thread"
    )


def test_optimize_benchmark_prints_the_latency_line(tmp_path):
    proc = opfuse(
        "optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--benchmark", "--bench-seconds", "0.2"
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.strip()
    tail = " ".join(text[text.rindex("\nlatency ") + 1 :].split())  # wrapped at the width
    line, _, timed = tail.partition(" timed on inputs ")
    assert timed.startswith("input[1,3,32,32] (generated, seed 0)"), tail
    assert line.startswith("latency ") and "x; noise +-" in line
    # the runtime last, or followed by the caveat a load change between rounds adds (the
    # machine's load is not the test's to fix)
    head, _, tail = line.partition("CPUExecutionProvider, ORT_ENABLE_ALL, 1 thread")
    assert head and (tail == "" or "the paired ratio is the one to trust" in tail), line
    assert "fewer kernels" not in proc.stderr


def test_runtime_options_need_benchmark(tmp_path):
    proc = opfuse("optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--threads", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "opfuse: error: --threads only applies with --benchmark; add it or drop it"
    )
    assert not (tmp_path / "o.onnx").exists()


def test_bad_provider_fails_before_writing(tmp_path):
    proc = opfuse(
        "optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--benchmark", "--provider", "NopeEP"
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--provider NopeEP" in proc.stderr
    assert not (tmp_path / "o.onnx").exists()
