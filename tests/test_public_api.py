"""The public Python API: opfuse.optimize / verify / passes / InferenceSession on paths,
ModelProtos and onnx_ir Models, and what a result says about itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import opfuse
from opfuse.errors import OpfuseError, VerificationError

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"
FEED = {"input": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def run_plain(model: str | bytes) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, FEED)


def test_the_package_exports_its_api_with_docstrings():
    for name in opfuse.__all__:
        value = getattr(opfuse, name)
        if name != "__version__":
            assert value.__doc__, name
    assert {"optimize", "verify", "passes", "InferenceSession", "Options"} <= set(dir(opfuse))
    import importlib

    from opfuse.rules import all_passes

    importlib.import_module("opfuse.rules.batchnorm")  # a submodule import must not rebind

    all_passes()
    assert callable(opfuse.verify) and opfuse.verify.__module__ == "opfuse.api"
    assert callable(opfuse.passes) and opfuse.passes() == all_passes()
    assert callable(opfuse.tune) and opfuse.tune.__module__ == "opfuse.api"
    assert (Path(opfuse.__file__).parent / "py.typed").exists()


def test_a_model_proto_in_gives_a_model_proto_out_and_is_left_unchanged():
    proto = onnx.load(str(EXAMPLE))
    before = proto.SerializeToString()
    result = opfuse.optimize(proto)
    assert isinstance(result.model, onnx.ModelProto)
    assert proto.SerializeToString() == before
    ops = [n.op_type for n in result.model.graph.node]
    assert "BatchNormalization" not in ops and "Identity" not in ops
    assert result.verify is not None and result.verify.ok
    np.testing.assert_allclose(
        run_plain(result.model.SerializeToString())[0], run_plain(str(EXAMPLE))[0], 1e-4, 1e-5
    )


def test_an_ir_model_in_gives_an_ir_model_out_and_is_left_unchanged():
    model = ir.load(str(EXAMPLE))
    n_before = len(list(model.graph))
    result = opfuse.optimize(model)
    assert isinstance(result.model, ir.Model) and result.model is not model
    assert len(list(model.graph)) == n_before
    assert len(list(result.model.graph)) == sum(result.after.values()) < n_before


def test_a_path_in_gives_an_ir_model_and_writes_only_when_asked(tmp_path):
    result = opfuse.optimize(EXAMPLE)
    assert isinstance(result.model, ir.Model) and result.output is None
    out = tmp_path / "o.onnx"
    written = opfuse.optimize(str(EXAMPLE), output=out, disable=["ConvBatchNormFusionPass"])
    assert written.output == out
    assert "BatchNormalization" in [n.op_type for n in onnx.load(str(out)).graph.node]


def test_repr_is_one_short_line_and_summary_says_what_changed(tmp_path):
    result = opfuse.optimize(onnx.load(str(EXAMPLE)))
    text = repr(result)
    assert "\n" not in text and len(text) < 200
    assert "nodes 15 -> 9" in text and "verification ok" in text
    summary = result.summary()
    assert "BatchNormalization 3 -> 0" in summary and "ConvBatchNormFusionPass" in summary
    assert "verification: ok" in summary and "input[1,3,32,32] (generated, seed 0)" in summary
    assert result.save(tmp_path / "s.onnx") == tmp_path / "s.onnx"
    assert onnx.load(str(tmp_path / "s.onnx")).graph.node


def test_a_run_where_no_pass_changes_anything_says_so():
    once = opfuse.optimize(onnx.load(str(EXAMPLE))).model
    again = opfuse.optimize(once)
    assert not again.changed and again.fired() == []
    assert "no pass changed the model" in again.summary()


def test_in_memory_verify_reports_bound_share_and_inputs():
    original = onnx.load(str(EXAMPLE))
    optimized = opfuse.optimize(original).model
    report = opfuse.verify(original, optimized, seed=3)
    assert report.ok and report.seed == 3
    assert report.input_shapes == {"input": [1, 3, 32, 32]}
    (out,) = report.outputs
    assert 0 <= out.used < 1 and out.abs_bound >= 1e-5
    broken = onnx.load(str(EXAMPLE))
    for init in broken.graph.initializer:
        if init.name.endswith("bias") or "beta" in init.name or init.name.endswith("B"):
            arr = onnx.numpy_helper.to_array(init) + 1.0
            init.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), init.name))
    bad = opfuse.verify(original, broken)
    assert not bad.ok and bad.outputs[0].used > 1


def test_bad_model_and_bad_options_are_opfuse_errors(tmp_path):
    with pytest.raises(OpfuseError, match="expected a path, an onnx.ModelProto"):
        opfuse.optimize(42)  # type: ignore[call-overload]
    with pytest.raises(OpfuseError, match="target='tpu': unknown; the known targets"):
        opfuse.optimize(EXAMPLE, target="tpu")
    with pytest.raises(OpfuseError, match="no such file"):
        opfuse.optimize(tmp_path / "missing.onnx")


def test_to_json_holds_counts_passes_verification_and_timings():
    data = opfuse.optimize(onnx.load(str(EXAMPLE))).to_json()
    json.dumps(data)
    assert data["nodes"] == {"before": 15, "after": 9}
    assert data["changed"] is True and data["rounds"] >= 1
    bn = next(p for p in data["passes"] if p["name"] == "ConvBatchNormFusionPass")
    assert bn["matched"] == 3 and bn["effected"] == 3
    assert data["verification"]["ok"] is True
    assert data["verification"]["outputs"][0]["name"] == "logits"
    assert {"load", "optimize", "verify", "write"} <= set(data["timings"])


def test_inference_session_runs_the_optimized_model_and_leaves_the_file_alone(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(EXAMPLE.read_bytes())
    before = path.read_bytes()
    sess = opfuse.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert isinstance(sess, ort.InferenceSession)
    assert path.read_bytes() == before
    assert sess.optimize_result.changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    got = sess.run(None, FEED)[0]
    np.testing.assert_allclose(got, run_plain(str(path))[0], rtol=1e-4, atol=1e-5)
    assert [i.name for i in sess.get_inputs()] == ["input"]


def test_inference_session_takes_a_model_proto_and_optimize_options():
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = opfuse.InferenceSession(
        onnx.load(str(EXAMPLE)), opts, disable=["ConvBatchNormFusionPass"], verify=False
    )
    assert sess.get_session_options().graph_optimization_level == opts.graph_optimization_level
    assert sess.optimize_result.verify is None
    assert "ConvBatchNormFusionPass" not in sess.optimize_result.fired()
    with pytest.raises(OpfuseError, match="takes no output"):
        opfuse.InferenceSession(str(EXAMPLE), output="x.onnx")


def break_batchnorm(monkeypatch):
    """A deliberately wrong ConvBatchNormFusionPass: its bias is off by one."""
    from opfuse.rules import batchnorm

    real = batchnorm.bn_affine

    def wrong(m, bn="bn"):
        s, t = real(m, bn)
        return s, t + 1.0

    monkeypatch.setattr(batchnorm, "bn_affine", wrong)


def test_a_wrong_pass_is_named_by_the_bisection(monkeypatch, tmp_path):
    break_batchnorm(monkeypatch)
    saved = tmp_path / "failing.npz"
    with pytest.raises(VerificationError) as exc:
        opfuse.optimize(onnx.load(str(EXAMPLE)), save_failing_inputs=saved)
    assert exc.value.culprit == "ConvBatchNormFusionPass"
    message = str(exc.value)
    assert "try --disable ConvBatchNormFusionPass" in message
    assert "of its bound" in message and "input[1,3,32,32] (generated, seed 0)" in message
    with np.load(saved) as data:
        assert data["input"].shape == (1, 3, 32, 32)
    # the saved inputs reproduce the failure; without the culprit it verifies
    with pytest.raises(VerificationError):
        opfuse.optimize(EXAMPLE, verify_inputs=saved, bisect=False)
    ok = opfuse.optimize(EXAMPLE, verify_inputs=saved, disable=["ConvBatchNormFusionPass"])
    assert ok.verify is not None and ok.verify.ok and ok.verify.seed is None


def test_mypy_sees_concrete_types_in_a_user_script(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "import onnx\nimport opfuse\n"
        "r = opfuse.optimize(onnx.load('m.onnx'))\n"
        "reveal_type(r.model)\n"
        "s = opfuse.InferenceSession('m.onnx')\n"
        "reveal_type(s.optimize_result.summary())\n"
        "reveal_type(opfuse.verify('a.onnx', 'b.onnx').ok)\n"
        "opfuse.optimize('m.onnx', disabel=['X'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert 'Revealed type is "onnx.onnx_ml_pb2.ModelProto"' in proc.stdout, proc.stdout
    assert 'user.py:6: note: Revealed type is "str"' in proc.stdout, proc.stdout
    assert 'user.py:7: note: Revealed type is "bool"' in proc.stdout, proc.stdout
    assert "user.py:8: error:" in proc.stdout and '"disabel"' in proc.stdout, proc.stdout


def test_a_pass_that_breaks_the_model_for_onnxruntime_is_blamed(monkeypatch):
    """An optimized model onnxruntime cannot load is a failed verification (exit 1) with
    the pass to blame, not bad input."""
    from opfuse.rules import batchnorm

    real = batchnorm.bn_affine

    def wrong_length(m, bn="bn"):
        s, t = real(m, bn)
        return s, np.concatenate([t, t[:1]])  # one bias too many for the Conv

    monkeypatch.setattr(batchnorm, "bn_affine", wrong_length)
    with pytest.raises(VerificationError) as exc:
        opfuse.optimize(onnx.load(str(EXAMPLE)))
    assert exc.value.culprit == "ConvBatchNormFusionPass"
    assert "the optimized model" in str(exc.value) and "opfuse-" not in str(exc.value)
    assert "try --disable ConvBatchNormFusionPass" in str(exc.value)


def test_importing_opfuse_is_cheap_and_names_load_on_first_use():
    code = (
        "import sys, opfuse; heavy = {'onnxruntime', 'onnx_ir'} & set(sys.modules); "
        "assert not heavy, heavy; assert set(opfuse.__all__) <= set(dir(opfuse)); "
        "from opfuse.verification.compare import compare_files; import opfuse.rules.batchnorm; "
        "assert callable(opfuse.verify) and callable(opfuse.passes) and callable(opfuse.tune); "
        "assert opfuse.optimize.__module__ == 'opfuse.api'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_tune_is_public_and_writes_the_variant_its_switch_file_and_command(tmp_path):
    out = tmp_path / "convnet.tuned.onnx"
    result = opfuse.tune(EXAMPLE, out, budget=3, bench_seconds=0.2)
    assert isinstance(result, opfuse.TuneResult)
    assert out.exists() and onnx.load(str(out)).graph.node
    switch = json.loads((tmp_path / "convnet.tuned.onnx.fusion_switch.cfg").read_text())
    assert "Switch" in switch
    assert result.switch_file == tmp_path / "convnet.tuned.onnx.fusion_switch.cfg"
    # the original itself when nothing beat it on this machine (a copy), else the rebuild
    rebuild = "cp " if result.best.original else "opfuse optimize "
    assert result.command.startswith(rebuild) and str(out) in result.command
    assert result.trials and result.ratio > 0


def test_tune_refuses_a_bad_budget_before_any_work(tmp_path):
    with pytest.raises(opfuse.OpfuseError, match="budget=0: must be more than 0"):
        opfuse.tune(EXAMPLE, tmp_path / "x.onnx", budget=0)
    assert list(tmp_path.iterdir()) == []


def test_the_package_re_exports_exactly_the_api_modules_names():
    import opfuse.api

    assert set(opfuse.__all__) - {"__version__"} == set(opfuse.api.__all__)
    for name in opfuse.api.__all__:
        assert getattr(opfuse, name) is getattr(opfuse.api, name), name
