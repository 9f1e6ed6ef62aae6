"""``opfuse quantize`` on the ONNX backend conformance suite (tests/quantize_conformance.py):
no crash, internal failure, refusal or wrong model but the documented ones (``KNOWN``). A
deterministic sample of SAMPLE models runs in ``make test``; the whole suite in
``make test-slow`` (``python tests/quantize_conformance.py`` prints the counts)."""

from __future__ import annotations

from collections import Counter

import pytest

import conformance
import quantize_conformance

SAMPLE = 60


def check(results: list[tuple[str, str, str, float]]) -> Counter[str]:
    bad = quantize_conformance.unexpected(results)
    assert not bad, "\n".join(bad)
    return Counter(kind for _, kind, _, _ in results)


def test_a_sample_of_the_conformance_suite_quantizes():
    paths = conformance.sample(conformance.cases(conformance.generate()), SAMPLE)
    counts = check(list(quantize_conformance.run_all(paths, workers=2)))
    assert counts["ok"] >= SAMPLE // 2  # the sample is not mostly skipped


@pytest.mark.slow
def test_the_whole_conformance_suite_quantizes():
    paths = conformance.cases(conformance.generate())
    counts = check(list(quantize_conformance.run_all(paths, workers=2)))
    assert counts["ok"] >= 1500


def test_the_harness_tells_a_changed_interface():
    """_wrong: an int8 model whose output is renamed is wrong."""
    import numpy as np
    import onnx

    proto = onnx.parser.parse_model(
        '<ir_version: 9, opset_import: ["" : 18]> g (float[2] x) => (float[2] y) { y = Neg(x) }'
    )
    renamed = onnx.parser.parse_model(
        '<ir_version: 9, opset_import: ["" : 18]> g (float[2] x) => (float[2] z) { z = Neg(x) }'
    )
    feeds = {"x": np.array([1.0, 2.0], np.float32)}
    assert quantize_conformance._wrong(proto, proto, feeds) is None
    assert "interface changed" in quantize_conformance._wrong(proto, renamed, feeds)
