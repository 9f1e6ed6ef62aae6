"""optimize_file as steps: the passes selected once (and what the bisection's probes turn
off), a verification failure told apart by its type, an optimizer error naming the file."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from opfuse.errors import OpfuseError, VerificationError
from opfuse.pipeline import conductor as run
from opfuse.pipeline import selection, switch
from opfuse.pipeline.selection import select
from opfuse.pipeline.verifier import Verification
from opfuse.verification.compare import (
    OptimizedModelError,
    OptimizedModelRunError,
    compare_files,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"


def test_optimize_file_selects_the_passes_once(tmp_path, monkeypatch):
    calls = []
    real = switch.resolve

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(selection, "resolve", counted)
    result = run.optimize_file(
        EXAMPLE, tmp_path / "o.onnx", disable=["CommonSubexpressionFusionPass"]
    )
    assert len(calls) == 1
    assert "CommonSubexpressionFusionPass" not in result.passes and result.fired()


def test_a_selection_without_passes_is_the_selection_with_them_disabled():
    fired = ["ConvBatchNormFusionPass", "IdentityRemovalFusionPass"]
    base = select({"GraphFusion": {"SoftmaxFusionPass": True}}, ["GeluFusionPass"], [])
    again = select({"GraphFusion": {"SoftmaxFusionPass": True}}, ["GeluFusionPass"], fired)
    assert [p.name for p in base.without(fired).enabled] == [p.name for p in again.enabled]
    assert base.without(fired).asked == base.asked == {"SoftmaxFusionPass", "GeluFusionPass"}
    assert base.without([]).enabled == base.enabled  # nothing off: the same passes


def test_a_pass_asked_for_that_needs_another_opset_is_a_warning_else_only_skipped():
    chosen = select(enable=["GeluFusionPass"])  # opset 20+; HardSwishFusionPass 14+
    runnable, warnings, skipped = chosen.runnable(12, None)
    names = [p.name for p in runnable]
    assert "GeluFusionPass" not in names and "HardSwishFusionPass" not in names
    assert "ConvBatchNormFusionPass" in names
    assert [w.split()[0] for w in warnings] == ["GeluFusionPass"]
    assert "HardSwishFusionPass" in [s.split()[0] for s in skipped]
    assert chosen.warnings == []  # the selection itself is left as it was
    assert "GeluFusionPass" in [p.name for p in chosen.runnable(20, None)[0]]


def _broken_copy(tmp_path: Path) -> Path:
    model = onnx.load(str(EXAMPLE))
    model.graph.node[0].op_type = "NoSuchOp"
    path = tmp_path / "broken.onnx"
    onnx.save(model, str(path))
    return path


def test_an_optimized_model_that_cannot_load_is_told_apart_by_its_type(tmp_path):
    broken = _broken_copy(tmp_path)
    with pytest.raises(OptimizedModelError) as exc:
        compare_files(EXAMPLE, broken)
    assert str(broken) in str(exc.value) and exc.value.exit_code == 2
    with pytest.raises(OpfuseError) as exc:  # the reference broken: not the optimized model's
        compare_files(broken, EXAMPLE)
    assert not isinstance(exc.value, OptimizedModelError)
    assert issubclass(OptimizedModelRunError, VerificationError)
    assert OptimizedModelRunError("x").exit_code == 1


def test_the_verification_blames_the_candidate_not_the_reference(tmp_path):
    broken = _broken_copy(tmp_path)
    verification = Verification(EXAMPLE)  # no bisection: only the comparison
    assert verification.compare(EXAMPLE).ok
    with pytest.raises(OptimizedModelError):
        verification.compare(broken)
    verification.reference = broken
    with pytest.raises(OpfuseError) as exc:
        verification.compare(EXAMPLE)
    assert not isinstance(exc.value, OptimizedModelError)


def test_an_optimizer_error_names_the_input_file_once(tmp_path):
    from opfuse.pipeline.settings import OptimizeSettings

    settings = OptimizeSettings(keep_inputs=["no_such_tensor"])
    with pytest.raises(OpfuseError) as exc:
        run.optimize_file(EXAMPLE, tmp_path / "o.onnx", settings=settings)
    message = str(exc.value)
    assert message.startswith(f"{EXAMPLE}: ") and message.count(str(EXAMPLE)) == 1
    assert "no_such_tensor" in message and not (tmp_path / "o.onnx").exists()


def test_a_switch_file_warning_names_the_file_as_its_errors_do(tmp_path):
    """One selection: its warnings name the switch file (they said "switch file" when the
    passes were selected a second time without it)."""
    cfg = tmp_path / "cann.cfg"
    cfg.write_text('{"Switch": {"GraphFusion": {"AvgPoolV2FusionPass": "off"}}}')
    result = run.optimize_file(EXAMPLE, tmp_path / "o.onnx", fusion_switch_file=cfg, verify=False)
    assert result.warnings == [
        f"{cfg}: AvgPoolV2FusionPass is a CANN pass with no ONNX counterpart; ignored"
    ]
    cfg.write_text('{"Switch": {"GraphFusion": {"NoSuchFusionPass": "off"}}}')
    with pytest.raises(OpfuseError, match=f"^{cfg}: unknown pass 'NoSuchFusionPass'"):
        run.optimize_file(EXAMPLE, tmp_path / "o.onnx", fusion_switch_file=cfg)
