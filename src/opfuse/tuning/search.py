"""Measured tuning (the AOE of opfuse): a greedy coordinate search over optimize's
settings for the fastest verified variant on the target runtime.

From the default optimize, each trial flips one choice of the current best (a pass that
matched in this model, an opset upgrade that lets a matching pass run, and, only when the
user allows a change of the model's interface, the layout and static input shapes); the
variant is built and verified against the original. A variant the runtime would run as the
same graph as the best (the same op types in the graph onnxruntime saves after its own
optimizations) is not measured: nothing it changes survives the runtime. The others are
measured paired with the original (twice, for the noise) and the current best; a flip is
kept only when it beats the best by more than the noise measured on those rounds, and again
in a second measurement with the order reversed. The search stops when no flip helps or
the budget is spent; the result is then measured against the original once more, and the
original itself is the result when nothing beats it."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opfuse.errors import OpfuseError
from opfuse.model import io
from opfuse.runtime import Runtime
from opfuse.runtime.settings import SessionSettings
from opfuse.tuning.deployment import deployment_json
from opfuse.tuning.measure import ORIGINAL as ORIGINAL_LABEL
from opfuse.tuning.measure import Measurement, measure, timing_inputs
from opfuse.tuning.session_search import SessionSearch, search_sessions
from opfuse.tuning.variants import (
    DEFAULT,
    LAYOUTS,
    ORIGINAL,
    Built,
    Probe,
    Variant,
    build,
    interface_changes,
    probe,
)
from opfuse.verification.compare import FedInputs

BEST, CANDIDATE = "best", "candidate"
SAME_AT_RUNTIME = "not measured: the runtime optimizes it into the best's graph"


@dataclass
class Trial:
    """One row of the report."""

    variant: Variant
    nodes: int
    verification: str  # "ok" or why it failed
    ratio: float | None = None  # latency / the original's, in the same rounds
    noise: float | None = None
    kept: bool = False
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "settings": self.variant.label,
            "switches": dict(self.variant.switches),
            "layout": self.variant.layout,
            "target_opset": self.variant.target_opset,
            "static_shapes": self.variant.static_shapes,
            "nodes": self.nodes,
            "verification": self.verification,
            "latency_ratio": self.ratio,
            "noise": self.noise,
            "kept": self.kept,
            "note": self.note,
        }


@dataclass
class TuneResult:
    runtime: str
    probe: Probe
    trials: list[Trial] = field(default_factory=list)
    best: Variant = ORIGINAL  # what is written
    searched: Variant = ORIGINAL  # the search's best, measured last against the original
    final: Measurement | None = None  # that last measurement
    beat_original: bool = False
    budget_spent: bool = False
    command: str = ""  # the opfuse optimize command line that rebuilds the written model
    switch_file: Path | None = None  # where its fusion switch file was written
    warnings: list[str] = field(default_factory=list)  # about the generated inputs
    session: SessionSearch | None = None  # the session-settings search on the result
    session_file: Path | None = None  # where its choice was written
    # how the written model's inputs/outputs differ from the original's (only when allowed)
    interface_changed: list[str] = field(default_factory=list)
    session_start: SessionSettings | None = None  # the settings the graph search measured at
    inputs: FedInputs | None = None  # what every trial was timed on (shapes, generated or given)

    @property
    def session_settings(self) -> SessionSettings | None:
        """The session settings the written model was measured fastest at."""
        return self.session.best if self.session is not None else self.session_start

    def open_upgrades(self) -> dict[str, tuple[int, int]]:
        """The opset upgrades that would let a pass fire which the written model's opset
        does not reach (an upgrade the chosen variant took is not news)."""
        opset = self.best.target_opset
        return {
            name: (o, n)
            for name, (o, n) in self.probe.upgrades.items()
            if self.best.original or opset is None or opset < o
        }

    @property
    def ratio(self) -> float:
        """The written model's latency over the original's (1.0 for the original)."""
        return 1.0 if self.final is None or self.best.original else self.final.ratio(BEST)

    def summary(self) -> str:
        """A few lines: the variant written, its latency over the original's with the
        noise, what changed, the command that rebuilds it (``opfuse tune`` prints these
        below its table of trials)."""
        if self.final is not None:
            lines = [f"best variant: {self.searched.label}: {self.final.line(BEST)}"]
        else:
            lines = [f"best variant: {self.best.label} (not measured) on {self.runtime}"]
        if self.inputs is not None:
            lines.append(self.inputs.line("timed"))
        if self.best.original:
            lines.append("nothing beat the original beyond the noise: the output is the original")
        elif not self.beat_original:
            lines.append("nothing beat the original beyond the noise: the output is the fastest")
        if self.interface_changed:
            lines.append("interface changed: " + "; ".join(self.interface_changed))
        if self.session is not None:
            lines.append(f"session: {self.session.best.label} ({self.session.ratio:.2f}x)")
        if self.switch_file is not None:
            lines.append(f"switch file: {self.switch_file}")
        if self.command:
            lines.append(f"rebuild: {self.command}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "best": self.best.label,
            "beat_original": self.beat_original,
            "latency_ratio": self.ratio,
            "noise": None if self.final is None else self.final.noise,
            "budget_spent": self.budget_spent,
            "opset_upgrades": {k: list(v) for k, v in self.open_upgrades().items()},
            "interface_changed": self.interface_changed,
            "trials": [t.to_json() for t in self.trials],
            "warnings": self.warnings,
            "session": None if self.session is None else self.session.to_json(),
            "inputs": None if self.inputs is None else self.inputs.to_json(),
        }


@dataclass
class SearchSettings:
    budget_s: float = 120.0
    bench_seconds: float = 3.0
    input_shapes: Mapping[str, list[int]] | None = None
    inputs_npz: str | os.PathLike[str] | None = None
    rtol: float = 1e-4
    atol: float = 1e-5
    static_shapes: bool = False  # try the inputs re-declared with input_shapes
    layouts: tuple[str, ...] = ()  # the --layout values to try (they change the inputs)
    # try every variant that changes the model's inputs/outputs (layouts, static shapes)
    allow_interface_change: bool = False
    # after the graph search, search the session settings from session_start
    session_search: bool = False
    session_start: SessionSettings = SessionSettings()
    max_threads: int | None = None  # None: the machine's cores
    runtimes: tuple[str, ...] = ("onnxruntime",)
    # the runtime measuring a session setting (tests give fake ones sharing a clock)
    session_runtime: Callable[[SessionSettings], Runtime] | None = None


class Search:
    """The search's state: built variants cached by their settings, the deadline."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        runtime: Runtime,
        workdir: Path,
        settings: SearchSettings,
        progress: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_path = model_path
        self.runtime = runtime
        self.workdir = workdir
        self.settings = settings
        self.progress = progress or (lambda what: None)
        self.clock = clock
        self.deadline = clock() + settings.budget_s
        self.built: dict[Variant, Built] = {}
        self.feeds, self.inputs, self.input_warnings = timing_inputs(
            model_path, settings.input_shapes, settings.inputs_npz
        )
        self.runtime_ops: dict[Variant, Counter[str] | None] = {}

    def build(self, variant: Variant) -> Built:
        if variant not in self.built:
            out = self.workdir / f"variant{len(self.built)}.onnx"
            self.built[variant] = build(
                self.model_path,
                variant,
                out,
                input_shapes=self.settings.input_shapes,
                inputs_npz=self.settings.inputs_npz,
                rtol=self.settings.rtol,
                atol=self.settings.atol,
            )
        return self.built[variant]

    def measure(self, variants: Mapping[str, Built], reverse: bool = False) -> Measurement:
        return measure(
            self.model_path,
            {label: b.path for label, b in variants.items()},
            self.runtime,
            seconds=self.settings.bench_seconds,
            feeds=self.feeds,
            reverse=reverse,
        )

    def ops_at_runtime(self, variant: Variant) -> Counter[str] | None:
        """The op types of the graph the runtime makes of the variant's file after its own
        optimizations (None when the runtime cannot tell)."""
        if variant not in self.runtime_ops:
            optimized_ops = getattr(self.runtime, "optimized_ops", None)
            self.runtime_ops[variant] = (
                None if optimized_ops is None else optimized_ops(self.build(variant).path)
            )
        return self.runtime_ops[variant]

    def same_at_runtime(self, a: Variant, b: Variant) -> bool:
        ops = self.ops_at_runtime(a)
        return ops is not None and ops == self.ops_at_runtime(b)

    def time_left(self) -> bool:
        return self.clock() < self.deadline


