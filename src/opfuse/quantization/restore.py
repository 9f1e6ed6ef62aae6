"""The accuracy restorer: after the recipe search, in one place and in this order, what
``opfuse quantize`` keeps in float to restore accuracy, each kept only on a measured gain:

1. **heads**: a classifier head's output in float where requantizing it changes the top
   class (``heads``), judged on the validation part;
2. **the stem** (``fallback.stem_first``): the recipe with its leading layers in float,
   tried only when the held-back samples miss the gate, confirmed on them;
3. **parts, then the leading layers** (``fallback.fallback``): the most sensitive parts in
   float, or where the error is spread a share of the leading layers, confirmed on the
   held-back samples.

Every model is built and scored through one ``Evaluator`` (the recipe chosen so far, the
heads kept in float, the three ways to score), not through closures over the
conductor's state; the restorer returns a frozen ``Restoration``: the model chosen, its
figures, and what each try scored and cost (as NNCF's accuracy-control restorer takes
an evaluator and reports its tries). Its budget is a count of tries (``fallback_tries``),
not seconds: the same model and data restore the same way on an idle or a busy machine."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from opfuse.quantization import heads, recipes
from opfuse.quantization.accuracy import OutputAccuracy, Task, brief
from opfuse.quantization.fallback import KeptFloat, Trial, fallback, stem_first
from opfuse.quantization.gate import Gate
from opfuse.quantization.workspace import Sample, Workspace, run_model


@dataclass(frozen=True)
class Restoration:
    """What the restorer chose: the model to write (``model``, calibrated on every
    calibration sample) and its figures on the held-back samples, the model before any
    fallback (``first_*``), the recipe (``recipe``: the search's, or with the stem in
    float), the parts kept in float, the heads, the fallback's tries and why it stopped,
    and every trial."""

    model: onnx.ModelProto
    accuracy: list[OutputAccuracy]
    first_model: onnx.ModelProto
    first_accuracy: list[OutputAccuracy]
    recipe: tuple[str, ...]
    searched: tuple[str, ...]
    kept: list[KeptFloat]
    heads: list[heads.HeadChoice]
    fallback_tries: int
    fallback_stopped: str
    trials: tuple[Trial, ...] = ()


@dataclass
class Evaluator:
    """Builds the int8 model of the recipe chosen so far (``recipe``, the heads kept in
    float) with some node names in float, and scores a model three ways: on the
    validation part (``valid``), cross-validated over every calibration sample
    (``cross``), on the held-back samples (``held``). ``final`` builds the model written:
    calibrated on every calibration sample (the validation part only chooses)."""

    ws: Workspace
    everything: Workspace  # ws on every calibration sample
    apart: bool  # the validation part is apart from the calibration part
    held: list[Sample]
    held_reference: list[list[np.ndarray]]
    recipe: tuple[str, ...]
    split_model: onnx.ModelProto  # the recipe's model on the calibration part
    split_recipe: tuple[str, ...]
    float_heads: tuple[str, ...] = ()
    task: Task | None = None  # the user's labels or metric, judged on the held samples
    builds: int = 0  # int8 models built so far
    _halves: list[list[Workspace] | None] = field(default_factory=list)  # made once

    def build(self, in_float: list[str], recipe: tuple[str, ...] = ()) -> onnx.ModelProto:
        """On the calibration part, from the workspace before any step (a float step
        runs once: its result is cached); ``recipe``: another than the one chosen."""
        self.builds += 1
        made = recipes.build(self.ws, recipe or self.recipe, in_float, self.float_heads)
        assert made.model is not None
        return made.model

    def final(self, in_float: list[str], recipe: tuple[str, ...] = ()) -> onnx.ModelProto:
        recipe = recipe or self.recipe
        if not self.apart:
            if in_float or recipe != self.split_recipe:
                return self.build(in_float, recipe)
            return self.split_model
        self.ws.say(
            f"recipe {recipes.recipe_name(recipe)} on all {len(self.everything.calib)} "
            "calibration samples"
        )
        self.builds += 1
        made = recipes.build(self.everything, recipe, in_float, self.float_heads)
        assert made.model is not None
        return made.model

    def cross(self, in_float: list[str]) -> list[OutputAccuracy] | None:
        """The recipe with these nodes in float, cross-validated over every calibration
        sample (a few validation samples cannot tell 98% from 99%: fallback._leading);
        None where there are too few samples to."""
        if not self._halves:
            self._halves.append(recipes.folds(self.ws, always=True))
        if self._halves[0] is None:
            return None
        self.builds += 2
        made = recipes.cross_validated(
            self.ws, self._halves[0], self.recipe, in_float, self.float_heads, say=False
        )
        return None if made.error else made.accuracy

    def valid(self, model: onnx.ModelProto) -> list[OutputAccuracy]:
        return self.ws.score(model)

    def on_held(self, model: onnx.ModelProto) -> list[OutputAccuracy]:
        got = run_model(model, self.held, self.ws.name, internal=True)
        return self.ws.compare(self.held_reference, got, self.held, self.task)


@dataclass
class _State:
    """The restorer's choice so far (one owner: ``restore`` and its steps)."""

    model: onnx.ModelProto
    accuracy: list[OutputAccuracy]
    valid_figures: list[OutputAccuracy]
    ranked_on: Workspace  # the workspace the fallback ranks its candidates on
    kept: list[KeptFloat] = field(default_factory=list)
    tries: int = 0
    stopped: str = ""
    trials: list[Trial] = field(default_factory=list)


