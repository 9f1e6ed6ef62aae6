"""The engine's entry points the CLI and the public API (``opfuse.api``) call:
optimize a model in memory or file to file, verify it, and blame the pass that broke it."""

from __future__ import annotations

import dataclasses
import functools
import io as _bytes_io
import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import onnx
import onnx.version_converter
import onnx_ir as ir

from opfuse.errors import OpfuseError, VerificationError, first_line
from opfuse.model import io
from opfuse.model.constants import LIFTED_KEY, MERGED_KEY
from opfuse.model.graphs import all_graphs
from opfuse.model.shapes import declare_static_inputs, infer_shapes
from opfuse.pipeline.gcpause import paused_gc
from opfuse.pipeline.phases import Phases
from opfuse.pipeline.rounds import ChangeClock
from opfuse.pipeline.switch import SwitchTable, parse_switch_file, resolve
from opfuse.rewrite.builder import SharedConstants
from opfuse.rewrite.context import Options, PassContext
from opfuse.rewrite.driver import Driver
from opfuse.rewrite.registry import PassInfo
from opfuse.rewrite.stats import EffectLog
from opfuse.rules import all_passes, get_pass
from opfuse.rules.constant_folding import ConstantNodeRule
from opfuse.rules.cse import DUPLICATE_INITIALIZERS
from opfuse.verification.bisect import first_bad_pass
from opfuse.verification.compare import VerifyReport, check_feeds, compare_files, session
from opfuse.verification.messages import failure_message, inputs_text, worst_share

MAX_ROUNDS = 6
CONSTANT_FOLDING = "ConstantFoldingFusionPass"  # its constant_node rule's lifts run at load
COMMON_SUBEXPRESSIONS = "CommonSubexpressionFusionPass"  # on: rewrites share equal constants
logger = logging.getLogger("opfuse")
ModelT = TypeVar("ModelT")


def op_counts(model: ir.Model) -> Counter[str]:
    """Node count by op type over the main graph and its subgraphs."""
    graphs = all_graphs(model.graph)
    return Counter(node.op_type for g in graphs for node in g)