def tune(
    model_path: str | os.PathLike[str],
    runtime: Runtime,
    settings: SearchSettings | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    workdir: str | os.PathLike[str] | None = None,
    keep: Callable[[TuneResult, Built], None] | None = None,
) -> TuneResult:
    """Search for the fastest verified variant of ``model_path`` on ``runtime``.
    ``keep`` receives the result and the chosen variant's build before the work folder
    is removed (write the model out there). ``progress`` gets the trial under way."""
    settings = settings or SearchSettings()
    # a staging folder by io's naming, so that one left by a killed run is swept later
    with tempfile.TemporaryDirectory(prefix=io.STAGING_PREFIX + "stage-", dir=workdir) as tmp:
        search = Search(model_path, runtime, Path(tmp), settings, progress, clock)
        result = _search(search)
        if settings.session_search:
            result.session = _search_sessions(search, result)
        chosen = search.build(result.best)
        result.interface_changed = interface_changes(model_path, chosen.path)
        if keep is not None:
            keep(result, chosen)
    return result


def _search(s: Search) -> TuneResult:
    s.progress("probing which settings match")
    allow = s.settings.allow_interface_change
    found = probe(
        io.load_model(s.model_path),
        layouts=LAYOUTS if allow else tuple(x for x in s.settings.layouts if x in LAYOUTS),
    )
    found.static_shapes = (s.settings.static_shapes or allow) and bool(s.settings.input_shapes)
    result = TuneResult(s.runtime.describe(), found, warnings=s.input_warnings, inputs=s.inputs)
    result.session_start = s.settings.session_start
    original = s.build(ORIGINAL)
    result.trials.append(Trial(ORIGINAL, original.nodes, "ok", 1.0, note="the input"))
    s.progress(DEFAULT.label)
    default = s.build(DEFAULT)
    best = ORIGINAL
    if not default.ok:
        result.trials.append(Trial(DEFAULT, default.nodes, default.failure, note="not measured"))
    else:
        m = s.measure({BEST: default})
        result.trials.append(
            Trial(DEFAULT, default.nodes, "ok", m.ratio(BEST), m.noise, True, "the start")
        )
        best = DEFAULT
    tried = {ORIGINAL, DEFAULT}
    improved = not best.original
    while improved:
        improved = False
        for variant in found.flips(best):
            if variant in tried:
                continue
            if not s.time_left():
                result.budget_spent = True
                break
            tried.add(variant)
            s.progress(variant.label)
            trial = _try(s, best, variant)
            result.trials.append(trial)
            if trial.kept:
                best, improved = variant, True
                break
    _finish(s, result, best)
    return result