def restore(
    ev: Evaluator,
    gate: Gate,
    best: recipes.Built,
    tried: list[recipes.Built],
    forced: bool,
    budget: int,
) -> Restoration:
    """Heads, then (while the held-back samples miss the gate, within ``budget`` tries)
    the stem, then parts or the leading layers (the module's steps)."""
    assert best.model is not None
    head_choices, model, valid_figures = _heads(ev, best.model, best.accuracy)
    ev.split_model, ev.split_recipe = model, ev.recipe
    first_model = ev.final([])
    first = ev.on_held(first_model)
    state = _State(first_model, first, valid_figures, best.ws)
    searched = ev.recipe
    spent = 0
    if gate.misses(first) and budget > 0:
        spent = _stem(ev, gate, best, tried, forced, budget, state, first)
    if gate.misses(state.accuracy) and budget > 0:
        if budget - spent > 0:
            _parts(ev, gate, state, budget - spent)
        else:
            state.stopped = f"its {budget} tries, spent on the stem in float"
    return Restoration(
        state.model,
        state.accuracy,
        first_model,
        first,
        ev.recipe,
        searched,
        state.kept,
        head_choices,
        state.tries,
        state.stopped,
        tuple(state.trials),
    )


def _heads(
    ev: Evaluator, model: onnx.ModelProto, figures: list[OutputAccuracy]
) -> tuple[list[heads.HeadChoice], onnx.ModelProto, list[OutputAccuracy]]:
    """Step 1: each head's output in float where requantizing it changes the top class
    (on the validation part); the heads kept go onto the evaluator."""
    ws = ev.ws
    choices: list[heads.HeadChoice] = []
    for out_name, op_type in heads.requantized_heads(model, ws.scoring).items():
        candidate = heads.float_output(model, out_name)
        now_figures = ws.score(candidate)
        was = next(a for a in figures if a.name == out_name)
        now = next(a for a in now_figures if a.name == out_name)
        keep = heads.keep_float(was.top1, now.top1, was.sqnr_db, now.sqnr_db)
        choices.append(
            heads.HeadChoice(out_name, op_type, was.top1, now.top1, keep, was.sqnr_db, now.sqnr_db)
        )
        ws.say(choices[-1].describe())
        if keep:
            ev.float_heads = (*ev.float_heads, out_name)
            model, figures = candidate, now_figures
    return choices, model, figures


def _stem(
    ev: Evaluator,
    gate: Gate,
    best: recipes.Built,
    tried: list[recipes.Built],
    forced: bool,
    budget: int,
    state: _State,
    first: list[OutputAccuracy],
) -> int:
    """Step 2: the recipe with the stem in float, kept when the held-back samples score
    better than the first model; the tries it spent."""
    ws = ev.ws
    stem_tries: list[recipes.Built] = []
    builds = ev.builds
    stem = stem_first(ws, gate, best, tried, forced, budget, stem_tries)
    tried.extend(stem_tries)
    if stem is None:
        if stem_tries:
            ws.notes.append(
                "with the stem in float ("
                + "; ".join(t.line() for t in stem_tries)
                + f") did not score better than recipe {best.name}: not kept"
            )
        return len(stem_tries)
    searched = ev.recipe
    ev.recipe = stem.steps
    candidate = ev.final([])
    figures = ev.on_held(candidate)
    ws.say(f"the stem in float: recipe {stem.name}: {brief(figures)} on the evaluation samples")
    kept = gate.better(figures, first)
    state.trials.append(
        Trial(f"recipe {stem.name}", tuple(figures), "evaluation", kept, ev.builds - builds)
    )
    if not kept:
        ev.recipe = searched
        ws.notes.append(
            f"with the stem in float (recipe {stem.name}) the evaluation samples did "
            f"not score better ({brief(figures)} against {brief(first)}): not kept"
        )
        return len(stem_tries)
    state.model, state.accuracy = candidate, figures
    for t in tried:  # the search's choice is not the model written
        t.kept = t is stem
    ws.notes.append(
        f"recipe {recipes.recipe_name(searched)} missed the gate ({brief(first)}); with the "
        "stem in float (mixed precision: its layers lose their int8 kernels) recipe "
        f"{stem.name} reached {brief(figures)} on the evaluation samples"
    )
    if gate.misses(figures):  # the rest of the fallback starts from it
        made = recipes.build(ws, ev.recipe, [], ev.float_heads)
        assert made.model is not None
        state.ranked_on, ev.split_model, ev.split_recipe = made.ws, made.model, ev.recipe
        state.valid_figures = ws.score(made.model)
    return len(stem_tries)


def _parts(ev: Evaluator, gate: Gate, state: _State, budget: int) -> None:
    """Step 3: the most sensitive parts, or the leading layers, in float (chosen on the
    validation part or cross-validated), kept when the held-back samples confirm it."""
    ws = ev.ws
    found = fallback(
        state.ranked_on, gate, ev.build, ev.split_model, state.valid_figures, budget, ev.cross
    )
    state.tries, state.stopped = found.tries, found.stopped
    state.trials.extend(found.trials)
    if not found.kept:
        return
    builds = ev.builds
    candidate = ev.final(found.exclude)
    figures = ev.on_held(candidate)
    better = gate.better(figures, state.accuracy)
    what = ", ".join(k.node for k in found.kept) + " in float"
    state.trials.append(Trial(what, tuple(figures), "evaluation", better, ev.builds - builds))
    if better:
        state.kept, state.model, state.accuracy = found.kept, candidate, figures
        return
    ws.notes.append(  # parts in float cost speed: only for a gain that holds
        f"the fallback's choice on the validation part ({', '.join(k.node for k in found.kept)} "
        f"in float) did not score better on the evaluation samples ({brief(figures)} "
        f"against {brief(state.accuracy)}): the model without it is kept"
    )
    state.stopped += "; not kept: the evaluation samples scored no better"
