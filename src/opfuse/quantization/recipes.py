"""``--recipe auto``: the recipes that apply to this model, tried in cost order, each
scored by the gate's own measure on the validation part, or, where that part would hold
fewer than 3 samples, with 2-fold cross-validation over the calibration samples (``folds``:
each half calibrates a model scored on the other half; never the evaluation data), the
most accurate kept, then built on the calibration part for the heads and the fallback.

The search starts from ``minmax`` (onnxruntime's own MinMax calibration) and applies one
change at a time to the best recipe so far, cheapest first (``CHANGES``): ``dynamic`` (the
MatMuls with constant weights dynamic int8, on a transformer), ``int4`` (those weights
weight-only int4, on a decoder only: ``_Search.decoder``), NNCF's
``mean-minmax`` ranges, the fast bias correction, ``float-requant`` (judged strictly:
``PAIRED``), ``mse`` ranges (each tensor's own quantization error), cross-layer
equalization (``cle``) and ``smoothquant`` (each verified against the float model, dropped
and said when it fails), the full bias correction. A change is kept only when it scores
better beyond the noise of the figures (``Gate.better``), so equal figures keep the
cheaper recipe. The recipes tried are bounded by their cost in units of the first one's
(``RECIPE_UNITS``, smaller in proportion for a graph of more than LARGE_GRAPH_NODES nodes:
a count, never seconds, so that the same model, data and options keep the same recipe on
an idle or a loaded machine); what was not tried is said."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from opfuse.errors import OpfuseError, first_line
from opfuse.quantization import flow, heads, ort_backend
from opfuse.quantization.accuracy import OutputAccuracy, brief
from opfuse.quantization.gate import CLASS_MIN_SAMPLES, Gate
from opfuse.quantization.steps import (
    DYNAMIC,
    INT8_WEIGHTS,
    STEPS,
    WEIGHT_ONLY,
    Int4,
    StepReport,
    decoder_signs,
    dynamic_nodes,
    int4_accuracy_level,
    recipe_name,
    recipe_steps,
    static_part,
)
from opfuse.quantization.workspace import QuantizeInternalError, Workspace, run_model

# one change at a time to the best recipe so far, cheapest first (measured on PP-OCR's
# recognizer: mean-minmax and the fast bias correction cost about one quantization, mse
# three, cle and smoothquant their statistics and the float check on top; float-requant
# one, or its paired look three: PAIRED)
CHANGES = (
    "dynamic",
    "int4",
    "int8-weights",
    "float-decomposed",
    "mean-minmax",
    "bias-correction",
    "float-requant",
    "mse",
    "cle",
    "smoothquant",
    "bias-correction-full",
)
# The search's budget counts each recipe's cost in units of the first one's (minmax), from
# the fixed table COST (a step not in it: 1), not the clock: the recipes tried, and so the
# one kept, are the same on any machine at any load (a wall-clock budget of 40 s tried 3
# recipes on the recognizer on a loaded machine, 6 on an idle one). 10 units: every change
# but the full bias correction (8).
RECIPE_UNITS = 10.0
# a graph of more nodes than this gets a budget smaller in proportion (``recipe_budget``):
# the zoo's tx100 (9,199 nodes, 128 s a quantization) tries 2 recipes (minmax and one
# change), as a 300 s cap in processor seconds let it before; a cap in seconds of any kind
# moves with the machine's load (a busy core's onnxruntime threads spin), a count does not
LARGE_GRAPH_NODES = 2000
# a recipe's cost in units of the first one's (minmax) time (measured on PP-OCRv4's
# recognizer: mean-minmax 0.5, the fast bias correction 0.75, mse with it 3, the full bias
# correction 7.4)
COST = {"mse": 3.0, "cle": 2.0, "smoothquant": 2.0, "bias-correction-full": 8.0}
# The changes judged strictly (``Gate.better(strict=True)``: a large and consistent paired
# SQNR gain on every output the gate judges): float-requant drops roundings but also the
# clipping at the calibrated ranges, and its gain on the calibration data may not hold on
# other data (PP-OCRv4's detector: +0.7 dB cross-validated over its 10 calibration images,
# 7.4 -> 4.0 dB on its evaluation images). Where the search is not cross-validated, by a
# paired look (``paired_look``), at this cost: one quantization for its validation figures,
# and the recipe before it and with it each on two halves of the calibration data (four
# quantizations on half the samples)
PAIRED = {"float-requant": 3.0}
# ... on this many calibration samples or more (each half of the cross-validation calibrates
# on CLASS_MIN_SAMPLES or more): below, the change is judged strictly on the search's own
# figures. The recognizer's 17 windows: cross-validated (halves of 8 and 9) float-requant
# gained +3.4 dB (per window +4.8, SE 1.2, ahead on 16 of 17), and on its evaluation text
# none (15.6 -> 15.7 dB, top-1 98.1% -> 97.3%), at a cost in speed (0.46x -> 0.55x)
PAIRED_MIN_SAMPLES = 2 * CLASS_MIN_SAMPLES
# The changes a runtime runs slower than its float model, left out of its search (said):
# OpenVINO 2026.4 CPU ran the trained all-MiniLM-L6-v2's dynamic int8 MatMuls at 2.28x the
# time of its float model (bf16 by default; 1.3x its f32: bench.quant_transformers), where a
# static recipe in its QDQ form ran at 0.81x with the embedding cosine kept (0.991)
SLOWER_ON = {"openvino": {DYNAMIC: "OpenVINO runs dynamic int8 MatMuls slower than float"}}


def units(steps: tuple[str, ...]) -> float:
    """A recipe's cost in units of minmax's: its dearest step's."""
    return max(COST.get(s, 1.0) for s in steps)


