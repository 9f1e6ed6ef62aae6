"""Smoke test of the benchmark harness (bench/): a tiny model through the tools installed in
the test env (opfuse, onnxruntime), a missing tool, a crash, a hang, peak memory, the stacker."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import measure, run, scale, tools  # noqa: E402
from bench.proc import run_python  # noqa: E402

TINY = """
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[N, 4] x) => (float[N, 4] y) {
    i = Identity(x)
    m = MatMul(i, w)
    a = Add(m, b)
    y = Relu(a)
}
"""


def tiny_model(path: Path) -> Path:
    model = onnx.parser.parse_model(TINY)
    rng = np.random.default_rng(1)
    model.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w"),
            onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        ]
    )
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.fixture
def missing_tool(monkeypatch: pytest.MonkeyPatch) -> str:
    fake = tools.Tool("nosuchtool", "nosuchtool", "nosuchtool_xyz", "-", lambda s, d: None)
    monkeypatch.setitem(tools.TOOLS, fake.name, fake)
    return fake.name


def test_run_on_a_tiny_model(tmp_path: Path, missing_tool: str) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    out = tmp_path / "out"
    argv = [str(model), "--no-zoo", "--tools", f"opfuse,ort-basic,{missing_tool}"]
    argv += ["--out", str(out), "--latency-budget", "0.2", "--scale", "off"]
    assert run.main(argv) == 0
    doc = json.loads((out / "results.json").read_text())
    (entry,) = doc["models"]
    rows = entry["rows"]
    assert rows["original"]["nodes"] == 4
    assert rows["original"]["max_abs_err"] == 0
    assert rows[missing_tool] == {"status": "not installed"}
    for tool in ("opfuse", "ort-basic"):
        row = rows[tool]
        assert row["status"] == "ok", row
        assert row["check"] == "ok", row
        assert row["nodes"] < 4  # Identity removed at least
        assert row["max_rel_err"] <= 1e-5
        assert row["optimize_s"] > 0 and row["peak_mb"] > 10
        assert row["latency_off_ratio"] > 0 and row["latency_all_ratio"] > 0
        assert row["session_all_s"] > 0
        assert row["polygraphy"] is True  # polygraphy's default comparison at ORT_ENABLE_ALL
    assert entry["latency_runs"] >= measure.MIN_RUNS
    assert rows[run.CONTROL]["latency_all_ratio"] > 0  # the noise control
    text = (out / "results.md").read_text()
    assert "| opfuse |" in text and "not installed" in text
    assert "python -m bench.run" in text and "nproc" not in text  # described, not raw keys
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["versions"]["onnxruntime"]
    assert not (out / "work").exists()  # optimized models are cleaned up
    assert "polygraphy's default comparison passes on 1/1 models" in text


def test_polygraphy_default_comparison_fails_beyond_its_tolerance() -> None:
    ref = {"y": np.ones(4, np.float32)}
    assert measure.polygraphy_default(ref, {"y": ref["y"] + 1e-6}) is True
    assert measure.polygraphy_default(ref, {"y": ref["y"] + 1e-4}) is False
    assert measure.polygraphy_default(ref, {"z": ref["y"]}) is False


def test_a_crashing_or_hanging_child_is_a_reported_failure() -> None:
    crash = run_python(["-c", "import os; os.abort()"], timeout=30)
    assert crash.returncode == -6 and crash.failure().startswith("killed by signal 6")
    error = run_python(["-c", "raise ValueError('bad model')"], timeout=30)
    assert error.failure() == "exit 1: ValueError: bad model"
    hang = run_python(["-c", "import time; time.sleep(60)"], timeout=0.5)
    assert hang.timed_out and hang.failure() == "timeout after 1 s"
    assert hang.wall_s < 10


def test_peak_memory_is_the_childs_own() -> None:
    big = "b = bytearray(300 * 2**20); import time; time.sleep(0.3)"
    small = "import time; time.sleep(0.3)"
    big_mb = run_python(["-c", big], timeout=30).peak_kb / 1024
    small_mb = run_python(["-c", small], timeout=30).peak_kb / 1024
    assert big_mb >= 300
    assert 0 < small_mb < 100  # not the parent's peak (getrusage would inherit it)


def test_errors_are_scaled_by_the_outputs_magnitude() -> None:
    ref = {"y": np.array([100.0, -200.0, 0.0], np.float32)}
    got = {"y": np.array([100.0, -198.0, 0.001], np.float32)}
    max_abs, max_rel = measure.errors(ref, got)
    assert max_abs == pytest.approx(2.0) and max_rel == pytest.approx(0.01)
    assert measure.errors(ref, {"y": np.zeros(2, np.float32)}) == (float("inf"), float("inf"))


def test_stacked_model_chains_the_copies(tmp_path: Path) -> None:
    one = tiny_model(tmp_path / "tiny.onnx")
    stacked = tmp_path / "stacked.onnx"
    assert scale.stack([one, one, one], stacked) == 12
    onnx.checker.check_model(onnx.load(str(stacked)), full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    single = measure.session(str(one), "off")
    expected = x
    for _ in range(3):
        (expected,) = single.run(None, {"x": expected})
    (got,) = measure.session(str(stacked), "off").run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_latency_behind_the_best_within_the_noise_is_counted_apart() -> None:
    from bench import report

    def model(name: str, control: float) -> dict:
        row = {"nodes": 10, "max_rel_err": 0.0, "status": "ok", "check": "ok", "optimize_s": 1.0}
        return {
            "model": name,
            "rows": {
                "opfuse": {**row, "latency_all_ratio": 1.00},
                "onnxslim": {**row, "latency_all_ratio": 0.97},
                "original again": {"latency_all_ratio": control},
            },
        }

    doc = {
        "settings": {"valid_rel_err": 1e-3},
        "models": [model("noisy", 0.95), model("quiet", 0.99)],
    }
    goals = report.goals(doc)
    assert goals["latency_ok_vs_best"] == "0/2"
    assert goals["models"]["noisy"]["latency_within_noise_of_best"] is True
    assert goals["models"]["quiet"]["latency_within_noise_of_best"] is False
    assert goals["latency_within_noise_of_best"] == 1


def test_tuned_row_is_judged_against_original_default_and_best_other() -> None:
    from bench import report

    def model(name: str, tuned: float, control: float = 0.99) -> dict:
        row = {"nodes": 10, "max_rel_err": 0.0, "status": "ok", "check": "ok", "optimize_s": 1.0}
        return {
            "model": name,
            "rows": {
                "opfuse": {**row, "latency_all_ratio": 0.95},
                "opfuse-tune": {**row, "latency_all_ratio": tuned},
                "onnxslim": {**row, "latency_all_ratio": 0.90},
                "original again": {"latency_all_ratio": control},
            },
        }

    doc = {
        "settings": {"valid_rel_err": 1e-3},
        "models": [model("fast", 0.81), model("slow", 1.005), model("worse", 1.05)],
    }
    goals = report.goals(doc)
    fast, slow, worse = (goals["models"][m] for m in ("fast", "slow", "worse"))
    assert goals["models"]["fast"]["best_other_latency_all"] == ["onnxslim", 0.90]  # not ours
    assert fast["tuned_ok_vs_best"] and not slow["tuned_ok_vs_best"]
    assert slow["tuned_ok_vs_original"] and not worse["tuned_ok_vs_original"]  # noise 1%
    assert fast["tuned_ok_vs_default"] and not slow["tuned_ok_vs_default"]
    assert goals["tuned_beat_best"] == ["fast"]
    assert goals["tuned_geomean"] == pytest.approx((0.81 * 1.005 * 1.05) ** (1 / 3))
    assert goals["tuned_ok_vs_original"] == "2/3"
