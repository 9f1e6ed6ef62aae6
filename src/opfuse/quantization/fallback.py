"""The mixed-precision fallback: after the best recipe, when the int8 model misses the
gate, keep its most sensitive parts in float one at a time, each kept only when it
measurably helps (on the validation part), until the gate holds or the budget is spent.

Candidates, worst first, two kinds ranked together (both figures are the SQNR of one
rounding at one tensor, against that tensor's float values):

- an activation tensor, by the SQNR of its own rounding (the scale and zero point the
  quantizer chose, on the float model's values: one float run ranks them all; keeping it
  in float keeps its producer and its readers in float);
- a weighted layer (Conv, MatMul, Gemm), by the SQNR at its own output of its weight's
  int8 rounding (one float run ranks them all: ``sensitivity.weight_candidates``).

The error a layer adds alone does not always add up: on PP-OCR's recognizer, keeping its
8 worst layers in float one after the other took top-1 agreement from 98.1% *down* to
95.8% (the errors of other layers had partly cancelled theirs), which is why each is
measured before it is kept. The search is bounded in tries and layers kept (never in seconds); a
progress line per try.

From MIN_GROUP candidates on, the worst MAX_FLOAT_LAYERS are first tried all at once: when
even together they score no better beyond the noise, the error is spread over the model
and the search stops there (one try instead of a budget of tries each within the noise).
On PP-OCRv4's recognizer the 8 together scored 90.6% top-1 on the validation part against
93.8% with none (its error enters in the CNN backbone's ~100 requantizations, none of them
dominant: docs/QUANTIZATION.md); that took the default run from 120 s to 107 s wall on a
loaded 2-core machine (81 s -> 65 s CPU). When the group helps, the candidates are tried one
at a time as before (fewer parts in float: less speed lost), and the group is kept if one
at a time reaches less.

When the group does not help, or no part helps alone, the error is spread and no part can
be singled out: the last resort is the leading layers in float, a share of the
multiply-adds (LEAD_SHARES, ``float_stem.leading_nodes``; ``_leading``). An error that enters
early passes through every layer after it; the stem alone (``float-stem``, 8%) is tried
before the fallback. On PP-OCRv4's recognizer the leading 25% / 50% / 75% / 90% in float
score 95.4% / 97.3% / 98.5% / 99.4% top-1 per step on the evaluation text (the int8 model
98.1%): only the whole CNN backbone keeps 99%, and then int8 no longer pays (39 ms against
38 ms for the float optimized model): the summary says so, and the gate the int8 model
before the fallback passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from opfuse.quantization import flow, recipes
from opfuse.quantization.accuracy import OutputAccuracy, brief
from opfuse.quantization.float_stem import leading_nodes
from opfuse.quantization.gate import Gate
from opfuse.quantization.names import FALLBACK_TRIES
from opfuse.quantization.sensitivity import activation_candidates, weight_candidates
from opfuse.quantization.steps import STEPS, recipe_steps
from opfuse.quantization.workspace import Workspace

MAX_FLOAT_LAYERS = 8  # candidates the fallback may keep in float before giving up
MAX_FALLBACK_TRIES = 16  # candidates it tries, one by one
RANK_SAMPLES = 4  # calibration samples the candidates are ranked on
MIN_GROUP = 3  # from this many candidates on, they are first tried all at once
# the leading shares of the multiply-adds kept in float when the error is spread; the last
# below 1: a model with no int8 layer left is not quantized
LEAD_SHARES = (0.25, 0.5, 0.75, 0.9)
LEADING = "leading share"  # KeptFloat.how of a rung of LEAD_SHARES
# figures of the int8 model with these node names in float, scored apart from the
# validation part (None: could not be scored)
Scorer = Callable[[list[str]], list[OutputAccuracy] | None]


@dataclass
class KeptFloat:
    node: str  # a node name, or "tensor NAME" (its producer and readers)
    sqnr_db: float  # the figure that ranked it (lower: more sensitive)
    how: str = "alone"  # which figure: sensitivity.Candidate.how
    nodes: tuple[str, ...] = ()  # the nodes kept in float (default: ``node``)
    share: float = 0.0  # a rung of LEAD_SHARES: its share of the multiply-adds

    @property
    def in_float(self) -> tuple[str, ...]:
        return self.nodes or (self.node,)

    @property
    def exclude_items(self) -> list[str]:
        """The ``--exclude`` items that keep it in float: ``leading=SHARE`` for a share of
        LEAD_SHARES, else its node names."""
        if self.how == LEADING:
            return [f"{flow.LEADING_KEY}{self.share:.0%}"]
        return list(self.in_float)

    def describe(self) -> str:
        if self.how == LEADING:
            return self.node
        return f"{self.node} ({self.sqnr_db:.1f} dB {self.how})"


@dataclass(frozen=True)
class Trial:
    """One try of the accuracy restorer: what was kept in float, its figures, where they
    were measured, whether it was kept, and the int8 models it built (its cost)."""

    what: str
    figures: tuple[OutputAccuracy, ...]
    where: str  # "validation", "cross-validated", "evaluation"
    kept: bool
    builds: int

    def to_json(self) -> dict[str, object]:
        return {
            "what": self.what,
            "where": self.where,
            "kept": self.kept,
            "builds": self.builds,
            "figures": [a.to_json() for a in self.figures],
        }


@dataclass
class FallbackResult:
    model: onnx.ModelProto
    accuracy: list[OutputAccuracy]  # on the validation part
    kept: list[KeptFloat] = field(default_factory=list)
    tries: int = 0
    stopped: str = ""  # why it stopped
    trials: list[Trial] = field(default_factory=list)

    @property
    def exclude(self) -> list[str]:
        return list(dict.fromkeys(n for k in self.kept for n in k.in_float))

    def tried(
        self, what: str, figures: list[OutputAccuracy] | None, where: str, kept: bool
    ) -> None:
        """One more try, recorded (its cost: one build, two cross-validated)."""
        self.tries += 1
        builds = 2 if where.startswith("cross") else 1
        self.trials.append(Trial(what, tuple(figures or ()), where, kept, builds))


def fallback(
    ws: Workspace,
    gate: Gate,
    build: Callable[[list[str]], onnx.ModelProto],
    first: onnx.ModelProto,
    accuracy: list[OutputAccuracy],
    tries: int = FALLBACK_TRIES,
    cross: Scorer | None = None,
) -> FallbackResult:
    """Keep candidates in float (``build(exclude)`` makes the int8 model with those node
    names in float, on top of ``ws.exclude``) while each improves the figures (``Gate.better``) on
    the validation part; stop when the gate holds there, or at MAX_FLOAT_LAYERS kept,
    MAX_FALLBACK_TRIES tried or ``tries`` (the budget) spent. When the most sensitive parts
    together do not help, or none of them helps alone, the leading layers instead, in the
    tries left (``_leading``, scored by ``cross`` where given)."""
    layers = [n for n in flow.weighted_nodes(ws.float_model) if n not in ws.exclude]
    ranked = _ranked(ws, first, layers)
    found = FallbackResult(first, accuracy)
    group = _group(ranked, layers, ws.exclude)
    together: tuple[onnx.ModelProto, list[OutputAccuracy], list[KeptFloat]] | None = None
    if len(group) >= MIN_GROUP and found.tries < tries:
        # all at once first: when the worst candidates together do not score better beyond
        # the noise, the error is spread over the model, not in a few parts (PP-OCR's
        # recognizer: each of its 5 tries within the noise, 20 s of its 2 minutes)
        model = build(list(dict.fromkeys(n for k in group for n in k.in_float)))
        figures = ws.score(model)
        helped = gate.better(figures, accuracy)
        found.tried(f"the {len(group)} most sensitive parts", figures, "validation", helped)
        ws.say(
            f"fallback try {found.tries}: the {len(group)} most sensitive parts in float at "
            f"once: {brief(figures)} on validation, "
            + ("better: one at a time next" if helped else "no help: stopped")
        )
        if not helped:
            found.stopped = (
                f"its {len(group)} most sensitive parts in float at once scoring no better "
                "beyond the noise (the error is spread over the model)"
            )
            return _leading(ws, gate, build, found, layers, tries - found.tries, cross)
        together = (model, figures, group)
    _one_at_a_time(ws, gate, build, found, ranked, layers, tries)
    if (
        together is not None
        and gate.misses(found.accuracy)
        and gate.better(together[1], found.accuracy)
    ):
        # one at a time did not reach what the group did: the group, measured better
        found.model, found.accuracy, found.kept = together[0], together[1], together[2]
        found.stopped += f"; the {len(together[2])} parts tried at once scored best: kept"
    if not found.kept:  # no part singled out helps: the error is spread
        return _leading(ws, gate, build, found, layers, tries - found.tries, cross)
    return found


def _ranked(ws: Workspace, first: onnx.ModelProto, layers: list[str]) -> list[KeptFloat]:
    """The candidates, worst first: activation tensors and weighted layers ranked
    together (both figures are the SQNR of one rounding at one tensor)."""
    tensors = [
        KeptFloat(c.label, c.sqnr_db, c.how, c.nodes)
        for c in activation_candidates(ws.float_model, first, ws.calib[:RANK_SAMPLES])
        if not set(c.nodes) & set(ws.exclude)
    ]
    weights = [
        KeptFloat(c.label, c.sqnr_db, c.how, c.nodes)
        for c in weight_candidates(ws.float_model, layers, ws.calib[:RANK_SAMPLES], ws.per_channel)
    ]
    return sorted([*tensors, *weights], key=lambda k: k.sqnr_db)


def _one_at_a_time(
    ws: Workspace,
    gate: Gate,
    build: Callable[[list[str]], onnx.ModelProto],
    found: FallbackResult,
    ranked: list[KeptFloat],
    layers: list[str],
    tries: int,
) -> None:
    """Each candidate in float on top of those kept, kept when it scores better."""
    best = found.accuracy
    for k in ranked:
        if len(found.kept) >= MAX_FLOAT_LAYERS:
            found.stopped = f"{MAX_FLOAT_LAYERS} parts kept in float"
            break
        if found.tries >= MAX_FALLBACK_TRIES:
            found.stopped = f"{MAX_FALLBACK_TRIES} tries"
            break
        if found.tries >= tries:
            found.stopped = f"its budget of {tries} tries"
            break
        in_float = list(dict.fromkeys([*found.exclude, *k.in_float]))
        if layers and set(layers) <= set(in_float) | set(ws.exclude):
            continue  # never every layer: a model with no int8 layer left is not quantized
        model = build(in_float)
        figures = ws.score(model)
        helped = gate.better(figures, best)
        found.tried(f"{k.node} in float", figures, "validation", helped)
        ws.say(
            f"fallback try {found.tries}: {k.node} in float ({k.sqnr_db:.1f} dB {k.how}): "
            f"{brief(figures)} on validation, {'kept' if helped else 'no help'}"
        )
        if not helped:
            continue
        found.kept.append(k)
        found.model, found.accuracy, best = model, figures, figures
        if not gate.misses(figures):
            found.stopped = "the gate holds on the validation part"
            break
    else:
        found.stopped = found.stopped or "no candidate left"


def _rungs(ws: Workspace, layers: list[str]) -> list[KeptFloat]:
    """The leading shares of LEAD_SHARES that differ and leave a layer in int8."""
    rungs: list[KeptFloat] = []
    ladder = leading_nodes(ws.float_model, ws.calib[0], LEAD_SHARES)
    for share, leading in zip(LEAD_SHARES, ladder, strict=True):
        names = [n for n in leading if n not in ws.exclude]
        count = sum(1 for n in names if n in layers)
        if not count or set(layers) <= set(names) | set(ws.exclude):
            continue
        if rungs and len(rungs[-1].nodes) == len(names):
            continue
        label = f"the leading {share:.0%} of the multiply-adds ({count} layers)"
        rungs.append(KeptFloat(label, math.nan, LEADING, tuple(names), share))
    return rungs


def _leading(
    ws: Workspace,
    gate: Gate,
    build: Callable[[list[str]], onnx.ModelProto],
    found: FallbackResult,
    layers: list[str],
    tries: int,
    cross: Scorer | None = None,
) -> FallbackResult:
    """The leading layers in float, a share of the multiply-adds (LEAD_SHARES), the largest
    first: while a share holds the gate the next smaller one is tried, and the smallest that
    held is kept; when the largest misses, it is kept only if it scores better than none
    (``Gate.better``); else ``found`` as it was. Scored by ``cross`` (cross-validated over
    every calibration sample, in two halves) when it gives figures, else on the validation
    part: four validation windows of PP-OCRv4's recognizer scored the shares 97.5%, 96.2%,
    95.0%, 97.5% (25% to 90%), within their noise; its 17 windows cross-validated (one split
    into halves) 94.6%, 95.3%, 96.5%, 99.0%, the last +12.3 dB a window (SE 1.9) over the int8
    model, ahead on all 17 (the run's own split: 97.5% against 92.5% with none). A share is
    scored only while ``tries`` remain (the first too: none left, nothing tried)."""
    rungs = _rungs(ws, layers)
    if not rungs or tries <= 0:
        return found
    ladder = _Ladder(ws, build, cross, tries)
    largest = list(rungs[-1].in_float)
    first = ladder.first(largest)
    kept, why = _descend(ws, gate, found, ladder, rungs, first)
    if kept is None and first is not None and ladder.left():
        # the largest share misses the gate: kept only if it scores better than none
        none = ladder.score([]) if ladder.crossed else found.accuracy
        if none is not None and gate.better(first, none):
            kept = (rungs[-1], first)
            ws.say(
                f"{rungs[-1].node} in float scores better than none ({brief(none)} {ladder.where})"
            )
    if kept is None:
        return found
    part, figures = kept
    found.kept = [part]
    found.model = ladder.model_of(list(part.in_float))
    found.accuracy = ws.score(found.model) if ladder.crossed else figures
    found.stopped += f"; then {part.node} in float: " + (
        f"it misses the gate ({ladder.where}) but scores better than none"
        if gate.misses(figures)
        else f"the smallest share tried that holds the gate ({ladder.where}; {why})"
    )
    return found


class _Ladder:
    """How ``_leading`` scores a share: cross-validated where ``cross`` gives figures for
    the largest share, else on the validation part; each model built once; at most
    ``tries`` scorings."""

    def __init__(
        self,
        ws: Workspace,
        build: Callable[[list[str]], onnx.ModelProto],
        cross: Scorer | None,
        tries: int,
    ) -> None:
        self.ws, self.build, self.cross, self.tries = ws, build, cross, tries
        self.built: dict[tuple[str, ...], onnx.ModelProto] = {}
        self.crossed = False
        self.used = 0

    @property
    def where(self) -> str:
        return "cross-validated over the calibration samples" if self.crossed else "on validation"

    def left(self) -> bool:
        return self.used < self.tries

    def model_of(self, names: list[str]) -> onnx.ModelProto:
        if tuple(names) not in self.built:
            self.built[tuple(names)] = self.build(names)
        return self.built[tuple(names)]

    def first(self, largest: list[str]) -> list[OutputAccuracy] | None:
        self.used += 1
        if self.cross is not None and (figures := self.cross(largest)) is not None:
            self.crossed = True
            return figures
        return self.ws.score(self.model_of(largest))

    def score(self, names: list[str]) -> list[OutputAccuracy] | None:
        self.used += 1
        if self.crossed:
            assert self.cross is not None
            return self.cross(names)
        return self.ws.score(self.model_of(names))


def _descend(
    ws: Workspace,
    gate: Gate,
    found: FallbackResult,
    ladder: _Ladder,
    rungs: list[KeptFloat],
    first: list[OutputAccuracy] | None,
) -> tuple[tuple[KeptFloat, list[OutputAccuracy]] | None, str]:
    """The shares from the largest down while each holds the gate: the smallest that held
    (None: the largest misses) and why the descent stopped."""
    kept: tuple[KeptFloat, list[OutputAccuracy]] | None = None
    why = "no smaller share to try"
    figures = first
    where = "cross-validated" if ladder.crossed else "validation"
    for k, part in enumerate(reversed(rungs)):
        if k:
            if not ladder.left():
                why = f"the {ladder.tries} tries left spent"
                break
            figures = ladder.score(list(part.in_float))
        if figures is None:
            found.tried(part.node, None, where, False)
            why = f"{part.node} could not be scored"
            ws.say(f"fallback try {found.tries}: {why}")
            break
        passes = not gate.misses(figures)
        found.tried(part.node, figures, where, passes)
        ws.say(
            f"fallback try {found.tries}: {part.node} in float: {brief(figures)} {ladder.where}"
            + (", the gate holds" if passes else "")
        )
        if not passes:
            why = "the next smaller share misses it"
            break
        kept = (part, figures)
    return kept, why


def _group(ranked: list[KeptFloat], layers: list[str], exclude: list[str]) -> list[KeptFloat]:
    """The worst MAX_FLOAT_LAYERS candidates, without the one that would leave no layer
    in int8."""
    group: list[KeptFloat] = []
    for k in ranked:
        if len(group) >= MAX_FLOAT_LAYERS:
            break
        in_float = {n for g in [*group, k] for n in g.in_float} | set(exclude)
        if layers and set(layers) <= in_float:
            continue
        group.append(k)
    return group


STEM = "float-stem"


def stem_recipes(chosen: tuple[str, ...], forced: bool) -> list[tuple[str, ...]]:
    """The recipes the fallback tries first, the stem in float (``float_stem.py``): the
    chosen recipe with it and, unless the user forced the recipe, the same without its
    ranges step and bias correction (global min/max ranges): with the stem in float a
    narrower range's clipping costs more than the rounding it saves (PP-OCRv4's detector,
    map IoU on the held-back photos: `float-stem,mean-minmax` 90.4%,
    `float-stem,minmax,bias-correction` 90.8%, `float-stem` 95.7%)."""
    if STEM in chosen:
        return []
    with_stem = recipes.with_step(chosen, STEM)
    plain = recipe_steps(
        [s for s in with_stem if STEPS[s].phase != "ranges" and not s.startswith("bias-correction")]
    )
    return list(dict.fromkeys([with_stem] if forced else [with_stem, plain]))


def stem_first(
    ws: Workspace,
    gate: Gate,
    chosen: recipes.Built,
    tried: list[recipes.Built],
    forced: bool,
    tries: int = FALLBACK_TRIES,
    scored: list[recipes.Built] | None = None,
) -> recipes.Built | None:
    """The best recipe with the stem in float (``stem_recipes``) when it scores better than
    ``chosen`` (``Gate.better``) as the recipe search scored it: cross-validated where the
    search was (``tried`` holds those figures), else on the validation part. None: no gain.
    Mixed precision: the stem's layers lose their int8 kernels, so it is tried only when
    the recipe misses the gate, and kept only on a gain (the caller confirms it on the
    evaluation samples, as the rest of the fallback's choice). Each recipe is one of the
    fallback's ``tries``: the first always runs, the next only within them."""
    candidates = [s for s in stem_recipes(chosen.steps, forced) if STEPS[STEM].applies(ws)]
    if not candidates:
        return None
    halves = recipes.folds(ws)

    def score(steps: tuple[str, ...]) -> recipes.Built:
        if halves is None:
            return recipes.scored(ws, steps)
        return recipes.cross_validated(ws, halves, steps)

    base = chosen
    if halves is not None:
        same = [t for t in tried if t.steps == chosen.steps and t.cross_validated]
        base = same[0] if same else score(chosen.steps)
    best: recipes.Built | None = None
    for k, steps in enumerate(candidates):
        if k and k >= tries:
            ws.say(
                f"the stem in float: {recipes.recipe_name(steps)} not tried (the fallback's "
                f"{tries} tries spent)"
            )
            break
        made = score(steps)
        if scored is not None:  # what was tried, for the caller to say
            scored.append(made)
        if made.error:
            continue
        if gate.better(made.accuracy, (best or base).accuracy):
            best = made
    return best
