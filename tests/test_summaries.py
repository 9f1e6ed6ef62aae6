"""One name for a result's text: every public result has ``summary()``, a plain str that
says something specific of that result (the output, the ratio, the variant), beside
``to_json()``. Small models and the example model; the fake runtime where time counts."""

from __future__ import annotations

from pathlib import Path

import opfuse
from opfuse.batching.runner import BatchRun
from opfuse.runtime.fake import FakeRuntime
from opfuse.verification.compare import OutputDiff, VerifyReport
from test_tune_deploy import COSTS, hardswish_then_linear, tune_to

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "opfuse" / "examples" / "convnet.onnx"


def test_tune_result_summary_names_the_variant_its_ratio_and_the_rebuild(tmp_path):
    model = hardswish_then_linear(tmp_path / "m.onnx")
    result, *_ = tune_to(model, tmp_path, FakeRuntime(COSTS, default=0.001))
    result.command = "opfuse optimize m.onnx -o tuned.onnx --target-opset 14"
    text = result.summary()
    assert isinstance(text, str) and result.final is not None
    first = text.splitlines()[0]
    assert first.startswith(f"best variant: {result.searched.label}: ")
    assert f"({result.final.ratio('best'):.2f}x; noise +-" in first
    assert "rebuild: opfuse optimize m.onnx -o tuned.onnx --target-opset 14" in text
    assert "nothing beat the original" not in text  # it did beat it (the fake's Gemm is slow)


def test_verify_report_summary_says_pass_or_fail_per_output(tmp_path):
    report = opfuse.verify(EXAMPLE, EXAMPLE)
    text = report.summary()
    assert text.startswith("verification passed: rtol 0.0001, atol 1e-05; inputs ")
    for o in report.outputs:
        assert f"output {o.name!r}: max abs error" in text
    bad = VerifyReport(
        [
            OutputDiff("probs", 0.5, 0.25, ok=False, abs_bound=1e-5, used=5e4),
            OutputDiff("logits", 0.0, 0.0, ok=True, abs_bound=1e-5),
        ],
        rtol=1e-4,
        atol=1e-5,
        input_shapes={"x": [1, 3]},
        seed=0,
    )
    lines = bad.summary().splitlines()
    assert lines[0].startswith("verification FAILED")
    assert lines[1].startswith("output 'probs': max abs error 0.5") and "DIFFERS" in lines[1]
    assert lines[2].endswith(": ok")
    assert bad.failure() == "output 'probs' differs by 0.5 (relative 0.25)"  # kept as it was


def test_profile_report_summary_is_the_commands_text_and_advice_says_the_gist():
    settings = opfuse.ProfileSettings(runs=1, warmup=0)
    report = opfuse.profile(EXAMPLE, settings, top=2)
    text = report.summary("convnet.onnx")
    assert text.startswith(f"convnet.onnx: {report.nodes} nodes")
    assert "Top 2 slow nodes" in text and report.slow[0].name in text
    assert "\x1b[" not in text  # plain, no colour
    options = opfuse.AdviseOptions(runs=1, warmup=0, compare_onnxruntime=False, next_steps=False)
    advice = opfuse.advise(EXAMPLE, options=options)
    lines = advice.summary().splitlines()
    assert lines[0].startswith(f"{EXAMPLE}: {advice.graph.nodes_analysed} nodes; ")
    first = advice.op_statistic[0]
    assert lines[1].startswith(f"slowest op types: {first.op_type} {first.share:.0%}")
    assert not any(line.startswith("next step:") for line in lines)  # no trial asked


def test_batch_run_summary_is_the_totals_text(tmp_path):
    records = [
        {"relpath": "a.onnx", "status": "ok"},
        {"relpath": "b.onnx", "status": "crashed"},
    ]
    run = BatchRun(tmp_path, "local", records=records, total=3, seconds=2.0, interrupted=True)
    totals = run.totals()
    assert totals["ran"] == 2 and totals["not_run"] == 1 and totals["status"]["crashed"] == 1
    assert run.to_json() == {"summary": totals, "records": records}
    lines = run.summary().splitlines()
    assert (
        lines[0] == "2 run (1 ok, 1 crashed) and 0 skipped in 2.0 s; all 3 models: 1 ok, 1 crashed"
    )
    assert lines[-1] == "interrupted: 1 models not run; run the same command to resume"
    run.interrupted = False
    assert not run.summary().splitlines()[-1].startswith("interrupted")
