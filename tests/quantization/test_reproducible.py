"""The same model, data and options write the same file on an idle and on a loaded machine
(issue 40): the recipe search and the fallback are bounded by counts, never by a clock.
Each run here goes under a fake clock (``time.perf_counter``, ``time.monotonic``,
``time.process_time``, ``time.time``) that runs at one of two speeds, 1000 times apart: a
decision read from the clock would differ between them."""

from __future__ import annotations

import hashlib
import itertools
import time

import pytest
from test_quantize import mlp_samples, samples_npz, sensitive_mlp, small_cnn

from opfuse.errors import GateError
from opfuse.quantization.conductor import quantize_file

CLOCKS = ("perf_counter", "monotonic", "process_time", "time")


def _under_clock(monkeypatch: pytest.MonkeyPatch, seconds_per_call: float) -> None:
    """Every clock advances ``seconds_per_call`` at each read."""
    ticks = itertools.count()
    for name in CLOCKS:
        monkeypatch.setattr(time, name, lambda: next(ticks) * seconds_per_call)


def _digest(model: object) -> str:
    return hashlib.sha256(model.SerializeToString()).hexdigest()  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", ["search", "fallback"])
def test_the_same_model_under_a_slow_and_a_fast_clock(tmp_path, monkeypatch, case):
    if case == "search":  # the recipe search on a CNN (auto: several recipes tried)
        model = small_cnn(tmp_path / "cnn.onnx")
        data = samples_npz(tmp_path / "c.npz", "x", (1, 3, 8, 8))
        options = {"max_drop": "off"}
    else:  # a gate no model meets: the fallback spends its whole budget of tries
        model = sensitive_mlp(tmp_path / "mlp.onnx")
        data = mlp_samples(tmp_path / "x.npz")
        options = {"max_drop": "sqnr=300", "recipe": "minmax"}
    made = []
    for speed in (0.001, 1000.0):  # a clock 10^6 times slower or faster per read
        with monkeypatch.context() as patched:
            _under_clock(patched, speed)
            try:
                result = quantize_file(model, None, data, benchmark=False, **options)
            except GateError as exc:
                assert exc.report is not None
                result = exc.report
        assert result.model is not None
        made.append(
            (
                _digest(result.model),
                [r["recipe"] for r in result.recipes],
                result.fallback_tries,
                result.fallback_stopped,
                result.command,
            )
        )
    assert made[0] == made[1]
    if case == "search":
        assert len(made[0][1]) > 2  # recipes were searched
    else:
        assert made[0][2] > 0  # the fallback tried
