"""Paired, interleaved latency measurement of model files on one runtime.

Every model is loaded once, the original twice; after a warm-up, rounds run every model
once each, the order reversed every other round, so that load changes on the machine hit
all of them alike. A model's latency is the median of its runs; a ratio of two models is
the median of their per-round ratios. The noise is measured on the same rounds: how far
the ratio of the original's two copies is from 1 (the same model), or the half-width of
that median's confidence interval (the notch of a box plot, 1.58 IQR / sqrt(rounds)),
whichever is larger: a median of a few noisy rounds can land on 1 by chance."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from opfuse.runtime import Runtime, Session
from opfuse.verification.compare import FedInputs, input_permutations, runnable_inputs, session

ORIGINAL = "original"
AGAIN = "original (again)"
WARMUP = 3
MIN_ROUNDS, MAX_ROUNDS = 5, 1000
# a flip must beat the best by more than this even when the original's copies agree closely
NOISE_FLOOR = 0.02


@dataclass
class Measurement:
    """Per-round times (seconds) of the original, its second copy and each variant, by
    label. Ratios are paired: the median over rounds of one model's time over another's
    in the same round, so that load which changes between rounds cancels out."""

    runtime: str
    rounds: int
    times: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # about the generated inputs
    inputs: FedInputs | None = None  # what the models were fed (shapes, generated or given)

    @property
    def medians(self) -> dict[str, float]:
        return {label: statistics.median(t) for label, t in self.times.items()}

    @property
    def original_s(self) -> float:
        return statistics.median(self.times[ORIGINAL])

    @property
    def noise(self) -> float:
        """The original's second copy against the original on the same rounds: how far
        their paired ratio is from 1, or its confidence half-width, the larger."""
        return max(abs(self.ratio(AGAIN) - 1.0), self.spread(AGAIN))

    @property
    def threshold(self) -> float:
        """The relative difference below which two latencies count as equal."""
        return max(self.noise, NOISE_FLOOR)

    def ratios(self, label: str, to: str = ORIGINAL) -> list[float]:
        """``label``'s time over ``to``'s, round by round."""
        return [a / b for a, b in zip(self.times[label], self.times[to], strict=True)]

    def ratio(self, label: str, to: str = ORIGINAL) -> float:
        """Median over rounds of ``label``'s time over ``to``'s."""
        return statistics.median(self.ratios(label, to))

    def spread(self, label: str, to: str = ORIGINAL) -> float:
        """Half-width of the ~95% confidence interval of ``ratio(label, to)``: the notch
        of a box plot, 1.58 IQR / sqrt(n)."""
        values = self.ratios(label, to)
        if len(values) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(values, n=4)
        return 1.58 * (q3 - q1) / len(values) ** 0.5

    def faster(self, label: str, than: str) -> bool:
        """``label`` beats ``than`` by more than the noise measured on these rounds and by
        more than its own ratio's confidence half-width."""
        return self.ratio(label, than) < 1 - max(self.threshold, self.spread(label, than))

    def medians_ratio_apart(self, label: str) -> float | None:
        """The ratio of ``label``'s median to the original's where it differs from the
        paired ratio beyond the noise (the machine's load changed between rounds), else None."""
        of_medians = self.medians[label] / self.original_s
        if abs(of_medians / self.ratio(label) - 1) > max(self.threshold, self.spread(label)):
            return of_medians
        return None

    def line(self, label: str) -> str:
        """``latency 20.1 -> 7.5 ms (0.37x; noise +-0.4%) onnxruntime 1.32 ...``: the
        medians of each model's rounds, and the paired ratio (the median of the per-round
        ratios). When the load changed so much between rounds that the two disagree beyond
        the noise, the line says so (``8.8 -> 11.4 ms`` beside ``1.00x`` is not a typo)."""
        ratio = self.ratio(label)
        text = (
            f"latency {_ms(self.original_s)} -> {_ms(self.medians[label])} ms "
            f"({ratio:.2f}x; noise +-{pct(self.noise)}) {self.runtime}"
        )
        of_medians = self.medians_ratio_apart(label)
        if of_medians is not None:
            text += (
                f"; the medians' ratio is {of_medians:.2f}x: the machine's load changed "
                "between rounds, the paired ratio is the one to trust (measure again on a "
                "quieter machine)"
            )
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "rounds": self.rounds,
            "noise": self.noise,
            "medians_s": self.medians,
            "ratios": {label: self.ratio(label) for label in self.times},
            "inputs": None if self.inputs is None else self.inputs.to_json(),
        }


