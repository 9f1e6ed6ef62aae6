"""The command line a user can script and act on: JSON summaries with clean stdout, a
failed verification that names the pass to blame, options under their new names with
the old ones as deprecated aliases, validated --target, typo suggestions, compact tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import run_command
from opfuse import cli
from opfuse.cli import console
from opfuse.pipeline.suggest import closest
from opfuse.verification.bisect import first_bad_pass

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"


def run(args, monkeypatch, capsys) -> tuple[int, str, str]:
    return run_command(args, monkeypatch, capsys)


def test_json_summary_parses_and_info_logs_leave_stdout_clean(tmp_path, monkeypatch, capsys):
    out = tmp_path / "o.onnx"
    status, stdout, stderr = run(
        ["optimize", EXAMPLE, "-o", out, "--format", "json", "--log-level", "debug"],
        monkeypatch,
        capsys,
    )
    assert status == 0, stderr
    data = json.loads(stdout)
    assert data["output"] == str(out) and data["nodes"] == {"before": 15, "after": 9}
    assert data["op_types"]["BatchNormalization"] == {"before": 3, "after": 0}
    bn = next(p for p in data["passes"] if p["name"] == "ConvBatchNormFusionPass")
    assert (bn["matched"], bn["effected"]) == (3, 3)
    (output,) = data["verification"]["outputs"]
    assert output["ok"] and 0 <= output["used"] < 1 and output["abs_bound"] > 0
    assert data["verification"]["input_shapes"] == {"input": [1, 3, 32, 32]}
    assert {"load", "optimize", "verify", "write"} <= set(data["timings"])
    assert "[INFO] OPFUSE GraphFusionPass[ConvBatchNormFusionPass]" in stderr


def test_table_summary_shows_bound_share_inputs_and_phase_times(tmp_path, monkeypatch, capsys):
    status, stdout, stderr = run(
        ["optimize", EXAMPLE, "-o", tmp_path / "o.onnx"], monkeypatch, capsys
    )
    assert status == 0, stderr
    assert "verification: ok on inputs input[1,3,32,32] (generated, seed 0)" in stdout
    assert "bound 1.05e-05 + 0.0001*|ref|" in stdout and "of its bound: ok" in stdout
    assert "time: load" in stdout and "verify" in stdout and "write" in stdout
    assert "..." not in stderr  # no spinner when stderr is not a terminal


def test_no_pass_changed_the_model_is_said_plainly(tmp_path, monkeypatch, capsys):
    switch = tmp_path / "off.cfg"
    switch.write_text(json.dumps({"Switch": {"GraphFusion": {"ALL": "off"}}}))
    status, stdout, _ = run(
        ["optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--fusion-switch-file", switch],
        monkeypatch,
        capsys,
    )
    assert status == 0 and "no pass changed the model" in stdout
    status, stdout, _ = run(["optimize", EXAMPLE, "-o", tmp_path / "p.onnx"], monkeypatch, capsys)
    assert status == 0 and "no pass changed the model" not in stdout


def test_a_wrong_pass_fails_optimize_naming_it_with_the_disable_hint(tmp_path, monkeypatch, capsys):
    from opfuse.rules import batchnorm

    real = batchnorm.bn_affine
    monkeypatch.setattr(
        batchnorm, "bn_affine", lambda m, bn="bn": (real(m, bn)[0], real(m, bn)[1] + 1)
    )
    out, saved = tmp_path / "o.onnx", tmp_path / "failing.npz"
    status, stdout, stderr = run(
        ["optimize", EXAMPLE, "-o", out, "--save-failing-inputs", saved], monkeypatch, capsys
    )
    assert status == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opfuse: error: verification failed:")
    assert "output 'logits' differs by" in lines[0] and "of its bound" in lines[0]
    assert "the first pass whose output differs is ConvBatchNormFusionPass" in lines[0]
    assert "try --disable ConvBatchNormFusionPass" in lines[0]
    assert f"inputs saved to {saved}" in lines[0]
    assert not out.exists() and saved.exists()
    status, _, stderr = run(["optimize", EXAMPLE, "-o", out, "--no-bisect"], monkeypatch, capsys)
    assert status == 1 and "--disable" not in stderr


def test_verify_command_names_the_bound_and_saves_failing_inputs(tmp_path, monkeypatch, capsys):
    import onnx

    broken = onnx.load(str(EXAMPLE))
    for node in broken.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Sigmoid"
            break
    bad = tmp_path / "bad.onnx"
    onnx.save(broken, str(bad))
    saved = tmp_path / "in.npz"
    status, stdout, stderr = run(
        ["verify", EXAMPLE, bad, "--seed", "5", "--save-failing-inputs", saved], monkeypatch, capsys
    )
    assert status == 1
    assert "bound" in stdout and "used" in stdout and "(generated, seed 5)" in stdout
    assert f"inputs saved to {saved}" in stderr
    with np.load(saved) as data:
        assert list(data) == ["input"]
    status, stdout, stderr = run(
        ["verify", EXAMPLE, bad, "--verify-inputs", saved, "--format", "json"], monkeypatch, capsys
    )
    assert status == 1 and json.loads(stdout)["seed"] is None


def test_old_option_names_still_work_with_a_deprecation_warning(tmp_path, monkeypatch, capsys):
    npz = tmp_path / "in.npz"
    np.savez(npz, input=np.zeros((1, 3, 32, 32), np.float32))
    # --inputs is the name of the input arrays now (verify's old alias of --verify-inputs)
    status, stdout, stderr = run(["verify", EXAMPLE, EXAMPLE, "--inputs", npz], monkeypatch, capsys)
    assert status == 0 and not stderr, stderr
    assert f"(from {npz})" in " ".join(stdout.split())
    status, _, stderr = run(
        ["verify", EXAMPLE, EXAMPLE, "--verify-inputs", npz], monkeypatch, capsys
    )
    assert status == 0 and not stderr, stderr
    # optimize's --inputs with tensor names is the old name of --keep-inputs
    status, _, stderr = run(
        ["optimize", EXAMPLE, "-o", tmp_path / "k.onnx", "--inputs", "input"], monkeypatch, capsys
    )
    assert status == 0, stderr
    assert "--inputs with tensor names is deprecated; use --keep-inputs" in stderr
    status, _, stderr = run(
        ["optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--outputs", "logits"],
        monkeypatch,
        capsys,
    )
    assert status == 0, stderr
    assert "--outputs is deprecated; use --keep-outputs" in stderr


def test_target_is_validated_and_its_values_are_in_the_help(tmp_path, monkeypatch, capsys):
    status, _, stderr = run(
        ["optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--target", "bogus"], monkeypatch, capsys
    )
    assert status == 2 and "'bogus' is not one of 'ascend310', 'cpu', 'cuda'" in stderr
    assert not (tmp_path / "o.onnx").exists()
    status, stdout, _ = run(["optimize", "--help"], monkeypatch, capsys)
    assert status == 0
    assert "[ascend310|cpu|cuda]" in stdout and "Exit status: 0 done; 1 verification" in stdout
    assert "--keep-inputs" in stdout and "--inputs TEXT" in stdout
    assert "An .npz of arrays named after the model's inputs" in " ".join(stdout.split())


def test_every_option_of_every_command_has_help():
    import click

    for name, command in cli.app.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"{name} {param.opts}"


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("ConvBNFusionPass", "ConvBatchNormFusionPass"),
        ("convbatchnormfusionpass", "ConvBatchNormFusionPass"),
        ("LayerNormFusionPas", "LayerNormFusionPass"),
        ("CSEFusionPass", "CommonSubexpressionFusionPass"),
        ("PadConvFusion", "PadConvFusionPass"),
    ],
)
def test_typo_suggestions_compare_whole_names_and_abbreviations(typed, meant):
    from opfuse.rules import all_passes

    assert closest(typed, [p.name for p in all_passes()]) == meant


def test_an_unrelated_name_gets_no_suggestion(tmp_path, monkeypatch, capsys):
    from opfuse.rules import all_passes

    assert closest("Frobnicate", [p.name for p in all_passes()]) is None
    status, _, stderr = run(
        ["optimize", EXAMPLE, "-o", tmp_path / "o.onnx", "--disable", "ConvBNFusionPass"],
        monkeypatch,
        capsys,
    )
    assert status == 2 and "did you mean ConvBatchNormFusionPass?" in stderr


def test_passes_is_compact_by_default_and_full_with_verbose(monkeypatch, capsys):
    from opfuse.rules import all_passes

    status, stdout, _ = run(["passes"], monkeypatch, capsys)
    assert status == 0
    # one row per pass (its summary may fold onto more lines under it)
    body = [ln for ln in stdout.splitlines() if ln.startswith("│ ") and ln[2] != " "]
    assert [ln.split()[1] for ln in body] == [p.name for p in all_passes()]
    assert "23-" not in stdout
    status, stdout, _ = run(["passes", "--verbose"], monkeypatch, capsys)
    assert "23+" in stdout and "patterns" in stdout


def test_opset_ranges_read_n_plus():
    from opfuse.rewrite.registry import PassInfo

    def noop(ctx):
        return None

    assert PassInfo("XFusionPass", "d", opset_min=23, run=noop).opset_range == "23+"
    assert PassInfo("XFusionPass", "d", opset_min=7, opset_max=17, run=noop).opset_range == "7-17"


def test_bisect_finds_the_first_failing_pass_with_few_reruns():
    fired = [f"P{i}FusionPass" for i in range(10)]
    calls = []

    def fails(disabled):
        calls.append(disabled)
        return "P6FusionPass" not in disabled  # P6 breaks the model; later ones too

    assert first_bad_pass(fired, fails) == "P6FusionPass"
    assert len(calls) <= 5
    assert first_bad_pass(fired, lambda disabled: True) is None  # not a pass of them
    assert first_bad_pass([], lambda disabled: True) is None
    assert first_bad_pass(["AFusionPass"], lambda d: "AFusionPass" not in d) == "AFusionPass"


def test_phases_are_told_as_they_start_and_timed(tmp_path):
    from opfuse.pipeline.conductor import optimize_file
    from opfuse.pipeline.phases import Phases

    told: list[str] = []
    result = optimize_file(EXAMPLE, tmp_path / "o.onnx", phases=Phases(told.append))
    assert told[:2] == ["load", "optimize"]
    assert "optimize: round 1" in told and "optimize: round 2" in told
    assert told[-2:] == ["write", "verify"]
    assert set(result.timings) == {"load", "optimize", "write", "verify"}
    assert all(seconds >= 0 for seconds in result.timings.values())


def test_the_spinner_shows_only_on_a_terminal(monkeypatch):
    shown: list[str] = []

    class FakeStatus:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, text):
            shown.append(text)

    monkeypatch.setattr(console.err, "status", lambda text: FakeStatus())
    monkeypatch.setattr(type(console.err), "is_terminal", property(lambda self: True))
    with console.progress() as phases, phases("load"):
        pass
    assert shown == ["load ..."]
    monkeypatch.setattr(type(console.err), "is_terminal", property(lambda self: False))
    with console.progress() as phases, phases("write"):
        pass
    assert shown == ["load ..."] and "write" in phases.seconds


@pytest.mark.parametrize(
    "columns, terminal, width",
    [(None, False, 100), ("72", False, 72), ("130", False, 130), ("x", False, 100),
     ("72", True, 72), (None, True, 93)],
)  # fmt: skip
def test_console_width_follows_columns_on_and_off_a_terminal(monkeypatch, columns, terminal, width):
    """COLUMNS wins on a terminal or not; without it, the terminal's width, or 100 off one
    (it was 240 off a terminal whatever COLUMNS said). Read when drawing, not when made."""
    from rich.console import Console, ConsoleDimensions

    monkeypatch.delenv("COLUMNS", raising=False)
    out = console.console()  # made before COLUMNS is set
    if columns is not None:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(Console, "is_terminal", property(lambda self: terminal))
    # the terminal's own size, as rich reads it (93 columns here)
    real = Console.size.fget  # type: ignore[attr-defined]
    monkeypatch.setattr(
        Console,
        "size",
        property(lambda self: ConsoleDimensions(93, 40) if terminal else real(self)),
    )
    assert out.width == width


@pytest.mark.parametrize("columns", [100, 72])
def test_optimize_output_lines_fit_columns(tmp_path, monkeypatch, capsys, columns):
    """The verifier's line per output and the --benchmark latency line wrap at COLUMNS
    (they were 127 and 110 columns wide at 100)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    args = ["optimize", str(EXAMPLE), "-o", str(tmp_path / "o.onnx")]
    status, stdout, _ = run([*args, "--benchmark", "--bench-seconds", "0.2"], monkeypatch, capsys)
    assert status == 0
    lines = stdout.splitlines()
    assert any("output 'logits'" in line for line in lines)
    assert "CPUExecutionProvider, ORT_ENABLE_ALL, 1 thread" in " ".join(stdout.split())
    assert "worst element at" in " ".join(stdout.split())  # the line's end is still there
    assert max(len(line.rstrip()) for line in lines) <= columns