@dataclass
class Built:
    """A recipe's int8 model, its workspace and figures on the validation part."""

    steps: tuple[str, ...]
    ws: Workspace
    model: onnx.ModelProto | None = None
    accuracy: list[OutputAccuracy] = field(default_factory=list)
    reports: list[StepReport] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the recipe failed (a step raised): why
    kept: bool = False
    cross_validated: int = 0  # samples its figures are on, 2-fold (0: the validation part)
    units: float = 0.0  # what trying it cost the search (``COST``, ``PAIRED``)
    paired: str = ""  # the verdict of its paired look (``paired_look``), said

    @property
    def name(self) -> str:
        return recipe_name(self.steps)

    def line(self) -> str:
        if self.error:
            return f"{self.name}: failed ({self.error})"
        figures = brief(self.accuracy)
        said = [r.describe() for r in self.reports if r.dropped]
        said += [self.paired] if self.paired else []
        return f"{self.name}: {figures}" + (f" ({'; '.join(said)})" if said else "")

    def to_json(self) -> dict[str, object]:
        return {
            "recipe": self.name,
            "steps": [r.to_json() for r in self.reports],
            "validation": [a.to_json() for a in self.accuracy],
            "seconds": round(self.seconds, 2),
            "error": self.error or None,
            "kept": self.kept,
            "cross_validated": self.cross_validated or None,
        }


