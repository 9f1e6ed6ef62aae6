"""opfuse on the ONNX backend conformance suite (tests/conformance.py): no wrong result,
crash, timeout or false alarm; refusals only for documented reasons; the verifier decides
on at least 98% of the models opfuse optimizes. A deterministic sample of SAMPLE models
runs in ``make test``; the whole suite in ``make test-slow`` (``make test-conformance``
prints the counts per class)."""

from __future__ import annotations

from collections import Counter

import pytest

import conformance

SAMPLE = 200
BAD = ("false-alarm", "wrong", "unexpected", "crash", "timeout")


def check(results: list[tuple[str, str, str, float]]) -> Counter[str]:
    counts = Counter(kind for _, kind, _, _ in results)
    bad = [f"{kind} {name}: {detail}" for name, kind, detail, _ in results if kind in BAD]
    assert not bad, "\n".join(bad)
    optimized = sum(counts[k] for k in ("ok", conformance.UNDECIDED))
    assert counts[conformance.UNDECIDED] <= 0.02 * optimized, counts
    refused = [d for _, kind, d, _ in results if kind == "refused"]
    assert all(r.split(":")[0] in conformance.REFUSALS for r in refused)
    return counts


def test_a_sample_of_the_conformance_suite():
    paths = conformance.sample(conformance.cases(conformance.generate()), SAMPLE)
    assert len(paths) == SAMPLE
    counts = check(list(conformance.run_all(paths, workers=2)))
    assert counts["ok"] >= SAMPLE // 2  # the sample is not mostly skipped


@pytest.mark.slow
def test_the_whole_conformance_suite():
    paths = conformance.cases(conformance.generate())
    counts = check(list(conformance.run_all(paths, workers=2)))
    assert counts["ok"] >= 1500


def test_the_harness_tells_a_wrong_output(tmp_path):
    """output_wrong: an output that differs from the expected one is named."""
    import numpy as np
    import onnx

    proto = onnx.parser.parse_model(
        '<ir_version: 9, opset_import: ["" : 18]> g (float[2] x) => (float[2] y) { y = Neg(x) }'
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, str(path))
    feeds = {"x": np.array([1.0, 2.0], np.float32)}
    assert conformance.output_wrong(path, feeds, [np.array([-1.0, -2.0], np.float32)]) is None
    assert "differs" in conformance.output_wrong(path, feeds, [np.array([1.0, 2.0], np.float32)])


def test_every_ai_onnx_ml_model_of_the_suite():
    """The ai.onnx.ml operators (classical ML: skl2onnx's exports) pass, all of them."""
    paths = [p for p in conformance.cases(conformance.generate()) if "ai_onnx_ml" in p.name]
    assert len(paths) >= 8
    counts = check(list(conformance.run_all(paths, workers=2)))
    assert counts["ok"] == len(paths), counts
