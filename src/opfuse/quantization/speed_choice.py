"""The fastest model that keeps the answers (``opfuse quantize``'s steps 7 and 8): the
recipe search and the restorer choose by accuracy, so a recipe of another *form* (what
runs: dynamic or static MatMuls, int4 weights, requantizations dropped, a decomposed op)
that also passes the gate may be the faster model. Up to ``alternatives_for`` such
recipes, the most accurate of each form that passed on the validation part, are built
with what the restorer kept in float, judged on the held-back samples, and timed with the
chosen model in one paired, interleaved measurement; one replaces the chosen model only
when it is faster beyond the noise, and again in a second run in the reverse order
(``confirmed``, as tune confirms a flip): on a busy machine the noise grows and the most
accurate model stays, so the same data and options keep the same model whenever the
speeds are not clearly apart. With the speed not measured (``--no-benchmark``) or a forced
recipe, nothing is tried.

Measured before this step existed: PP-OCRv4's recognizer passed its gate with
float-requant at 0.55x the float original and without it at 0.46x; a decoder's int4
weights decode at 0.33x where dynamic int8, the more accurate, gives 0.45x."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from opfuse.quantization import recipes
from opfuse.quantization.accuracy import brief
from opfuse.quantization.fallback import STEM as FLOAT_STEM
from opfuse.quantization.gate import Gate
from opfuse.quantization.restore import Evaluator, Restoration
from opfuse.quantization.result import INT8
from opfuse.quantization.steps import DYNAMIC, WEIGHT_ONLY, recipe_name, recipe_steps
from opfuse.tuning.measure import Measurement, pct

# the steps that change what runs (the others change scales or weights only)
FORM_STEPS = frozenset({"float-decomposed", "float-requant", DYNAMIC, *WEIGHT_ONLY, "smoothquant"})
MAX_ALTERNATIVES = 2  # one on a graph of more than recipes.LARGE_GRAPH_NODES nodes


def form(steps: Sequence[str]) -> tuple[str, ...]:
    return tuple(s for s in steps if s in FORM_STEPS)


def alternatives_for(nodes: int) -> int:
    """How many recipes of other forms are tried: each is one more quantization."""
    return MAX_ALTERNATIVES if nodes <= recipes.LARGE_GRAPH_NODES else 1


def label(recipe: Sequence[str]) -> str:
    """The measurement's label of an int8 model (``int8 (minmax,dynamic)``)."""
    return f"{INT8} ({recipe_name(tuple(recipe))})"


def other_forms(
    gate: Gate,
    tried: Sequence[recipes.Built],
    chosen: Sequence[str],
    count: int,
    restored: bool = False,
) -> list[tuple[str, ...]]:
    """The recipes of other forms than ``chosen``'s that passed the gate on the
    validation part (any, where the restorer kept parts in float, ``restored``: with
    those parts in float they may pass, as the chosen one did): the most accurate of each
    form (``Gate.better``), in the order the search met the forms, at most ``count``;
    with ``chosen``'s stem in float where it has one."""
    best: dict[tuple[str, ...], recipes.Built] = {}
    for t in tried:
        if t.error or not t.accuracy or FLOAT_STEM in t.steps:
            continue
        if gate.misses(t.accuracy) and not restored:
            continue
        key = form(t.steps)
        if key == form(chosen):
            continue
        if key not in best or gate.better(t.accuracy, best[key].accuracy):
            best[key] = t
    stem = [FLOAT_STEM] if FLOAT_STEM in chosen else []
    return [recipe_steps([*t.steps, *stem]) for t in list(best.values())[:count]]


def candidates(
    ev: Evaluator, gate: Gate, restored: Restoration, recipes_to_try: list[tuple[str, ...]]
) -> list[Restoration]:
    """Each recipe built on every calibration sample with the parts the restorer kept in
    float, kept where its figures on the held-back samples pass the gate and its graph is
    not one already there (the chosen model's, another candidate's)."""
    in_float = list(dict.fromkeys(n for k in restored.kept for n in k.in_float))
    out: list[Restoration] = []
    seen = {restored.model.graph.SerializeToString()}
    for recipe in recipes_to_try:
        model = ev.final(in_float, recipe)
        graph = model.graph.SerializeToString()
        if graph in seen:  # float-requant where nothing is requantized, say
            ev.ws.say(f"recipe {recipe_name(recipe)} makes the same model: not timed")
            continue
        seen.add(graph)
        figures = ev.on_held(model)
        missed = gate.misses(figures)
        ev.ws.say(
            f"recipe {recipe_name(recipe)} for its speed: {brief(figures)} on the evaluation "
            f"samples ({'misses the gate' if missed else 'passes the gate'})"
        )
        if not missed:
            # its own record: the figures before a fallback are the most accurate recipe's
            other = dataclasses.replace(
                restored, model=model, accuracy=figures, recipe=recipe, searched=recipe
            )
            out.append(dataclasses.replace(other, first_model=model, first_accuracy=[]))
    return out


@dataclass(frozen=True)
class Choice:
    """The label of the int8 model kept (INT8: the most accurate), the measurement with
    it under INT8 (the others under ``label``), and the choice said."""

    kept: str
    speed: Measurement
    note: str


def choose(speed: Measurement, chosen: Sequence[str], others: dict[str, tuple[str, ...]]) -> Choice:
    """The alternative (``others``: label -> recipe) with the lowest paired ratio to the
    original where it beats the most accurate model (INT8, recipe ``chosen``) beyond the
    noise; else INT8. The measurement comes back with the kept model under INT8."""
    if not others:
        return Choice(INT8, speed, "")
    fastest = min(others, key=speed.ratio)
    figures = (
        f"{recipe_name(others[fastest])} runs at {speed.ratio(fastest, INT8):.2f}x the time "
        f"of the most accurate recipe, {recipe_name(tuple(chosen))} (paired; noise "
        f"+-{pct(speed.threshold)})"
    )
    if not speed.faster(fastest, INT8):
        names = ", ".join(recipe_name(r) for r in others.values())
        one = len(others) == 1
        return Choice(
            INT8,
            speed,
            f"recipe{'' if one else 's'} {names} also pass{'es' if one else ''} the gate; "
            f"{'' if one else 'the faster of them, '}{figures}: not faster beyond the noise, "
            "the most accurate kept",
        )
    swapped = {
        label(chosen) if k == INT8 else INT8 if k == fastest else k: v
        for k, v in speed.times.items()
    }
    return Choice(
        fastest,
        dataclasses.replace(speed, times=swapped),
        f"the fastest model that keeps the answers: recipe {figures}, and passes the gate "
        "too: kept",
    )


def confirmed(choice: Choice, again: Measurement, chosen: Sequence[str]) -> Choice:
    """``choice`` where ``again`` (a second run in the reverse order, labelled as the
    first: the most accurate model under INT8) finds its model faster beyond the noise
    too; else the most accurate model, said."""
    if choice.kept == INT8 or again.faster(choice.kept, INT8):
        return choice
    first = choice.speed.times
    restored = {
        INT8 if k == label(chosen) else choice.kept if k == INT8 else k: v for k, v in first.items()
    }
    return Choice(
        INT8,
        dataclasses.replace(choice.speed, times=restored),
        choice.note.replace(", and passes the gate too: kept", "")
        + f"; a second run in the reverse order gave {again.ratio(choice.kept, INT8):.2f}x "
        f"(noise +-{pct(again.threshold)}): not confirmed, the most accurate kept",
    )