def _search_sessions(s: Search, result: TuneResult) -> SessionSearch:
    """The session settings for the model the graph search chose, with the time left
    (at least half the budget again: the graph search may have spent it all)."""
    deadline = max(s.deadline, s.clock() + s.settings.budget_s / 2)
    return search_sessions(
        s.build(result.best).path,
        s.settings.session_start,
        s.feeds,
        max_threads=s.settings.max_threads,
        runtimes=s.settings.runtimes,
        seconds=s.settings.bench_seconds,
        make_runtime=s.settings.session_runtime or SessionSettings.make,
        time_left=lambda: s.clock() < deadline,
        progress=s.progress,
    )


def _try(s: Search, best: Variant, variant: Variant) -> Trial:
    """Build, verify and measure one flip against the current best. A flip the runtime
    would run as the same graph as the best is not measured. A flip that looks faster is
    measured a second time, the order reversed, and kept only if it is faster again: on a
    loaded machine one pair of medians can differ by more than the original's two copies
    did, and the first model of a round can pay for the others' cache misses."""
    built = s.build(variant)
    if not built.ok:
        return Trial(variant, built.nodes, built.failure, note="not measured")
    if s.same_at_runtime(variant, best):
        return Trial(variant, built.nodes, "ok", note=SAME_AT_RUNTIME)
    pair = {BEST: s.build(best), CANDIDATE: built}
    try:
        m = s.measure(pair)
        kept = m.faster(CANDIDATE, BEST)
        note = f"{_vs_best(m)} the best"
        if kept:
            again = s.measure(pair, reverse=True)
            kept = again.faster(CANDIDATE, BEST)
            note += (
                f", {'confirmed' if kept else 'not confirmed'} in reverse order at "
                f"{_vs_best(again)}"
            )
    except OpfuseError as exc:  # the runtime refused the variant: that is the trial's result
        return Trial(variant, built.nodes, "ok", note=f"runtime failed: {exc}")
    return Trial(variant, built.nodes, "ok", m.ratio(CANDIDATE), m.noise, kept, note)