@dataclass(repr=False)
class OptimizeResult(Generic[ModelT]):
    """What one optimize run did. ``model`` is the optimized model, of the kind given to
    ``opfuse.optimize`` (an ``onnx.ModelProto`` for a ModelProto, an ``onnx_ir.Model``
    for an onnx_ir.Model or a path); ``summary()`` says what changed, ``save()`` writes it."""

    model: ModelT
    log: EffectLog
    passes: list[str]  # the passes that ran, in execution order
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # parts of the model no pass touched because onnx-ir cannot hold them (map types...)
    left_alone: list[str] = field(default_factory=list)
    before: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    seconds: float = 0.0  # the passes' time (timings has every phase)
    verify: VerifyReport | None = None
    input_bytes: int = 0
    output_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # seconds per stage of passes over all rounds (the rules of one worklist share a stage)
    pass_seconds: dict[str, float] = field(default_factory=dict)
    output: Path | None = None  # the file written, when one was asked for
    # a temporary folder the model's lazy external tensors still read from
    workdir: Any = field(default=None, compare=False)

    @property
    def changed(self) -> bool:
        """Whether any pass changed the model."""
        return self.log.effected() > 0 or bool(self.notes)

    def fired(self) -> list[str]:
        """The passes that changed the model, in execution order."""
        return [name for name in self.passes if self.log.effected(name) > 0]

    def __repr__(self) -> str:
        verified = "off" if self.verify is None else ("ok" if self.verify.ok else "FAILED")
        return (
            f"<OptimizeResult {type(self.model).__name__}: nodes {sum(self.before.values())} -> "
            f"{sum(self.after.values())}, {len(self.fired())} passes fired, {self.rounds} rounds, "
            f"verification {verified}>"
        )

    def summary(self) -> str:
        """A few lines: node counts, what changed, verification, time per phase."""
        n_before, n_after = sum(self.before.values()), sum(self.after.values())
        lines = [f"nodes {n_before} -> {n_after}"]
        changes = sorted(
            (op for op in set(self.before) | set(self.after) if self.before[op] != self.after[op]),
            key=lambda op: (self.after[op] - self.before[op], op),
        )
        if changes:
            lines[0] += ": " + ", ".join(
                f"{op} {self.before[op]} -> {self.after[op]}" for op in changes
            )
        fired = self.fired()
        if fired:
            lines.append(f"passes that fired ({self.rounds} rounds): {', '.join(fired)}")
        else:
            lines.append("no pass changed the model")
        lines.append(f"verification: {verification_text(self.verify)}")
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"left alone: {part}" for part in self.left_alone]
        if self.timings:
            lines.append("time: " + timings_text(self.timings))
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        """The machine-readable summary ``optimize --format json`` prints."""
        per_pass: dict[str, dict[str, int]] = {}
        for s in self.log:
            entry = per_pass.setdefault(s.pass_name, {"matched": 0, "effected": 0})
            entry["matched"] += s.matched
            entry["effected"] += s.effected
        return {
            "schema": "opfuse.optimize/1",
            "changed": self.changed,
            "output": None if self.output is None else str(self.output),
            "nodes": {"before": sum(self.before.values()), "after": sum(self.after.values())},
            "op_types": {
                op: {"before": self.before[op], "after": self.after[op]}
                for op in sorted(set(self.before) | set(self.after))
            },
            "bytes": {"before": self.input_bytes, "after": self.output_bytes},
            "rounds": self.rounds,
            "passes": [{"name": name, **per_pass.get(name, {})} for name in self.passes],
            "patterns": [
                {
                    "pass": s.pass_name,
                    "pattern": s.pattern,
                    "matched": s.matched,
                    "effected": s.effected,
                }
                for s in self.log
            ],
            "verification": None if self.verify is None else self.verify.to_json(),
            "warnings": self.warnings,
            "notes": self.notes,
            "left_alone": self.left_alone,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "pass_seconds": {k: round(v, 4) for k, v in self.pass_seconds.items()},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the optimized model to ``path`` atomically (external data beside it when
        the weights are over 2 GB or came from external data)."""
        model = self.model
        if isinstance(model, onnx.ModelProto):
            return io.write_bytes(path, model.SerializeToString(), what="the model")
        if not isinstance(model, ir.Model):
            raise OpfuseError(f"cannot save a {type(model).__name__}")
        return io.save_model(model, path)


def timings_text(timings: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in timings.items())


def verification_text(report: VerifyReport | None) -> str:
    if report is None:
        return "off"
    if not report.ok:
        return "FAILED"
    n = len(report.outputs)
    return (
        f"ok ({n} output{'s' if n != 1 else ''}, {worst_share(report)}; "
        f"inputs {inputs_text(report)})"
    )


def _stages(passes: list[PassInfo]) -> list[list[PassInfo]]:
    """Consecutive rule passes share one worklist; a graph function is a stage alone."""
    stages: list[list[PassInfo]] = []
    for info in passes:
        if info.rules and stages and stages[-1][0].rules:
            stages[-1].append(info)
        else:
            stages.append([info])
    return stages


def default_opset(model: ir.Model) -> int | None:
    """The model's default-domain opset; None when it imports only other domains."""
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def convert_opset(model: ir.Model, target: int) -> ir.Model:
    """A new model converted to default-domain opset ``target`` (never lowered)."""
    current = default_opset(model)
    if current is None:
        raise OpfuseError("--target-opset: the model imports no default-domain opset")
    if target < current:
        raise OpfuseError(f"--target-opset {target} is lower than the model's opset {current}")
    if not io.MIN_OPSET <= target <= io.MAX_OPSET:
        raise OpfuseError(f"--target-opset {target} is outside {io.MIN_OPSET}..{io.MAX_OPSET}")
    if target == current:
        return model
    try:
        converted = onnx.version_converter.convert_version(io.to_proto(model), target)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError
        first = first_line(exc)
        raise OpfuseError(f"cannot convert the model to opset {target}: {first}") from None
    new = io.from_proto(converted)
    base_dirs = {
        v.name: v.const_value.base_dir
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }
    if base_dirs:
        ir.external_data.set_base_dir(new.graph, next(iter(base_dirs.values())))
    return new


def select_passes(
    switch_table: Mapping[str, Mapping[str, bool]] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    where: str = "switch file",
) -> tuple[list[PassInfo], list[str]]:
    chosen = resolve(all_passes(), switch_table, enable, disable, where=where)
    return chosen.enabled, chosen.warnings


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
) -> OptimizeResult[ir.Model]:
    """Run the enabled passes on ``model`` in place until nothing changes.

    With ``options.target_opset`` the model is first converted with onnx's version
    converter (never otherwise: a model's opset is the user's choice).
    ``shapes_inferred``: the loader already ran shape inference (``io.load_model(infer=True)``).
    ``phases`` hears each round as it starts.
    """
    start = time.perf_counter()
    options = options or Options()
    phases = phases or Phases()
    passes, warnings = select_passes(switch_table, enable, disable)
    log = EffectLog()
    converted_from = None
    current = default_opset(model)
    if current is not None and current < io.MIN_OPSET and options.target_opset is None:
        converted_from, options = current, dataclasses.replace(options, target_opset=io.MIN_OPSET)
    if options.target_opset is not None:
        converted = convert_opset(model, options.target_opset)
        shapes_inferred = shapes_inferred and converted is model
        model = converted
    ctx = PassContext(model, options, log)
    if converted_from is not None:
        ctx.notes.append(
            f"opset {converted_from} converted to {io.MIN_OPSET} (the oldest opfuse optimizes) "
            "with onnx's version converter"
        )
    asked = set(enable) | {
        name for entries in (switch_table or {}).values() for name, on in entries.items() if on
    }
    runnable: list[PassInfo] = []
    skipped: list[str] = []
    for info in passes:
        if info.section == "UBFusion" and options.target is None:
            continue  # target-specific fusions run only for a named runtime
        if not info.applies_to_opset(ctx.opset):
            why = f"{info.name} skipped: needs opset {info.opset_range}, model has {ctx.opset}"
            # a warning only when the user asked for it; --target-opset can raise the opset
            (warnings if info.name in asked else skipped).append(why)
            continue
        runnable.append(info)
    if any(p.name == COMMON_SUBEXPRESSIONS for p in runnable):
        ctx.shared_constants = SharedConstants()  # the copies it would merge are never made
    result = OptimizeResult(
        model, log, [p.name for p in runnable], warnings=warnings, skipped=skipped, notes=ctx.notes
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
    clock = ChangeClock()
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
            took = time.perf_counter() - stage_start
            result.pass_seconds[label] = result.pass_seconds.get(label, 0.0) + took
        if log.effected() == before:
            break
        shapes_start = time.perf_counter()
        clock.record("shapes", infer_shapes(model))
        took = time.perf_counter() - shapes_start
        result.pass_seconds["(shape inference)"] = (
            result.pass_seconds.get("(shape inference)", 0.0) + took
        )
    ctx.current = None
    _record_load_work(ctx, passes, CONSTANT_FOLDING, ConstantNodeRule.name, lifted)
    shared = ctx.shared_constants.hits if ctx.shared_constants is not None else 0
    _record_load_work(ctx, passes, COMMON_SUBEXPRESSIONS, DUPLICATE_INITIALIZERS, merged + shared)
    result.after = op_counts(model)
    result.seconds = time.perf_counter() - start
    return result


def _record_load_work(
    ctx: PassContext, passes: list[PassInfo], pass_name: str, pattern: str, count: int
) -> None:
    """What the loader or the rewrites did for a pass (``io.load_model(lift=True,
    merge=True)``: the Constants lifted, the equal ones merged; the copies of a constant
    the rewrites did not make), in the effect log as the pattern that would have done it
    (its line exists once its pass has run)."""
    info = next((p for p in passes if p.name == pass_name), None)
    if count and info is not None:
        stats = ctx.entry(pattern, info)
        stats.matched += count
        stats.effected += count


def optimize_file(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    fusion_switch_file: str | os.PathLike[str] | None = None,
    switch_table: SwitchTable | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    options: Options | None = None,
    verify: bool = True,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    seed: int = 0,
    fusion_result: str | os.PathLike[str] | None = None,
    save_failing_inputs: str | os.PathLike[str] | None = None,
    bisect: bool = True,
    phases: Phases | None = None,
    static_shapes: bool = False,
) -> OptimizeResult[ir.Model]:
    """Load, optimize, verify against the input and write atomically.

    ``static_shapes``: re-declare the inputs with ``input_shapes`` first (all shape
    arithmetic then folds; the output accepts only those shapes).
    Bad input raises OpfuseError before anything is written; a failed verification
    raises VerificationError naming the first pass to blame (``bisect``), saves the
    inputs to ``save_failing_inputs`` when given, and writes nothing else.
    """
    phases = phases or Phases()
    enable, disable = list(enable), list(disable)
    io.check_output_path(output_path, [input_path])
    for extra in (fusion_result, save_failing_inputs):
        if extra is not None:
            io.check_output_path(extra, [input_path, output_path])
    if fusion_switch_file is not None:
        switch_table = parse_switch_file(fusion_switch_file)
    # validate the switches and the user's verification inputs before the (possibly long) work
    chosen, _ = select_passes(
        switch_table, enable, disable, where=str(fusion_switch_file or "switch file")
    )
    if verify and (input_shapes or inputs_npz is not None):
        check_feeds(input_path, input_shapes, inputs_npz)
    if static_shapes and not input_shapes:
        raise OpfuseError("--static-shapes needs --input-shape NAME:D0,D1,... for the inputs")

    lift = any(p.name == CONSTANT_FOLDING for p in chosen)  # the rule's lifts, done at load
    merge = lift and any(p.name == COMMON_SUBEXPRESSIONS for p in chosen)  # and CSE's merges

    def load() -> ir.Model:
        """The input model, its inputs re-declared static with ``static_shapes``."""
        loaded = io.load_model(input_path, infer=not static_shapes, lift=lift, merge=merge)
        if static_shapes:
            declare_static_inputs(loaded, dict(input_shapes or {}))
        return loaded

    with paused_gc():  # one pause over both: the loaded graph is not garbage
        with phases("load"):
            model = load()
        if io.must_pass_unchanged(model) is not None:
            return _pass_unchanged(input_path, output_path, model, options, phases)
        external = io.has_external_data(model) or None  # keep external data external
        try:
            with phases("optimize"):
                result = optimize_model(
                    model,
                    switch_table=switch_table,
                    enable=enable,
                    disable=disable,
                    options=options,
                    shapes_inferred=not static_shapes,
                    phases=phases,
                )
        except OpfuseError as exc:  # e.g. --keep-inputs naming no tensor: name the file
            if str(input_path) in str(exc):
                raise
            raise type(exc)(f"{input_path}: {exc}") from None
    original = model
    model = result.model
    if static_shapes:
        for name, dims in (input_shapes or {}).items():
            result.notes.append(f"input {name!r} is now static {list(dims)}: feed only that shape")
    compare = functools.partial(
        compare_files,
        rtol=rtol,
        atol=atol,
        input_shapes=input_shapes,
        inputs_npz=inputs_npz,
        seed=seed,
    )
    reference: str | os.PathLike[str] = input_path  # the original, or its opset-7 conversion

    def fails_without(disabled: list[str]) -> bool:
        """Re-optimize the input with ``disabled`` off too: does verification fail?"""
        phases.tell(f"bisect: {len(disabled)} passes off")
        again = optimize_model(
            load(),
            switch_table=switch_table,
            enable=enable,
            disable=disable + disabled,
            options=options,
            shapes_inferred=not static_shapes,
        )
        with tempfile.TemporaryDirectory(prefix="opfuse-bisect-") as tmp:
            staged = io.save_model(again.model, Path(tmp) / "bisect.onnx", external=external)
            try:
                return not compare(reference, staged).ok
            except OpfuseError as exc:
                if isinstance(exc, VerificationError) or str(staged) in str(exc):
                    return True  # the re-optimized model cannot load or run
                raise

    with (
        phases("write"),
        io.staged_save(model, output_path, input_path=input_path, external=external) as staged,
    ):
        if verify:
            with phases("verify"):
                reference = _reference(input_path, original, staged, result)
                try:
                    result.verify = compare(reference, staged)
                except OpfuseError as exc:
                    if not isinstance(exc, VerificationError) and str(staged) not in str(exc):
                        raise  # about the input model or the user's inputs
                    # the optimized model cannot load or run in onnxruntime: our fault
                    text = str(exc).replace(str(staged), "the optimized model")
                    blame = fails_without if bisect else None
                    raise _failure(result, text, blame, phases=phases) from None
            if not result.verify.ok:
                saved = None
                if save_failing_inputs is not None:
                    saved = save_inputs(result.verify.feeds, save_failing_inputs)
                blame = fails_without if bisect else None
                raise _failure(result, None, blame, saved, phases)
    result.timings = dict(phases.seconds)
    if verify:  # the verifier ran inside the write phase: count it once
        result.timings["write"] -= result.timings.get("verify", 0.0)
    if fusion_result is not None:
        write_fusion_result(result.log, fusion_result)
    result.input_bytes = _file_bytes(input_path)
    result.output_bytes = _file_bytes(output_path)
    result.output = Path(output_path)
    return result


def _pass_unchanged(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    model: ir.Model,
    options: Options | None,
    phases: Phases,
) -> OptimizeResult[ir.Model]:
    """Write the input's bytes as the output: onnx-ir could load the model only without a
    part (``io.must_pass_unchanged``), so nothing may be written from it."""
    result = optimize_model(model, options=options)
    if io.external_data_files(input_path):
        raise OpfuseError(
            f"{input_path}: {io.must_pass_unchanged(model)}, and its weights are in external "
            "data: opfuse cannot pass it through; use the input model as it is"
        )
    with phases("write"):
        io.write_bytes(
            output_path, Path(input_path).read_bytes(), inputs=[input_path], what="the model"
        )
    result.timings = dict(phases.seconds)
    result.input_bytes = result.output_bytes = _file_bytes(input_path)
    result.output = Path(output_path)
    return result


def _failure(
    result: OptimizeResult[ir.Model],
    cannot_run: str | None,
    fails_without: Callable[[list[str]], bool] | None,
    saved: Path | None = None,
    phases: Phases | None = None,
) -> VerificationError:
    """The error of a failed verification (``result.verify`` differs, or the optimized
    model cannot run: ``cannot_run``): what differs, the first of the optional passes that
    fired to blame (bisecting with ``fails_without``), where the inputs were saved."""
    fired = [n for n in result.fired() if not get_pass(n).mandatory]
    culprit = None
    if fails_without is not None and fired:
        with (phases or Phases())("bisect"):
            culprit = first_bad_pass(fired, fails_without)
    report = result.verify
    if cannot_run is not None or report is None:
        hint = f"; the first pass to blame is {culprit}: try --disable {culprit}" if culprit else ""
        return VerificationError(f"verification failed: {cannot_run}{hint}", culprit=culprit)
    searched = fails_without is not None and bool(fired)
    message = failure_message(report, culprit, searched, None if saved is None else str(saved))
    return VerificationError(f"verification failed: {message}", report=report, culprit=culprit)


def save_inputs(feeds: Mapping[str, np.ndarray], path: str | os.PathLike[str]) -> Path:
    """The verifier's inputs as an .npz that ``--verify-inputs`` reads back."""
    buffer = _bytes_io.BytesIO()
    np.savez(buffer, **dict(feeds))  # type: ignore[arg-type]
    return io.write_bytes(path, buffer.getvalue(), what="the inputs")


def _reference(
    input_path: str | os.PathLike[str],
    original: ir.Model,
    staged: Path,
    result: OptimizeResult[ir.Model],
) -> str | os.PathLike[str]:
    """The model to verify against: the input, or, when it is at an opset below
    io.MIN_OPSET that onnxruntime cannot load (it has no kernels for many ops there),
    the input as onnx's version converter converts it (saved beside the staged output)."""
    old = default_opset(original)
    if old is None or old >= io.MIN_OPSET or result.model is original:
        return input_path
    try:
        session(input_path)
    except OpfuseError:
        path = staged.with_name("converted-original.onnx")
        io.save_model(convert_opset(original, io.MIN_OPSET), path)
        result.notes.append(
            f"verified against the model converted to opset {io.MIN_OPSET}: onnxruntime "
            f"cannot load opset {old}"
        )
        return path
    return input_path


def _file_bytes(path: str | os.PathLike[str]) -> int:
    p = Path(path)
    data = p.with_name(p.name + ".data")
    return p.stat().st_size + (data.stat().st_size if data.exists() else 0)


def write_fusion_result(log: EffectLog, path: str | os.PathLike[str]) -> None:
    io.write_text(path, json.dumps(log.fusion_result(), indent=2) + "\n", what="fusion result")
