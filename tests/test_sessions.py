"""The one session opener (``opfuse.model.sessions.open_session``) and the one VmHWM reader
(``opfuse.runtime.memory.vmhwm_bytes``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from opfuse.errors import OpfuseError
from opfuse.model.sessions import SessionError, open_session
from opfuse.runtime.memory import vmhwm_bytes


def _model() -> onnx.ModelProto:
    """x -> Identity -> Relu -> y: onnxruntime's basic level removes the Identity."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["t"], name="id"),
            helper.make_node("Relu", ["t"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _saved_ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load_model(str(path)).graph.node]


def test_a_path_bytes_or_proto_opens_at_the_log_level_and_threads_asked(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save_model(_model(), str(path))
    x = np.array([[-1, 0, 1], [2, -3, 4]], np.float32)
    for source in (path, str(path), _model().SerializeToString(), _model()):
        sess = open_session(source, threads=2)
        opts = sess.get_session_options()
        assert opts.log_severity_level == 4  # a refusal is our one line, not a log line too
        assert opts.intra_op_num_threads == 2
        assert sess.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    quiet = open_session(path, threads=0, log_level=3).get_session_options()
    assert (quiet.log_severity_level, quiet.intra_op_num_threads) == (3, 0)


def test_the_graph_optimization_level_reaches_the_session(tmp_path):
    off, basic = tmp_path / "off.onnx", tmp_path / "basic.onnx"
    sess = open_session(_model(), graph_opt="off", optimized_path=off)
    level = sess.get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert _saved_ops(off) == ["Identity", "Relu"]
    open_session(_model(), graph_opt="basic", optimized_path=basic)
    assert _saved_ops(basic) == ["Relu"]  # the Identity elimination ran
    disable = open_session(_model(), graph_opt="disable").get_session_options()
    assert disable.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(KeyError):
        open_session(_model(), graph_opt="most")


def test_execution_mode_inter_threads_and_profiling_reach_the_session(tmp_path):
    sess = open_session(
        _model(),
        execution_mode="parallel",
        inter_threads=2,
        profile_prefix=tmp_path / "prof",
    )
    opts = sess.get_session_options()
    assert opts.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert opts.inter_op_num_threads == 2
    assert opts.enable_profiling
    sess.run(None, {"x": np.zeros((2, 3), np.float32)})
    profile = Path(sess.end_profiling())
    assert profile.name.startswith("prof") and profile.exists()
    # left unset: onnxruntime's defaults
    plain = open_session(_model()).get_session_options()
    assert plain.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert plain.inter_op_num_threads == 0 and not plain.enable_profiling


def test_providers_and_the_cpu_fallback():
    assert open_session(
        _model(), provider="CPUExecutionProvider", cpu_fallback=True
    ).get_providers() == ["CPUExecutionProvider"]
    assert open_session(_model(), provider=["CPUExecutionProvider"]).get_providers() == [
        "CPUExecutionProvider"
    ]


def test_a_model_onnxruntime_refuses_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(SessionError) as info:
        open_session(bad)
    message = str(info.value)
    assert isinstance(info.value, OpfuseError) and info.value.exit_code == 2
    assert message.startswith(f"{bad}: onnxruntime cannot load the model: ")
    assert "\n" not in message and info.value.detail in message and info.value.detail
    with pytest.raises(SessionError, match=r"^shown\.onnx: onnxruntime cannot load") as named:
        open_session(bad, name="shown.onnx")
    assert str(bad) not in str(named.value)  # a temporary copy is never named, even in the detail
    with pytest.raises(SessionError, match=r"^onnxruntime cannot load the model: "):
        open_session(b"not a model")  # in memory: no name unless given
    with pytest.raises(SessionError, match=r"^onnxruntime cannot load the model: "):
        open_session(bad, name="")


def test_a_model_opfuse_built_lets_onnxruntimes_exception_through(tmp_path):
    with pytest.raises(Exception) as info:
        open_session(b"not a model", errors="onnxruntime")
    assert not isinstance(info.value, OpfuseError)  # an internal failure: exit status 3


def test_the_opener_logs_nothing_before_the_one_line_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    code = (
        "import sys\nfrom opfuse.model.sessions import open_session\n"
        "try:\n    open_session(sys.argv[1])\nexcept Exception as exc:\n    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(bad)], capture_output=True, text=True, check=True
    )
    assert proc.stderr == ""
    assert proc.stdout.startswith(f"{bad}: onnxruntime cannot load the model: ")


def test_vmhwm_reads_this_process_peak_and_is_the_one_reader():
    from opfuse.batching import isolate

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import proc

    peak = vmhwm_bytes()
    assert peak > 0 and peak % 1024 == 0
    assert vmhwm_bytes(os.getpid()) >= peak  # the high-water mark never falls
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            assert abs(int(line.split()[1]) * 1024 - peak) < 64 * 2**20
    assert 0 < proc.vmhwm_kb() <= vmhwm_bytes() // 1024
    assert isolate.vmhwm_bytes is vmhwm_bytes


def test_vmhwm_of_a_process_that_is_gone_is_zero():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert vmhwm_bytes(child.pid) == 0
    assert vmhwm_bytes("no-such-process") == 0