def _vs_best(m: Measurement) -> str:
    return f"{m.ratio(CANDIDATE, BEST):.3f}x"


def _finish(s: Search, result: TuneResult, best: Variant) -> None:
    """Measure the best against the original once more: the result is the one measured
    faster (the original unless the best is)."""
    result.searched = best
    if best.original:
        return
    s.progress("final measurement")
    m = s.measure({BEST: s.build(best)})
    result.final = m
    result.beat_original = m.faster(BEST, ORIGINAL_LABEL)
    result.best = best if m.ratio(BEST) < 1.0 else ORIGINAL


def write_outputs(
    result: TuneResult,
    built: Built,
    model_path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    switch_file: str | os.PathLike[str],
    report: str | os.PathLike[str] | None = None,
    input_shapes: Mapping[str, list[int]] | None = None,
    session_file: str | os.PathLike[str] | None = None,
) -> str:
    """Write the chosen model, its switch file, the deployment file (``session_file``:
    the graph and session settings it was measured at, see ``tuning.deployment``) and the
    report; return the command line that rebuilds the model."""
    io.save_model(io.load_model(built.path), output, input_path=model_path)
    io.write_text(
        switch_file, json.dumps(result.best.switch_file(), indent=2) + "\n", what="switch file"
    )
    shapes = input_shapes if result.best.static_shapes else None
    command = result.best.command(model_path, output, switch_file, shapes)
    settings = result.session_settings
    if session_file is not None and settings is not None:
        measured = {
            "graph": {
                "runtime": result.runtime,
                "latency_ratio": result.ratio,
                "noise": None if result.final is None else result.final.noise,
                "beat_original": result.beat_original,
                "interface_changed": result.interface_changed,
            },
            "session": None if result.session is None else result.session.to_json(),
            # what the graph and the session settings were timed on
            "inputs": None if result.inputs is None else result.inputs.to_json(),
        }
        data = deployment_json(
            settings, result.best, shapes, output, model_path, switch_file, command, measured
        )
        io.write_text(session_file, json.dumps(data, indent=2) + "\n", what="session file")
        result.session_file = Path(session_file)
    if report is not None:
        data = {**result.to_json(), "command": command, "switch_file": str(switch_file)}
        io.write_text(report, json.dumps(data, indent=2) + "\n", what="tune report")
    return command
