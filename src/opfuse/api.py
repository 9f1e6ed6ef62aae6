"""The Python API the CLI calls: optimize a model in memory or file to file."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx.version_converter
import onnx_ir as ir

from opfuse import io
from opfuse.errors import OpfuseError, VerificationError
from opfuse.graphs import all_graphs
from opfuse.registry import PassInfo, all_passes
from opfuse.rewrite.context import Options, PassContext
from opfuse.rewrite.driver import Driver
from opfuse.rewrite.stats import EffectLog
from opfuse.shapes import infer_shapes
from opfuse.switch import SwitchTable, parse_switch_file, resolve
from opfuse.verify import VerifyReport, check_feeds, compare_files, session

MAX_ROUNDS = 6
logger = logging.getLogger("opfuse")


def op_counts(model: ir.Model) -> Counter[str]:
    """Node count by op type over the main graph and its subgraphs."""
    graphs = all_graphs(model.graph)
    return Counter(node.op_type for g in graphs for node in g)


@dataclass
class OptimizeResult:
    model: ir.Model
    log: EffectLog
    passes: list[str]
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    before: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    seconds: float = 0.0
    verify: VerifyReport | None = None
    input_bytes: int = 0
    output_bytes: int = 0


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
        converted = onnx.version_converter.convert_version(ir.to_proto(model), target)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OpfuseError(f"cannot convert the model to opset {target}: {first}") from None
    new = ir.from_proto(converted)
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


def optimize_model(
    model: ir.Model,
    *,
    switch_table: Mapping[str, Mapping[str, bool]] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    options: Options | None = None,
    shapes_inferred: bool = False,
) -> OptimizeResult:
    """Run the enabled passes on ``model`` in place until nothing changes.

    With ``options.target_opset`` the model is first converted with onnx's version
    converter (never otherwise: a model's opset is the user's choice).
    ``shapes_inferred``: the loader already ran shape inference (``io.load_model(infer=True)``).
    """
    start = time.perf_counter()
    options = options or Options()
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
    result = OptimizeResult(
        model, log, [p.name for p in runnable], warnings=warnings, skipped=skipped, notes=ctx.notes
    )
    result.before = op_counts(model)
    if not shapes_inferred:
        infer_shapes(model)
    for round_no in range(1, MAX_ROUNDS + 1):
        result.rounds = round_no
        before = log.effected()
        for stage in _stages(runnable):
            if stage[0].rules:
                Driver(ctx, stage).run()
            else:
                ctx.current = stage[0]
                assert stage[0].run is not None
                stage[0].run(ctx)
        if log.effected() == before:
            break
        infer_shapes(model)
    ctx.current = None
    result.after = op_counts(model)
    result.seconds = time.perf_counter() - start
    return result


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
    fusion_result: str | os.PathLike[str] | None = None,
) -> OptimizeResult:
    """Load, optimize, verify against the input and write atomically.

    Bad input raises OpfuseError before anything is written; a failed verification
    raises VerificationError and writes nothing.
    """
    io.check_output_path(output_path, [input_path])
    if fusion_result is not None:
        io.check_output_path(fusion_result, [input_path, output_path])
    if fusion_switch_file is not None:
        switch_table = parse_switch_file(fusion_switch_file)
    # validate the switches and the user's verification inputs before the (possibly long) work
    select_passes(switch_table, enable, disable, where=str(fusion_switch_file or "switch file"))
    if verify and (input_shapes or inputs_npz is not None):
        check_feeds(input_path, input_shapes, inputs_npz)
    model = io.load_model(input_path, infer=True)
    external = io.has_external_data(model) or None  # keep external data external
    try:
        result = optimize_model(
            model,
            switch_table=switch_table,
            enable=enable,
            disable=disable,
            options=options,
            shapes_inferred=True,
        )
    except OpfuseError as exc:  # e.g. --inputs/--outputs naming no tensor: name the file
        if str(input_path) in str(exc):
            raise
        raise type(exc)(f"{input_path}: {exc}") from None
    original = model
    model = result.model
    with io.staged_save(model, output_path, input_path=input_path, external=external) as staged:
        if verify:
            reference = _reference(input_path, original, staged, result)
            report = compare_files(
                reference,
                staged,
                rtol=rtol,
                atol=atol,
                input_shapes=input_shapes,
                inputs_npz=inputs_npz,
            )
            result.verify = report
            if not report.ok:
                raise VerificationError(f"verification failed: {report.failure()}")
    if fusion_result is not None:
        write_fusion_result(result.log, fusion_result)
    result.input_bytes = _file_bytes(input_path)
    result.output_bytes = _file_bytes(output_path)
    return result


def _reference(
    input_path: str | os.PathLike[str], original: ir.Model, staged: Path, result: OptimizeResult
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
        ir.save(convert_opset(original, io.MIN_OPSET), path)
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
