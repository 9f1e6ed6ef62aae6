"""Paired, interleaved latency measurement of model files on one runtime.

Every model is loaded, the original twice (its second copy, AGAIN, measures the noise).
Rounds run every model once each, in the slot order of a balanced Latin square
(``schedule``): across rounds every model runs in every slot (first, second, ...) equally
often and after every other model equally often, and never twice in a row, so that a
position in the round, or the model that ran just before (whose weights evict the next
one's from the caches), hits all of them alike. The rounds are split into sets of fresh
sessions (up to SESSION_SETS, as far as loading fits the time), each set loaded in a
rotated order and warmed up in the order its timed rounds run, so that an effect that
sticks to one session for its whole life (the first sessions a process creates ran
1.2-2x slower on one machine) lands on every model in turn.

A model's latency is the median of its runs; a ratio of two models is the median of
their per-round ratios (with several sets, the median over the sets of that median in
each set: a set of slow sessions counts once). The noise is measured on the same rounds
from the original's two copies, which take every slot and every set of sessions as the
other models do: how far their paired ratio is from 1, its confidence half-width (the
notch of a box plot, 1.58 IQR / sqrt(n), n the rounds of one set: a median of a few noisy
rounds can land on 1 by chance), or how far the copies are apart within one set of
sessions, whichever is largest."""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from opfuse.runtime import Runtime, Session
from opfuse.verification.compare import FedInputs, input_permutations, runnable_inputs, session

ORIGINAL = "original"
AGAIN = "original (again)"
WARMUP = 3  # untimed rounds before a set of sessions' timed rounds, in their slot order
MIN_ROUNDS, MAX_ROUNDS = 5, 1000  # before rounding up to whole periods of the schedule
SESSION_SETS = 3  # fresh sessions of every model this many times, as loading time allows
SET_MIN_ROUNDS = 10  # rounds a set needs before its copies' apartness counts as noise
# a flip must beat the best by more than this even when the original's copies agree closely
NOISE_FLOOR = 0.02


@dataclass
class Measurement:
    """Per-round times (seconds) of the original, its second copy and each variant, by
    label. Ratios are paired: the median over rounds of one model's time over another's
    in the same round, so that load which changes between rounds cancels out. ``sets``:
    how many of the rounds, in order, each set of sessions ran (none given: one set)."""

    runtime: str
    rounds: int
    times: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # about the generated inputs
    sets: list[int] = field(default_factory=list)
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
        their paired ratio is from 1 plus its confidence half-width (how far two copies
        of one file can be apart on these rounds, slots and sessions included), or how far
        they are apart within one set of sessions, the larger."""
        copies = abs(self.ratio(AGAIN) - 1.0) + self.spread(AGAIN)
        return max(copies, self.sessions_apart())

    def sessions_apart(self) -> float:
        """How far the paired ratio of the original's two copies is from 1 within one set
        of sessions, in the set where it is farthest (0 with one set): what a session's
        own speed, which lasts its whole life, adds to the noise. Only from
        SET_MIN_ROUNDS rounds a set on: the median of a few noisy rounds is far from 1 by
        chance (the spread already counts that), not by the sessions."""
        if not self.sets or min(self.sets) < SET_MIN_ROUNDS:
            return 0.0
        return max((abs(r - 1.0) for r in self.set_ratios(AGAIN)), default=0.0)

    @property
    def threshold(self) -> float:
        """The relative difference below which two latencies count as equal."""
        return max(self.noise, NOISE_FLOOR)

    def ratios(self, label: str, to: str = ORIGINAL) -> list[float]:
        """``label``'s time over ``to``'s, round by round."""
        return [a / b for a, b in zip(self.times[label], self.times[to], strict=True)]

    def ratio(self, label: str, to: str = ORIGINAL) -> float:
        """Median over rounds of ``label``'s time over ``to``'s; with several sets of
        sessions, the median over the sets of that median in each set (a set whose
        sessions were slow or fast for their whole life counts once, not per round)."""
        per_set = self.set_ratios(label, to)
        return statistics.median(per_set) if per_set else statistics.median(self.ratios(label, to))

    def set_ratios(self, label: str, to: str = ORIGINAL) -> list[float]:
        """The median of ``label``'s time over ``to``'s in each set of sessions (none with
        one set)."""
        if len(self.sets) < 2:
            return []
        ratios = self.ratios(label, to)
        out, start = [], 0
        for n in self.sets:
            if n:
                out.append(statistics.median(ratios[start : start + n]))
            start += n
        return out

    def spread(self, label: str, to: str = ORIGINAL) -> float:
        """Half-width of the ~95% confidence interval of ``ratio(label, to)``: the notch
        of a box plot, 1.58 IQR / sqrt(n), n the rounds (what the sets of sessions add is
        the copies' apartness, ``sessions_apart``: counting each set's rounds alone would
        take a third of the rounds for a noise the runs do not have)."""
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
            "session_sets": max(1, len(self.sets)),
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
    rounds for about ``seconds`` after the warm-up (at least MIN_ROUNDS, whole periods of
    the schedule). ``progress`` gets the fraction of rounds done; ``reverse`` runs the
    schedule on the labels last to first (a confirmation in another order)."""
    if ORIGINAL in variants or AGAIN in variants:
        raise ValueError(f"variant labels {ORIGINAL!r} and {AGAIN!r} are reserved")
    warnings: list[str] = []
    fed = None
    if feeds is None:
        feeds, fed, warnings = timing_inputs(original, input_shapes, inputs_npz)
    paths = {ORIGINAL: original, AGAIN: original, **variants}
    loaders = {label: functools.partial(runtime.load, path) for label, path in paths.items()}
    feed_sets = {label: _feeds_of(path, feeds) for label, path in paths.items()}
    timed = _interleaved(loaders, feed_sets, runtime.clock, seconds, progress, reverse)
    return Measurement(
        runtime.describe(), timed.rounds, timed.times, warnings, timed.sets, inputs=fed
    )


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
    loaders = {label: functools.partial(rt.load, model) for label, rt in runtimes.items()}
    feed_sets = {label: _feeds_of(model, feeds) for label in runtimes}
    timed = _interleaved(loaders, feed_sets, baseline.clock, seconds, None, reverse)
    return Measurement(baseline.describe(), timed.rounds, timed.times, sets=timed.sets)