def build(
    base: Workspace,
    steps: tuple[str, ...],
    exclude: list[str] | None = None,
    float_heads: tuple[str, ...] = (),
) -> Built:
    """Run ``steps`` on a fork of ``base``: the float steps, the ranges, quantization
    (with ``exclude`` node names in float on top of the workspace's), the int8 steps, and
    the float output of each head in ``float_heads``."""
    ws = base.fork()
    made = Built(steps, ws)
    start = time.perf_counter()
    for name in steps:
        step = STEPS[name]
        if step.phase == "int8":
            continue
        made.reports.append(step.run(ws))
    in_float = ws.exclude if exclude is None else list(dict.fromkeys([*ws.exclude, *exclude]))
    dynamic = dynamic_nodes(ws.float_model, in_float) if DYNAMIC in steps else []
    weight_only = next((s for s in steps if s in WEIGHT_ONLY), None)
    if weight_only:  # the MatMuls' weights int4 or int8, everything else float
        ws.int8_model = ort_backend.quantize_int4_proto(
            ws.float_model,
            dynamic_nodes(ws.float_model, in_float),
            int4_accuracy_level(),
            bits=8 if weight_only == INT8_WEIGHTS else 4,
        )
    elif dynamic and not static_part(ws.float_model, in_float):
        ws.int8_model = ws.float_model  # no convolution: the MatMuls alone, dynamic
    else:
        ws.int8_model = ort_backend.quantize_proto(
            ws.float_model,
            ws.calib,
            flow.QuantOptions(ws.per_channel, ws.activation_type, ws.calibrate_method),
            [*in_float, *dynamic] if dynamic else in_float,
            name=ws.name,
            notes=ws.notes,
            overrides=ws.overrides,
            extra_options=base.extra_options,  # a workaround found holds for every recipe
            calibration_cache=ws.calibration_cache(),
        )
    if dynamic:
        ws.int8_model = ort_backend.quantize_dynamic_proto(ws.int8_model, dynamic, ws.per_channel)
    for name in steps:
        step = STEPS[name]
        if step.phase == "int8":
            made.reports.append(step.run(ws))
    for output in float_heads:
        if output in heads.requantized_heads(ws.int8_model, {output}):
            ws.int8_model = heads.float_output(ws.int8_model, output)
    made.model = ws.int8_model
    made.seconds = time.perf_counter() - start
    return made


def _built_or_failed(
    ws: Workspace,
    base: Workspace,
    steps: tuple[str, ...],
    exclude: list[str] | None = None,
    float_heads: tuple[str, ...] = (),
) -> Built:
    """``steps`` built on ``ws``; a step that raises (not a failure of onnxruntime's
    quantizer on the model, which is exit 3) makes a failed recipe, said on ``base``."""
    try:
        return build(ws, steps, exclude, float_heads)
    except QuantizeInternalError:
        raise
    except (OpfuseError, ValueError, RuntimeError, KeyError, IndexError) as exc:
        failed = Built(steps, base.fork(), error=first_line(exc))
        base.say(f"recipe {failed.name}: failed ({failed.error})")
        return failed


def scored(base: Workspace, steps: tuple[str, ...]) -> Built:
    """``build`` and score on the validation part; a step that raises (not a failure of
    onnxruntime's quantizer on the model, which is exit 3) makes a failed recipe."""
    made = _built_or_failed(base, base, steps)
    if made.error:
        return made
    assert made.model is not None
    made.accuracy = base.score(made.model)
    base.say(f"recipe {made.line()} on {len(base.valid)} validation samples ({made.seconds:.1f} s)")
    return made


CV_MIN_SAMPLES = 4  # from 4 calibration samples on, the recipes are cross-validated ...
CV_BELOW_VALIDATION = 3  # ... while the validation part would hold fewer samples than this


def folds(base: Workspace, always: bool = False) -> list[Workspace] | None:
    """Two workspaces that together score a recipe on every calibration sample, none on a
    sample it was calibrated on: the samples alternately in two halves, each half
    calibrating a model scored on the other (2-fold cross-validation). A validation part
    of 2 to 4 samples chose by noise: on PP-OCRv4's detector (10 calibration images, 3
    with text) it held 2 and ranked mean-minmax below cle (1.4 against 3.1 dB) where the
    evaluation images give 8.1 against 4.9 dB. None below ``CV_MIN_SAMPLES``, and None
    where the validation part holds ``CV_BELOW_VALIDATION`` samples or more: each half
    calibrates on half the samples, and the global extremes (``minmax``) of half the
    samples are narrower than those of all of them, which the model written is calibrated
    on, while the mean of per-sample extremes (``mean-minmax``) does not move with the
    count: cross-validating PP-OCRv4's recognizer (17 calibration samples) kept
    mean-minmax,bias-correction, 95.0% top-1 on the evaluation text against minmax's 98.1%
    (measured after the fact: the threshold is this bias, not a fit to those figures).
    ``always``: whatever the validation part holds (``paired_look``)."""
    apart = base.valid is not base.calib
    if apart and len(base.valid) >= CV_BELOW_VALIDATION and not always:
        return None
    every = [*base.calib, *base.valid] if apart else base.calib
    if len(every) < CV_MIN_SAMPLES:
        return None
    halves = [every[0::2], every[1::2]]
    reference = [run_model(base.fused_model, half, base.name) for half in halves]
    made = []
    for k in (0, 1):
        ws = base.fork()
        ws.use_samples(halves[k], f"half{k}")
        ws.valid = halves[1 - k]
        ws.valid_reference = reference[1 - k]
        ws.new_scope(f"fold{k}-")  # a step's statistics are its own half's
        made.append(ws)
    return made


