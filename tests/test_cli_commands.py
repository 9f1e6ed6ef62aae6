"""The command line end to end: optimize with a switch file, the effect log and
fusion_result.json, passes, verify, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"


def opfuse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opfuse", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_switch_file_runs_only_that_pass_and_the_mandatory_ones(tmp_path):
    switch = tmp_path / "fusion_switch.cfg"
    switch.write_text(
        json.dumps({"Switch": {"GraphFusion": {"ALL": "off", "ConvBatchNormFusionPass": "on"}}})
    )
    result_file = tmp_path / "fusion_result.json"
    proc = opfuse(
        "optimize",
        EXAMPLE,
        "-o",
        tmp_path / "o.onnx",
        "--fusion-switch-file",
        switch,
        "--fusion-result",
        result_file,
        "--log-level",
        "info",
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[INFO] OPFUSE")]
    assert "[INFO]" not in proc.stdout  # logs go to stderr, the summary to stdout
    passes_logged = {ln.split("[")[2].split("]")[0] for ln in lines}
    assert passes_logged == {"ConvBatchNormFusionPass", "DeadCodeFusionPass"}
    assert (
        "[INFO] OPFUSE GraphFusionPass[ConvBatchNormFusionPass]: pattern=conv_bn, "
        "matched_times=3, effected_times=3."
    ) in lines
    result = json.loads(result_file.read_text())
    assert result["graph_fusion"]["ConvBatchNormFusionPass"] == {
        "match_times": "3",
        "effect_times": "3",
    }
    assert set(result) == {"graph_fusion", "ub_fusion"}
    import onnx

    ops = [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node]
    assert "BatchNormalization" not in ops and "Identity" in ops and "Dropout" in ops


def test_default_optimize_prints_summary_and_verifies(tmp_path):
    proc = opfuse("optimize", EXAMPLE, "-o", tmp_path / "o.onnx")
    assert proc.returncode == 0, proc.stderr
    assert "verification: ok" in proc.stdout
    assert "BatchNormalization" in proc.stdout  # the before/after table


def test_disable_on_the_command_line(tmp_path):
    proc = opfuse(
        "optimize",
        EXAMPLE,
        "-o",
        tmp_path / "o.onnx",
        "--disable",
        "ConvBatchNormFusionPass",
        "--fusion-result",
        tmp_path / "r.json",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "ConvBatchNormFusionPass"
        not in json.loads((tmp_path / "r.json").read_text())["graph_fusion"]
    )


def test_passes_table_and_json():
    proc = opfuse("passes", "--format", "json")
    rows = json.loads(proc.stdout)
    names = [r["name"] for r in rows]
    assert "ConvBatchNormFusionPass" in names and "DeadCodeFusionPass" in names
    dead = next(r for r in rows if r["name"] == "DeadCodeFusionPass")
    assert dead["mandatory"] is True and dead["section"] == "GraphFusion"
    table = opfuse("passes")
    assert table.returncode == 0 and "ConvBatchNormFusionPass" in table.stdout


def test_verify_command(tmp_path):
    out = tmp_path / "o.onnx"
    assert opfuse("optimize", EXAMPLE, "-o", out).returncode == 0
    proc = opfuse("verify", EXAMPLE, out, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


@pytest.mark.parametrize(
    "args,message",
    [
        (["optimize", "missing.onnx", "-o", "o.onnx"], "missing.onnx: no such file"),
        (
            ["optimize", EXAMPLE, "-o", "o.onnx", "--enable", "ConvBatchNormFusionPas"],
            "did you mean ConvBatchNormFusionPass",
        ),
        (["optimize", EXAMPLE, "-o", "nowhere/o.onnx"], "does not exist"),
        (["optimize", EXAMPLE], "Missing option '-o'"),
    ],
)
def test_errors_are_one_line_with_exit_status_2(tmp_path, args, message):
    args = [
        str(tmp_path / a) if a in ("missing.onnx", "nowhere/o.onnx", "o.onnx") else a for a in args
    ]
    proc = opfuse(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_fold_size_limit_blocks_or_allows_a_constant_of_shape_fold(tmp_path):
    import onnx
    import onnx_ir as ir

    src = tmp_path / "cos.onnx"
    ir.save(
        ir.from_onnx_text(
            '<ir_version: 8, opset_import: ["" : 17]>\n'
            "g (float[20,30] x) => (float[20,30] y) {\n"
            " s = Constant<value=int64[2] {20,30}>()\n"
            " z = ConstantOfShape<value=float[1] {2}>(s)\n y = Add(x, z)\n}"
        ),
        src,
    )
    ops = {}
    for limit in ("1000", "4096"):  # the result is 20*30 floats: 2400 bytes
        out = tmp_path / f"o{limit}.onnx"
        proc = opfuse(
            "optimize", src, "-o", out, "--fold-size-limit", limit, "--log-level", "debug"
        )
        assert proc.returncode == 0, proc.stderr
        ops[limit] = [n.op_type for n in onnx.load(str(out)).graph.node]
        if limit == "1000":
            assert "result of 2400 bytes exceeds --fold-size-limit 1000" in proc.stderr
    assert ops["1000"] == ["ConstantOfShape", "Add"]
    assert ops["4096"] == ["Add"]


def test_verify_an_optimized_model_that_cannot_run_is_a_failed_verification(tmp_path):
    """The original runs on the inputs; an optimized model that does not (here a Reshape
    to a size the input does not have) fails verification: exit status 1, one line."""
    import onnx_ir as ir

    header = '<ir_version: 8, opset_import: ["" : 17]>\n'
    good, bad = tmp_path / "a.onnx", tmp_path / "b.onnx"
    ir.save(ir.from_onnx_text(header + "g (float[1,4] x) => (float[1,4] y) { y = Relu(x) }"), good)
    ir.save(
        ir.from_onnx_text(
            header + "g (float[1,4] x) => (float[1,4] y) {\n"
            " s = Constant<value=int64[2] {3,3}>()\n r = Reshape(x, s)\n y = Relu(r)\n}"
        ),
        bad,
    )
    proc = opfuse("verify", good, bad)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert f"{bad}: onnxruntime cannot run the model on inputs x [1, 4]" in proc.stderr


@pytest.mark.parametrize(
    "kwargs",
    [{"input_shapes": {"input": [1, 3, 8]}}, {"inputs_npz": "missing.npz"}],
    ids=["wrong rank", "missing npz"],
)
def test_optimize_checks_verification_inputs_before_it_works(tmp_path, monkeypatch, kwargs):
    """A bad --input-shape or .npz fails at once, not after the optimization."""
    from opfuse.errors import OpfuseError
    from opfuse.pipeline import conductor as api

    def must_not_run(*args, **kw):
        raise AssertionError("optimized before checking the verification inputs")

    monkeypatch.setattr(api, "optimize_model", must_not_run)
    if "inputs_npz" in kwargs:
        kwargs = {"inputs_npz": tmp_path / kwargs["inputs_npz"]}
    with pytest.raises(OpfuseError):
        api.optimize_file(EXAMPLE, tmp_path / "out.onnx", **kwargs)
    assert not (tmp_path / "out.onnx").exists()
