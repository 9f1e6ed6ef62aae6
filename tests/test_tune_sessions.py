"""tune's session-settings search, on fake runtimes whose latency depends on the settings
(deterministic): a faster setting is kept, nothing beating the noise keeps the start, a
runtime that cannot load is reported and skipped; the session file's schema, reading it
back, and InferenceSession(session_file=) applying it; bad session files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import opfuse
from opfuse.errors import OpfuseError
from opfuse.runtime.fake import FakeClock, FakeRuntime
from opfuse.runtime.settings import SessionSettings, read_session_file
from opfuse.tuning import search as tuning
from opfuse.tuning.session_search import axes, search_sessions


def small_model(path: Path) -> Path:
    graph = h.make_graph(
        [
            h.make_node("Mul", ["x", "one"], ["m"], name="mul"),
            h.make_node("Relu", ["m"], ["y"], name="relu"),
        ],
        "small",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
        initializer=[h.make_tensor("one", T.FLOAT, [], [1.0])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def fake_sessions(speed: dict[SessionSettings, float], fail: set[str] = frozenset()):  # type: ignore[assignment]
    """Runtimes sharing one clock; a setting's latency is scaled by ``speed`` (1.0 when
    absent); runtimes named in ``fail`` cannot be made."""
    clock = FakeClock()

    def make(settings: SessionSettings) -> FakeRuntime:
        if settings.runtime in fail:
            raise OpfuseError(f"--runtime {settings.runtime}: not installed")
        return FakeRuntime(default=0.01, clock=clock, scale=speed.get(settings, 1.0))

    return make


FEEDS = {"x": np.ones((1, 8), np.float32)}
START = SessionSettings()


def test_a_faster_thread_count_is_kept(tmp_path):
    model = small_model(tmp_path / "m.onnx")
    two = SessionSettings(intra_op_num_threads=2)
    found = search_sessions(
        model, START, FEEDS, max_threads=4, seconds=0.05, make_runtime=fake_sessions({two: 0.6})
    )
    assert found.best == two
    assert found.ratio == pytest.approx(0.6)
    kept = [t for t in found.trials if t.kept]
    assert [t.settings for t in kept] == [two] and "confirmed" in kept[0].note
    tried = {t.settings.intra_op_num_threads for t in found.trials}
    assert tried == {2, 4}  # 1 is the start; the axis goes to max_threads


def test_nothing_beating_the_noise_keeps_the_start(tmp_path):
    model = small_model(tmp_path / "m.onnx")
    speed = {SessionSettings(intra_op_num_threads=2): 0.99}  # within NOISE_FLOOR (2%)
    found = search_sessions(
        model, START, FEEDS, max_threads=2, seconds=0.05, make_runtime=fake_sessions(speed)
    )
    assert found.best == START and found.ratio == 1.0
    assert not any(t.kept for t in found.trials)


def test_the_axes_build_on_the_best_so_far(tmp_path):
    """A faster level on top of the faster thread count: both kept, in that order."""
    model = small_model(tmp_path / "m.onnx")
    two = SessionSettings(intra_op_num_threads=2)
    two_ext = SessionSettings(intra_op_num_threads=2, graph_optimization_level="extended")
    found = search_sessions(
        model,
        START,
        FEEDS,
        max_threads=2,
        seconds=0.05,
        make_runtime=fake_sessions({two: 0.7, two_ext: 0.5}),
    )
    assert found.best == two_ext
    assert found.ratio == pytest.approx(0.5)


def test_a_runtime_that_cannot_load_is_reported_not_kept(tmp_path):
    model = small_model(tmp_path / "m.onnx")
    found = search_sessions(
        model,
        START,
        FEEDS,
        max_threads=1,
        runtimes=("onnxruntime", "openvino"),
        seconds=0.05,
        make_runtime=fake_sessions({}, fail={"openvino"}),
    )
    [ov] = [t for t in found.trials if t.settings.runtime == "openvino"]
    assert not ov.kept and "not installed" in ov.note and found.best == START


def test_the_budget_stops_the_session_search(tmp_path):
    model = small_model(tmp_path / "m.onnx")
    found = search_sessions(
        model, START, FEEDS, seconds=0.05, make_runtime=fake_sessions({}), time_left=lambda: False
    )
    assert found.budget_spent and found.trials == []


def test_axes_stay_within_max_threads():
    [threads, *_] = axes(START, 6, ("onnxruntime",))
    assert [s.intra_op_num_threads for s in threads] == [1, 2, 4, 6]


def test_tune_writes_the_session_file_and_inference_session_applies_it(tmp_path):
    model = small_model(tmp_path / "m.onnx")
    two = SessionSettings(intra_op_num_threads=2)
    settings = tuning.SearchSettings(
        budget_s=60,
        bench_seconds=0.05,
        session_search=True,
        max_threads=2,
        session_runtime=fake_sessions({two: 0.5}),
    )
    out, switch, session = tmp_path / "o.onnx", tmp_path / "o.cfg", tmp_path / "o.session.json"

    def keep(result, built):
        tuning.write_outputs(result, built, model, out, switch, session_file=session)

    result = tuning.tune(model, FakeRuntime(default=0.01), settings, keep=keep)
    assert result.session is not None and result.session.best == two
    assert result.session_file == session
    data = json.loads(session.read_text())
    assert data["schema"] == "opfuse.session/2"
    assert data["intra_op_num_threads"] == 2 and data["execution_mode"] == "sequential"
    assert data["measured"]["session"]["latency_ratio_to_start"] == pytest.approx(0.5)
    assert read_session_file(session) == dataclasses.replace(two, provider="CPUExecutionProvider")
    assert result.to_json()["session"]["chosen"] == two.label

    sess = opfuse.InferenceSession(str(out), session_file=session, verify=False)
    assert sess.deployed == "as written"
    options = sess.get_session_options()
    assert options.intra_op_num_threads == 2
    assert sess.get_providers() == ["CPUExecutionProvider"]
    y = sess.run(None, FEEDS)[0]
    assert np.array_equal(y, np.maximum(FEEDS["x"], 0))


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        ('{"schema": "other"}', "not an opfuse session file"),
        ('{"schema": "opfuse.session/1", "intra_op_num_threads": -1}', "not a count of threads"),
        ('{"schema": "opfuse.session/1", "execution_mode": "fast"}', "execution_mode 'fast'"),
        ('{"schema": "opfuse.session/1", "runtime": "tvm"}', "runtime 'tvm'"),
    ],
)
def test_a_bad_session_file_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(OpfuseError, match=message) as info:
        read_session_file(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_session_file_and_sess_options_together_are_refused(tmp_path):
    import onnxruntime as ort

    path = tmp_path / "s.json"
    path.write_text(json.dumps(SessionSettings().to_json()))
    with pytest.raises(OpfuseError, match="not both"):
        opfuse.InferenceSession(
            str(small_model(tmp_path / "m.onnx")), ort.SessionOptions(), session_file=path
        )


def test_tune_cli_session_options(tmp_path):
    model = small_model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    run = subprocess.run(
        [
            sys.executable, "-m", "opfuse", "tune", str(model), "-o", str(out),
            "--budget", "20", "--bench-seconds", "0.1", "--max-threads", "2",
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "session settings" in run.stdout and "session file:" in run.stdout
    assert read_session_file(tmp_path / "o.onnx.session.json").runtime == "onnxruntime"
    bad = subprocess.run(
        [sys.executable, "-m", "opfuse", "tune", str(model), "-o", str(tmp_path / "b.onnx"),
         "--runtimes", "onnxruntime,tvm"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and "--runtimes 'tvm'" in bad.stderr
    assert not (tmp_path / "b.onnx").exists()
    none = subprocess.run(
        [sys.executable, "-m", "opfuse", "tune", str(model), "-o", str(tmp_path / "n.onnx"),
         "--budget", "10", "--bench-seconds", "0.1", "--no-session-search"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert none.returncode == 0
    # the graph settings and the session settings it was measured at, searched or not
    written = json.loads((tmp_path / "n.onnx.session.json").read_text())
    assert written["measured"]["session"] is None and "graph" in written
    assert written["intra_op_num_threads"] == 1