def cross_validated(
    base: Workspace,
    halves: list[Workspace],
    steps: tuple[str, ...],
    exclude: list[str] | None = None,
    float_heads: tuple[str, ...] = (),
    say: bool = True,
) -> Built:
    """``steps`` built on each half (``exclude``, ``float_heads``: as ``build``), each scored
    on the other; the figures over both. ``say``: a progress line."""
    start = time.perf_counter()
    got: list[list[np.ndarray]] = []
    reference: list[list[np.ndarray]] = []
    samples: list[dict[str, np.ndarray]] = []
    reports: list[StepReport] = []
    for ws in halves:
        made = _built_or_failed(ws, base, steps, exclude, float_heads)
        if made.error:
            return made
        assert made.model is not None
        reports = reports or made.reports
        got += run_model(made.model, ws.valid, base.name, internal=True)
        reference += ws.valid_reference
        samples += ws.valid
    out = Built(steps, base.fork(), reports=reports)
    out.accuracy = base.compare(reference, got, samples)
    out.seconds = time.perf_counter() - start
    out.cross_validated = len(reference)
    if say:
        base.say(
            f"recipe {out.line()} cross-validated on {len(reference)} calibration samples "
            f"(2 halves) ({out.seconds:.1f} s)"
        )
    return out


def _kind(name: str) -> str:
    """Steps of one kind replace each other in a recipe: the ranges steps, the two bias
    corrections, the MatMuls' weights (dynamic int8, int4); any other step is a kind of
    its own."""
    if STEPS[name].phase == "ranges":
        return "ranges"
    if name == DYNAMIC or name in WEIGHT_ONLY:
        return "weights"
    return "bias" if name.startswith("bias-correction") else name


def with_step(steps: tuple[str, ...], name: str) -> tuple[str, ...]:
    """``steps`` with ``name`` added: a ranges step or a bias correction replaces the one
    of its kind, another step joins the others; ``int4`` (weight-only) keeps only the
    float steps, and a step that quantizes activations replaces it."""
    kept = [s for s in steps if _kind(s) != _kind(name)]
    if name in WEIGHT_ONLY:
        kept = [s for s in kept if STEPS[s].phase == "float"]
    elif STEPS[name].phase != "float":
        kept = [s for s in kept if s not in WEIGHT_ONLY]
    return recipe_steps([*kept, name])


def paired_look(
    base: Workspace, gate: Gate, current: Built, steps: tuple[str, ...]
) -> tuple[Built, bool]:
    """``steps`` (``current``'s recipe and a change in PAIRED) built on the calibration
    part and scored on the validation part (the figures later changes are compared with),
    and whether it is better than ``current``: both recipes cross-validated over every
    calibration sample (``folds(always=True)``), the gate's strict ``better`` on those
    figures (a large and consistent paired SQNR gain on every output it judges). The
    validation part is too small to see float-requant's gain on magika's byte
    classifier: 13 files, on which two answers change (84.6% top-1 against 100%) and the
    paired SQNR gain is +0.9 dB with a standard error of 3.6; cross-validated over the 52
    calibration files, +8.6 dB with a standard error of 1.6 (the evaluation files: 100%
    against 96.1%). Cross-validation is not the search's measure (its halves' narrower
    extremes are a bias against ``minmax``); the two recipes of the pair have the same
    ranges step on the same halves, but the requantizations float-requant drops clip more
    at the halves' narrower ranges, which favours it: hence PAIRED_MIN_SAMPLES."""
    made = scored(base, steps)
    halves = folds(base, always=True)
    if made.error or halves is None:
        return made, False
    mine = cross_validated(base, halves, current.steps)
    theirs = cross_validated(base, halves, steps)
    if mine.error or theirs.error:
        return made, False
    won = gate.better(theirs.accuracy, mine.accuracy, strict=True)
    made.paired = (
        f"{'better' if won else 'not better'} than {current.name} cross-validated on "
        f"{theirs.cross_validated} calibration samples, paired: {brief(theirs.accuracy)} "
        f"against {brief(mine.accuracy)}"
    )
    for report in made.reports:  # the JSON's steps say it too
        if report.step in PAIRED:
            report.detail = f"{report.detail}; {made.paired}" if report.detail else made.paired
    base.say(f"recipe {made.name}: {made.paired}")
    return made, won


