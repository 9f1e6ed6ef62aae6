"""After the graph search, the session settings: the choices that change latency more
than most rewrites (intra-op threads, sequential or parallel execution, onnxruntime's
graph optimization level) and, when asked, the runtime itself (OpenVINO).

A coordinate search from the user's settings: one axis at a time, each candidate measured
paired and interleaved with the best so far on the chosen model, kept only when it beats
the best by more than the noise twice in a row (the second time in reverse order); then the best measured once more against
the start (the start is kept unless the best beats it). Each choice's ratio is reported."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.runtime import Runtime
from opfuse.runtime.settings import SessionSettings
from opfuse.tuning.measure import ORIGINAL, Measurement, measure_sessions

CANDIDATE = "candidate"
LEVELS = ("off", "basic", "extended", "all")


@dataclass
class SessionTrial:
    settings: SessionSettings
    ratio: float | None = None  # latency over the best's at the time, same rounds
    noise: float | None = None
    kept: bool = False
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "settings": self.settings.label,
            **{k: v for k, v in self.settings.to_json().items() if k != "schema"},
            "latency_ratio_to_best": self.ratio,
            "noise": self.noise,
            "kept": self.kept,
            "note": self.note,
        }


@dataclass
class SessionSearch:
    start: SessionSettings
    best: SessionSettings
    trials: list[SessionTrial] = field(default_factory=list)
    final: Measurement | None = None  # the best against the start
    budget_spent: bool = False

    @property
    def ratio(self) -> float:
        """The chosen settings' latency over the start's (1.0 when the start is kept)."""
        return 1.0 if self.final is None or self.best == self.start else self.final.ratio(CANDIDATE)

    def to_json(self) -> dict[str, object]:
        return {
            "start": self.start.label,
            "chosen": self.best.label,
            "latency_ratio_to_start": self.ratio,
            "noise": None if self.final is None else self.final.noise,
            "budget_spent": self.budget_spent,
            "trials": [t.to_json() for t in self.trials],
        }


def axes(
    best: SessionSettings, max_threads: int, runtimes: Sequence[str]
) -> list[list[SessionSettings]]:
    """The candidates of each axis, from the current best."""
    threads = sorted({t for t in (1, 2, 4, 8, 16, 32, 64, max_threads) if 1 <= t <= max_threads})
    replace = dataclasses.replace
    out = [[replace(best, intra_op_num_threads=t) for t in threads]]
    if best.runtime == "onnxruntime":
        out.append(
            [
                replace(best, execution_mode="parallel", inter_op_num_threads=min(2, max_threads)),
                replace(best, execution_mode="sequential", inter_op_num_threads=1),
            ]
        )
        out.append([replace(best, graph_optimization_level=level) for level in LEVELS])
    out.append(
        [
            SessionSettings(runtime=name, intra_op_num_threads=best.intra_op_num_threads)
            for name in runtimes
        ]
    )
    return out


def search_sessions(
    model: str | os.PathLike[str],
    start: SessionSettings,
    feeds: dict[str, np.ndarray],
    *,
    max_threads: int | None = None,
    runtimes: Sequence[str] = ("onnxruntime",),
    seconds: float = 3.0,
    make_runtime: Callable[[SessionSettings], Runtime] = SessionSettings.make,
    time_left: Callable[[], bool] = lambda: True,
    progress: Callable[[str], None] | None = None,
) -> SessionSearch:
    """Search the session settings for ``model`` from ``start`` (see the module)."""
    max_threads = max_threads or os.cpu_count() or 1
    result = SessionSearch(start, start)
    tried = {start}
    axis_no = 0
    while axis_no < len(all_axes := axes(result.best, max_threads, runtimes)):
        for candidate in all_axes[axis_no]:
            if candidate in tried:
                continue
            if not time_left():
                result.budget_spent = True
                break
            tried.add(candidate)
            if progress is not None:
                progress(f"session: {candidate.label}")
            trial = _try(model, result.best, candidate, feeds, seconds, make_runtime)
            result.trials.append(trial)
            if trial.kept:
                result.best = candidate
        axis_no += 1
    if result.best != start:
        final = _measure(model, start, result.best, feeds, seconds, make_runtime)
        result.final = final
        if not final.faster(CANDIDATE, ORIGINAL):
            result.best = start
    return result


def _measure(
    model: str | os.PathLike[str],
    best: SessionSettings,
    candidate: SessionSettings,
    feeds: dict[str, np.ndarray],
    seconds: float,
    make_runtime: Callable[[SessionSettings], Runtime],
    reverse: bool = False,
) -> Measurement:
    return measure_sessions(
        model,
        make_runtime(best),
        {CANDIDATE: make_runtime(candidate)},
        seconds=seconds,
        feeds=feeds,
        reverse=reverse,
    )


def _try(
    model: str | os.PathLike[str],
    best: SessionSettings,
    candidate: SessionSettings,
    feeds: dict[str, np.ndarray],
    seconds: float,
    make_runtime: Callable[[SessionSettings], Runtime],
) -> SessionTrial:
    try:
        m = _measure(model, best, candidate, feeds, seconds, make_runtime)
        kept = m.faster(CANDIDATE, ORIGINAL)
        note = ""
        if kept:
            again = _measure(model, best, candidate, feeds, seconds, make_runtime, reverse=True)
            kept = again.faster(CANDIDATE, ORIGINAL)
            note = (
                f"{'confirmed' if kept else 'not confirmed'} in reverse order at "
                f"{again.ratio(CANDIDATE):.3f}x"
            )
    except OpfuseError as exc:  # not installed, or the runtime refuses the model
        return SessionTrial(candidate, note=f"not measured: {exc}")
    return SessionTrial(candidate, m.ratio(CANDIDATE), m.noise, kept, note)
