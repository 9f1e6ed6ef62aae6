"""The optimizer on a model in memory: the opset conversion when asked for (or needed), the
passes as stages, rounds until nothing changes, and what the loader did for a pass logged
under it."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterable, Mapping

import onnx_ir as ir

from opfuse.model import io
from opfuse.model.constants import LIFTED_KEY, MERGED_KEY
from opfuse.model.graphs import all_graphs
from opfuse.model.shapes import infer_shapes
from opfuse.pipeline.gcpause import paused_gc
from opfuse.pipeline.opset import convert_opset, default_opset
from opfuse.pipeline.phases import Phases
from opfuse.pipeline.result import OptimizeResult
from opfuse.pipeline.rounds import ChangeClock
from opfuse.pipeline.selection import (
    COMMON_SUBEXPRESSIONS,
    CONSTANT_FOLDING,
    Selection,
    select,
)
from opfuse.rewrite.builder import SharedConstants
from opfuse.rewrite.context import Options, PassContext
from opfuse.rewrite.driver import Driver
from opfuse.rewrite.registry import PassInfo
from opfuse.rewrite.stats import EffectLog
from opfuse.rules.constant_folding import ConstantNodeRule
from opfuse.rules.cse import DUPLICATE_INITIALIZERS

MAX_ROUNDS = 6


def op_counts(model: ir.Model) -> Counter[str]:
    """Node count by op type over the main graph and its subgraphs."""
    graphs = all_graphs(model.graph)
    return Counter(node.op_type for g in graphs for node in g)


@paused_gc()
def optimize_model(
    model: ir.Model,
    *,
    switch_table: Mapping[str, Mapping[str, bool]] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    options: Options | None = None,
    shapes_inferred: bool = False,
    phases: Phases | None = None,
    selection: Selection | None = None,
) -> OptimizeResult[ir.Model]:
    """Run the enabled passes on ``model`` in place until nothing changes.

    ``selection``: the passes already chosen (``pipeline.selection.select``); without it
    they are chosen here from ``switch_table``, ``enable`` and ``disable``.
    With ``options.target_opset`` the model is first converted with onnx's version
    converter (never otherwise: a model's opset is the user's choice, unless it is below
    ``io.MIN_OPSET``). ``shapes_inferred``: the loader already ran shape inference
    (``io.load_model(infer=True)``). ``phases`` hears each round as it starts.
    """
    start = time.perf_counter()
    if selection is None:
        selection = select(switch_table, enable, disable)
    given = model
    model, options, converted_from = _converted(model, options or Options())
    shapes_inferred = shapes_inferred and model is given
    ctx = PassContext(model, options, EffectLog())
    if converted_from is not None:
        ctx.notes.append(
            f"opset {converted_from} converted to {io.MIN_OPSET} (the oldest opfuse optimizes) "
            "with onnx's version converter"
        )
    runnable, warnings, skipped = selection.runnable(ctx.opset, options.target)
    if any(p.name == COMMON_SUBEXPRESSIONS for p in runnable):
        ctx.shared_constants = SharedConstants()  # the copies it would merge are never made
    result = OptimizeResult(
        model, ctx.log, [p.name for p in runnable], warnings, skipped, notes=ctx.notes
    )
    result.left_alone = io.set_aside_notes(model)
    result.before = op_counts(model)
    lifted = int(model.meta.pop(LIFTED_KEY, 0))  # the loader lifted them for the rule
    merged = int(model.meta.pop(MERGED_KEY, 0))  # and merged the equal ones for CSE
    if lifted:
        result.before["Constant"] += lifted
    unchanged = io.must_pass_unchanged(model)
    if unchanged is not None:
        result.passes = []
        result.left_alone.append(f"the whole model, written as it was read: {unchanged}")
        result.after = result.before
        return result
    if not shapes_inferred:
        infer_shapes(model)
    _rounds(ctx, runnable, result, phases or Phases())
    ctx.current = None
    _record_load_work(ctx, selection, CONSTANT_FOLDING, ConstantNodeRule.name, lifted)
    shared = ctx.shared_constants.hits if ctx.shared_constants is not None else 0
    _record_load_work(
        ctx, selection, COMMON_SUBEXPRESSIONS, DUPLICATE_INITIALIZERS, merged + shared
    )
    result.after = op_counts(model)
    result.seconds = time.perf_counter() - start
    return result


def _converted(model: ir.Model, options: Options) -> tuple[ir.Model, Options, int | None]:
    """The model at ``options.target_opset`` (a new model when converted), the options,
    and the opset converted from when the model was below ``io.MIN_OPSET`` unasked."""
    converted_from = None
    current = default_opset(model)
    if current is not None and current < io.MIN_OPSET and options.target_opset is None:
        converted_from, options = current, dataclasses.replace(options, target_opset=io.MIN_OPSET)
    if options.target_opset is not None:
        model = convert_opset(model, options.target_opset)
    return model, options, converted_from


def _stages(passes: list[PassInfo]) -> list[list[PassInfo]]:
    """Consecutive rule passes share one worklist; a graph function is a stage alone."""
    stages: list[list[PassInfo]] = []
    for info in passes:
        if info.rules and stages and stages[-1][0].rules:
            stages[-1].append(info)
        else:
            stages.append([info])
    return stages


def _rounds(
    ctx: PassContext, runnable: list[PassInfo], result: OptimizeResult[ir.Model], phases: Phases
) -> None:
    """The stages, round after round, until a round changes nothing (at most MAX_ROUNDS);
    shape inference between rounds. The rounds and the seconds per stage go in ``result``."""
    log, clock = ctx.log, ChangeClock()
    for round_no in range(1, MAX_ROUNDS + 1):
        result.rounds = round_no
        phases.tell(f"optimize: round {round_no}")
        before = log.effected()
        for stage in _stages(runnable):
            label = "+".join(p.name for p in stage)
            if not clock.must_run(label, stage):
                continue
            stage_start = time.perf_counter()
            stage_before = log.effected()
            if stage[0].rules:
                Driver(ctx, stage).run()
            else:
                ctx.current = stage[0]
                assert stage[0].run is not None
                stage[0].run(ctx)
            clock.ran(label, stage, log.effected() - stage_before)
            _add_seconds(result, label, stage_start)
        if log.effected() == before:
            break
        shapes_start = time.perf_counter()
        clock.record("shapes", infer_shapes(ctx.model))
        _add_seconds(result, "(shape inference)", shapes_start)


def _add_seconds(result: OptimizeResult[ir.Model], label: str, since: float) -> None:
    took = time.perf_counter() - since
    result.pass_seconds[label] = result.pass_seconds.get(label, 0.0) + took


def _record_load_work(
    ctx: PassContext, selection: Selection, pass_name: str, pattern: str, count: int
) -> None:
    """What the loader or the rewrites did for a pass (``io.load_model(lift=True,
    merge=True)``: the Constants lifted, the equal ones merged; the copies of a constant
    the rewrites did not make), in the effect log as the pattern that would have done it
    (its line exists once its pass has run)."""
    info = selection.named(pass_name)
    if count and info is not None:
        stats = ctx.entry(pattern, info)
        stats.matched += count
        stats.effected += count