def recipe_budget(nodes: int) -> float:
    """The search's budget in units (``RECIPE_UNITS``), smaller for a graph of more than
    LARGE_GRAPH_NODES nodes in proportion (a recipe costs about its node count): a count,
    so that the recipes tried, and the one kept, are the same at any load."""
    if nodes <= LARGE_GRAPH_NODES:
        return RECIPE_UNITS
    return max(1.0, RECIPE_UNITS * LARGE_GRAPH_NODES / nodes)


def search(
    base: Workspace,
    gate: Gate,
    forced: tuple[str, ...] | None,
    budget: float | None = None,
    runtime: str = "onnxruntime",
) -> tuple[Built, list[Built], list[str]]:
    """The kept recipe, every recipe tried (in order) and what was skipped (said);
    ``budget``: the recipes' cost in units of the first one's (default ``recipe_budget``
    of the fused model's nodes: the same recipes are tried on any machine, at any load);
    ``runtime``: the changes it runs slower than float (``SLOWER_ON``) are not tried."""
    if forced is not None:
        weight_only = next((s for s in forced if s in WEIGHT_ONLY), None)
        if weight_only and not STEPS[weight_only].applies(base):  # it alone quantizes
            raise OpfuseError(
                f"{base.name}: --recipe {recipe_name(forced)}: "
                f"{Int4().reason(base)}; it would write the float model"
            )
        made = scored(base, forced)
        if made.error:
            raise QuantizeInternalError(
                f"{base.name}: --recipe {made.name} failed: {made.error}; try another recipe"
            )
        made.kept = True
        return made, [made], []
    if budget is None:
        budget = recipe_budget(len(base.fused_model.graph.node))
    run = _Search(base, gate, budget, SLOWER_ON.get(runtime, {}))
    best = run.run()
    if run.halves is None:
        return best, run.tried, run.skipped
    # the kept recipe on the calibration part, scored on the validation part (what the
    # heads and the fallback compare with)
    chosen = scored(base, best.steps)
    if chosen.error:
        raise QuantizeInternalError(f"{base.name}: recipe {chosen.name} failed: {chosen.error}")
    chosen.kept = True
    return chosen, run.tried, run.skipped