def pct(x: float) -> str:
    """A noise as a percentage with the digits it needs (``0.4%``, ``2%``, ``12%``)."""
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def feeds_for(
    original: str | os.PathLike[str],
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The verifier's inputs for ``original`` (seeded random, or an .npz's arrays)."""
    return feeds_and_warnings(original, input_shapes, inputs_npz, seed)[0]


def feeds_and_warnings(
    original: str | os.PathLike[str],
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """``feeds_for`` and the warnings about generated inputs that decide a branch (the
    measurement may time a branch real inputs never take)."""
    feeds, _, warnings = timing_inputs(original, input_shapes, inputs_npz, seed)
    return feeds, warnings


def timing_inputs(
    original: str | os.PathLike[str],
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], FedInputs, list[str]]:
    """The feeds, what they are (shapes, generated or the user's .npz: every latency
    report names them) and the warnings about generated inputs. The original is run once on
    them first (generated sizes it refuses grow, as the verifier's do): a model they cannot
    run is the one-line error ``optimize`` gives (with its hint when the inputs were
    generated), not a runtime's failure in the middle of timing."""
    sess = session(original)
    feeds, plan, _ = runnable_inputs(sess, input_shapes, inputs_npz, seed, model=original)
    fed = FedInputs.of(feeds, plan, inputs_npz, seed)
    return feeds, fed, [] if plan is None else plan.warnings


def _feeds_of(path: str | os.PathLike[str], feeds: dict[str, np.ndarray]) -> dict:
    """``feeds`` in the layout a variant declares (``--layout`` records a permutation)."""
    perms = input_permutations(path)
    return {
        k: np.ascontiguousarray(v.transpose(perms[k])) if k in perms else v
        for k, v in feeds.items()
    }


def measure(
    original: str | os.PathLike[str],
    variants: Mapping[str, str | os.PathLike[str]],
    runtime: Runtime,
    *,
    seconds: float = 5.0,
    feeds: dict[str, np.ndarray] | None = None,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    progress: Callable[[float], None] | None = None,
    reverse: bool = False,
) -> Measurement:
    """Median latency of ``original`` (twice) and of each variant (label -> file), in
    rounds for about ``seconds`` after the warm-up (at least MIN_ROUNDS).
    ``progress`` gets the fraction of rounds done; ``reverse`` starts the rounds from the
    last variant (a confirmation in the other order)."""
    if ORIGINAL in variants or AGAIN in variants:
        raise ValueError(f"variant labels {ORIGINAL!r} and {AGAIN!r} are reserved")
    warnings: list[str] = []
    fed = None
    if feeds is None:
        feeds, fed, warnings = timing_inputs(original, input_shapes, inputs_npz)
    paths = {ORIGINAL: original, AGAIN: original, **variants}
    loaded = {label: runtime.load(path) for label, path in paths.items()}
    feed_sets = {label: _feeds_of(path, feeds) for label, path in paths.items()}
    rounds, times = _interleaved(loaded, feed_sets, runtime.clock, seconds, progress, reverse)
    return Measurement(runtime.describe(), rounds, times, warnings, fed)


def measure_sessions(
    model: str | os.PathLike[str],
    baseline: Runtime,
    candidates: Mapping[str, Runtime],
    *,
    seconds: float = 5.0,
    feeds: dict[str, np.ndarray],
    reverse: bool = False,
) -> Measurement:
    """One model under different session settings: ``baseline`` (twice, for the noise)
    and each candidate runtime, paired and interleaved as ``measure`` does. The runtimes
    must share one clock (a real runtime's is ``time.perf_counter``)."""
    runtimes = {ORIGINAL: baseline, AGAIN: baseline, **candidates}
    loaded = {label: rt.load(model) for label, rt in runtimes.items()}
    feed_sets = {label: _feeds_of(model, feeds) for label in runtimes}
    rounds, times = _interleaved(loaded, feed_sets, baseline.clock, seconds, None, reverse)
    return Measurement(baseline.describe(), rounds, times)


def _interleaved(
    loaded: Mapping[str, Session],
    feed_sets: Mapping[str, dict],
    clock: Callable[[], float],
    seconds: float,
    progress: Callable[[float], None] | None,
    reverse: bool = False,
) -> tuple[int, dict[str, list[float]]]:
    """Warm every session up, then time one run of each per round, the order reversed
    every other round, for about ``seconds`` (MIN_ROUNDS..MAX_ROUNDS rounds); ``reverse``:
    the first round runs them last to first."""
    round_s = 0.0
    for label, sess in loaded.items():
        took = 0.0
        for _ in range(WARMUP):
            start = clock()
            sess.run(feed_sets[label])
            took = clock() - start
        round_s += took
    rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, seconds / max(round_s, 1e-9))))
    times: dict[str, list[float]] = {label: [] for label in loaded}
    order = list(loaded)[::-1] if reverse else list(loaded)
    for i in range(rounds):
        for label in order if i % 2 == 0 else reversed(order):
            start = clock()
            loaded[label].run(feed_sets[label])
            times[label].append(clock() - start)
        if progress is not None:
            progress((i + 1) / rounds)
    return rounds, times