@functools.cache
def schedule(n: int) -> tuple[tuple[int, ...], ...]:
    """The slot order of each round for ``n`` models (indices), one row per round, the
    rows repeated: a balanced Latin square (Williams's design; for an odd ``n`` the square
    and its mirror image, ``2n`` rows). Over its rows every model runs in every slot equally
    often and right after every other model equally often within a round. The rows are
    chained so that no model runs twice in a row from one round into the next either (the
    last row leads into the first), each pair across a round's end at most once where
    there are enough pairs: run right after itself, a small model found its weights still
    in the caches (a 0.6 MB classifier ran 7% faster), which the order reversed every
    other round gave the models in the first and last slots and never the one in the
    middle."""
    if n < 2:
        return ((0,) * n,)
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [tuple((k + r) % n for k in first) for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return _chained(rows, distinct=True) or _chained(rows, distinct=False) or tuple(rows)


def _chained(rows: Sequence[tuple[int, ...]], distinct: bool) -> tuple[tuple[int, ...], ...]:
    """``rows`` ordered, from the first, so that a row never starts with the model the
    previous one ended with (the last leading into the first), with ``distinct``: each
    (end, start) pair across a round's end once at most; () when a search of bounded
    length finds no order."""
    steps = 0
    order = [rows[0]]
    left = list(rows[1:])
    seen: set[tuple[int, int]] = set()

    def fits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
        return a[-1] != b[0] and not (distinct and (a[-1], b[0]) in seen)

    def extend() -> bool:
        nonlocal steps
        steps += 1
        if steps > 20_000:
            return False
        if not left:
            return fits(order[-1], order[0])
        for i, row in enumerate(left):
            if fits(order[-1], row):
                pair = (order[-1][-1], row[0])
                seen.add(pair)
                order.append(left.pop(i))
                if extend():
                    return True
                left.insert(i, order.pop())
                seen.discard(pair)
        return False

    return tuple(order) if extend() else ()


@dataclass
class _Timed:
    rounds: int
    times: dict[str, list[float]]
    sets: list[int]


def _interleaved(
    loaders: Mapping[str, Callable[[], Session]],
    feed_sets: Mapping[str, dict],
    clock: Callable[[], float],
    seconds: float,
    progress: Callable[[float], None] | None,
    reverse: bool = False,
) -> _Timed:
    """Time one run of every model per round, the slot order of each round from
    ``schedule``, for about ``seconds`` (MIN_ROUNDS..MAX_ROUNDS rounds, rounded up to
    whole periods of the schedule). The rounds are split into sets: each set loads fresh
    sessions of every model (``loaders``), in an order rotated by one model from the last
    set's, and runs WARMUP untimed rounds, the rounds of the schedule just before its
    timed ones, so that every session is warmed in its slot order and the timed rounds
    continue that order. There are SESSION_SETS sets, fewer when loading them would take
    longer than ``seconds`` (the first set's loading, on ``clock``), and none without a
    timed round. ``reverse``: the schedule runs on the labels last to first."""
    labels = list(loaders)[::-1] if reverse else list(loaders)
    n = len(labels)
    rows = schedule(n)
    period = len(rows)
    times: dict[str, list[float]] = {label: [] for label in loaders}
    sets: list[int] = []
    rounds = total_sets = 0
    row = 0  # the schedule's row of the next timed round

    def run_round(order: tuple[int, ...], timed: bool) -> float:
        took = 0.0
        for k in order:
            label = labels[k]
            start = clock()
            sessions[label].run(feed_sets[label])
            elapsed = clock() - start
            took += elapsed
            if timed:
                times[label].append(elapsed)
        return took

    while not sets or len(sets) < total_sets:
        shift = len(sets) % n
        sessions: dict[str, Session] = {}  # released at the end of the set (del below)
        start = clock()
        for label in labels[shift:] + labels[:shift]:
            sessions[label] = loaders[label]()
        load_s = clock() - start
        round_s = 0.0
        for w in range(WARMUP, 0, -1):
            round_s = run_round(rows[(row - w) % period], timed=False)
        if not sets:  # the first set decides how many rounds, and sets, fit the time
            fit = int(min(MAX_ROUNDS, max(MIN_ROUNDS, seconds / max(round_s, 1e-9))))
            rounds = -(-fit // period) * period
            afford = SESSION_SETS if load_s <= 0 else 1 + int(seconds / load_s)
            total_sets = max(1, min(SESSION_SETS, afford, rounds))
        end = rounds * (len(sets) + 1) // total_sets
        done = row
        for _ in range(done, end):
            run_round(rows[row % period], timed=True)
            row += 1
            if progress is not None:
                progress(row / rounds)
        sets.append(row - done)
        del sessions
    return _Timed(rounds, times, sets)