class _Search:
    """One recipe search: from minmax, one change at a time to the best so far, within
    ``budget`` units (the module's docstring)."""

    def __init__(
        self, base: Workspace, gate: Gate, budget: float, slower: dict[str, str] | None = None
    ) -> None:
        self.base, self.gate, self.budget = base, gate, budget
        self.slower = slower or {}  # the changes the runtime runs slower than float, and why
        self.tried: list[Built] = []
        self.skipped: list[str] = []
        self.best: Built | None = None
        self.halves = folds(base)
        apart = base.valid is not base.calib
        self.everything = [*base.calib, *base.valid] if apart else base.calib

    def run(self) -> Built:
        base = self.base
        self.attempt(recipe_steps(["minmax"]))
        if self.best is None:
            lines = "; ".join(t.line() for t in self.tried)
            raise QuantizeInternalError(f"{base.name}: no recipe quantized the model ({lines})")
        # the samples a change judged strictly is paired on: every calibration sample where
        # it gets a paired look or the search is cross-validated, else the validation part
        if self.halves is not None or len(self.everything) >= PAIRED_MIN_SAMPLES:
            pairable = len(self.everything)
        else:
            pairable = len(base.valid)
        for name in CHANGES:  # each applied to the best recipe so far
            if name in PAIRED and pairable < CLASS_MIN_SAMPLES:  # it could not be kept
                self.skipped.append(
                    f"{name} (kept only on a consistent gain over {CLASS_MIN_SAMPLES} samples "
                    f"or more; {pairable} to compare on)"
                )
                continue
            if name in self.slower:
                self.skipped.append(f"{name} ({self.slower[name]}: --recipe forces it)")
                continue
            if name in WEIGHT_ONLY and not self.decoder(name):
                continue
            weight_only = next((s for s in self.best.steps if s in WEIGHT_ONLY), None)
            if weight_only and name not in WEIGHT_ONLY and STEPS[name].phase != "float":
                self.skipped.append(f"{name} (the kept recipe is weight-only: {weight_only})")
                continue
            steps = with_step(self.best.steps, name)
            if self.fits(steps) and self.applies(name):  # the budget first: applies() runs it
                self.attempt(steps)
        assert self.best is not None
        self.best.kept = True
        return self.best

    def strict(self, steps: tuple[str, ...]) -> bool:
        """Is ``steps`` the best recipe so far with a change in PAIRED (judged strictly)."""
        best = self.best
        if best is None or not set(best.steps) <= set(steps):
            return False
        added = set(steps) - set(best.steps)
        return bool(added) and added <= PAIRED.keys()

    def paired(self, steps: tuple[str, ...]) -> float:
        """The cost of the paired look ``steps`` would get (0: none): a change in PAIRED
        where the search is not cross-validated and there are PAIRED_MIN_SAMPLES."""
        if (
            not self.strict(steps)
            or self.halves is not None
            or len(self.everything) < PAIRED_MIN_SAMPLES
        ):
            return 0.0
        return max(PAIRED[n] for n in set(steps) - set(self.best.steps if self.best else ()))

    def fits(self, steps: tuple[str, ...]) -> bool:
        if not self.tried or any(t.steps == steps for t in self.tried):
            return True
        cost = self.paired(steps) or units(steps)
        spent = sum(t.units for t in self.tried)
        if spent + cost <= self.budget:
            return True
        self.skipped.append(
            f"{recipe_name(steps)} (would exceed the recipe budget: {spent:g} of "
            f"{self.budget:g} units spent, it costs {cost:g})"
        )
        return False

    def attempt(self, steps: tuple[str, ...]) -> None:
        base, best = self.base, self.best
        if any(t.steps == steps for t in self.tried) or not self.fits(steps):
            return
        cost = self.paired(steps)
        if best is not None and cost:
            made, won = paired_look(base, self.gate, best, steps)
            made.units = cost
            self.tried.append(made)
            if won:
                self.best = made
            return
        if self.halves is None:
            made = scored(base, steps)
        else:
            made = cross_validated(base, self.halves, steps)
        made.units = units(steps)
        self.tried.append(made)
        if not made.error and (
            best is None
            or self.gate.better(made.accuracy, best.accuracy, strict=self.strict(steps))
        ):
            self.best = made

    def decoder(self, name: str) -> bool:
        """Is the model a decoder (``decoder_signs``), said either way: int4 trades
        accuracy for size, which the search's measure cannot weigh, so it is tried only
        where the weights are what a model's size and token-by-token latency are made of."""
        signs = decoder_signs(self.base.fused_model)
        if signs:
            self.base.say(f"{signs}: weight-only {name} tried")
        else:
            self.skipped.append(
                f"{name} (not a decoder: weight-only {name} trades accuracy for size; "
                f"--recipe {name} forces it)"
            )
        return bool(signs)

    def applies(self, name: str) -> bool:
        step = STEPS[name]
        ok = step.applies(self.base)
        if not ok:
            reason = getattr(step, "reason", None)
            self.skipped.append(f"{name} ({reason(self.base)})" if reason else name)
        return ok


Builder = Callable[[list[str]], onnx.ModelProto]
