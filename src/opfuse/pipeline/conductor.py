"""The optimizer file to file, as numbered steps (``optimize_file``): 1. check the request,
2. load, 3. optimize (``pipeline.optimizer``), 4. verify (``pipeline.verifier``), 5. write.

The names the CLI, the public API and the other packages import from here stay here
(``OptimizeResult``, ``optimize_model``, ``select_passes``...), re-exported from the
modules that hold them: ``pipeline.result``, ``pipeline.optimizer``, ``pipeline.selection``,
``pipeline.opset``, ``pipeline.verifier``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir

from opfuse.errors import OpfuseError, SettingsError
from opfuse.model import io
from opfuse.model.shapes import declare_static_inputs
from opfuse.model.value_info import untyped_declared
from opfuse.pipeline.gcpause import paused_gc
from opfuse.pipeline.opset import convert_opset, converted_if_old, default_opset
from opfuse.pipeline.optimizer import MAX_ROUNDS, op_counts, optimize_model
from opfuse.pipeline.phases import Phases
from opfuse.pipeline.result import OptimizeResult, timings_text, verification_text
from opfuse.pipeline.selection import (
    COMMON_SUBEXPRESSIONS,
    CONSTANT_FOLDING,
    Selection,
    select,
    select_passes,
)
from opfuse.pipeline.settings import OptimizeSettings
from opfuse.pipeline.switch import SwitchTable, parse_switch_file
from opfuse.pipeline.verifier import Verification, save_inputs
from opfuse.rewrite.context import Options
from opfuse.rewrite.stats import EffectLog
from opfuse.verification.compare import check_feeds
from opfuse.verification.settings import VerifySettings

__all__ = [
    "COMMON_SUBEXPRESSIONS",
    "CONSTANT_FOLDING",
    "MAX_ROUNDS",
    "OptimizeResult",
    "Verification",
    "convert_opset",
    "default_opset",
    "op_counts",
    "optimize_file",
    "optimize_model",
    "save_inputs",
    "select_passes",
    "timings_text",
    "verification_text",
    "write_fusion_result",
]

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Job:
    """One ``optimize_file`` request, checked: the input, the passes (selected once), the
    options, and the static input shapes to declare at load."""

    input_path: PathLike
    selection: Selection
    options: Options | None
    static_shapes: Mapping[str, list[int]] | None  # None: the inputs stay as declared

    def load(self) -> ir.Model:
        """Step 2: the input model, its inputs re-declared static with ``static_shapes``."""
        s = self.selection
        model = io.load_model(
            self.input_path, infer=self.static_shapes is None, lift=s.lift, merge=s.merge
        )
        if self.static_shapes is not None:
            declare_static_inputs(model, dict(self.static_shapes))
        return model

    def optimize(
        self, model: ir.Model, phases: Phases | None = None, without: Iterable[str] = ()
    ) -> OptimizeResult[ir.Model]:
        """Step 3: ``optimize_model`` with the job's passes (less ``without``)."""
        return optimize_model(
            model,
            selection=self.selection.without(set(without)),
            options=self.options,
            shapes_inferred=self.static_shapes is None,
            phases=phases,
        )

    def reoptimize(self, without: list[str]) -> ir.Model:
        """The input loaded and optimized again with the passes ``without`` off too."""
        return self.optimize(self.load(), without=without).model


def optimize_file(
    input_path: PathLike,
    output_path: PathLike,
    *,
    fusion_switch_file: PathLike | None = None,
    switch_table: SwitchTable | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    options: Options | None = None,
    verify: bool = True,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: PathLike | None = None,
    seed: int = 0,
    fusion_result: PathLike | None = None,
    save_failing_inputs: PathLike | None = None,
    bisect: bool = True,
    phases: Phases | None = None,
    static_shapes: bool = False,
    settings: OptimizeSettings | None = None,
    verifier: VerifySettings | None = None,
) -> OptimizeResult[ir.Model]:
    """Load, optimize, verify against the input and write atomically.

    ``settings`` (``OptimizeSettings``) and ``verifier`` (``VerifySettings``), when given,
    stand for the keywords they hold (``opfuse.optimize`` and batch's task give them).
    ``static_shapes``: re-declare the inputs with ``input_shapes`` first (all shape
    arithmetic then folds; the output accepts only those shapes). Bad input raises
    OpfuseError before anything is written; a failed verification raises VerificationError
    naming the first pass to blame (``bisect``), saves the inputs to
    ``save_failing_inputs`` when given, and writes nothing else.
    """
    if settings is not None:  # the settings objects stand for their keywords
        fusion_switch_file, options = settings.fusion_switch_file, settings.options()
        enable, disable, static_shapes = settings.enable, settings.disable, settings.static_shapes
    checks = verifier or VerifySettings(
        rtol=rtol,
        atol=atol,
        input_shape=input_shapes or {},
        verify_inputs=inputs_npz,
        seed=seed,
        save_failing_inputs=save_failing_inputs,
    )
    phases = phases or Phases()
    job = _check(  # 1. check the request before the (possibly long) work
        input_path,
        output_path,
        side_files=[fusion_result, checks.save_failing_inputs],
        switches=(fusion_switch_file, switch_table, enable, disable),
        options=options,
        feeds=checks if verify else VerifySettings(),
        static_shapes=checks.shapes if static_shapes else None,
    )
    with paused_gc():  # one pause over load and optimize: the loaded graph is not garbage
        with phases("load"):  # 2. load
            original = job.load()
        if io.must_pass_unchanged(original) is not None:
            return _pass_unchanged(job, output_path, original, phases)
        external = io.has_external_data(original) or None  # keep external data external
        with phases("optimize"):  # 3. optimize
            result = _optimize(job, original, phases)
    verification = None
    if verify:  # 4. verify, the staged output, before it is moved into place
        reoptimize = job.reoptimize if bisect else None
        verification = Verification(
            input_path, checks, reoptimize=reoptimize, external=external, phases=phases
        )
    # 5. write: staged beside the output, moved into place once verified
    with (
        phases("write"),
        io.staged_save(
            result.model, output_path, input_path=input_path, external=external
        ) as staged,
    ):
        if verification is not None:
            with phases("verify"):
                verification.check(result, original, staged)
    return _written(result, job, output_path, fusion_result, phases, verified=verify)


def _check(
    input_path: PathLike,
    output_path: PathLike,
    *,
    side_files: list[PathLike | None],
    switches: tuple[PathLike | None, SwitchTable | None, Iterable[str], Iterable[str]],
    options: Options | None,
    feeds: VerifySettings,
    static_shapes: Mapping[str, list[int]] | None,
) -> Job:
    """Step 1: the output paths (none over the input), the switches (the passes selected
    once, from the switch file's table when one is given), the user's verification inputs
    (``feeds``: --input-shape, --inputs), the static shapes."""
    io.check_output_path(output_path, [input_path])
    for extra in side_files:
        if extra is not None:
            io.check_output_path(extra, [input_path, output_path])
    switch_file, switch_table, enable, disable = switches
    if switch_file is not None:
        switch_table = parse_switch_file(switch_file)
    selection = select(switch_table, enable, disable, where=str(switch_file or "switch file"))
    if feeds.input_shape or feeds.inputs_npz is not None:
        check_feeds(
            input_path, feeds.shapes, feeds.inputs_npz, lambda: converted_if_old(input_path)
        )
    if static_shapes is not None and not static_shapes:
        raise SettingsError(
            "static_shapes",
            True,
            sentence="{static_shapes} needs {input_shape} NAME:D0,D1,... for the inputs",
        )
    return Job(input_path, selection, options, static_shapes)


def _optimize(job: Job, model: ir.Model, phases: Phases) -> OptimizeResult[ir.Model]:
    """Step 3; an error about the model (e.g. --keep-inputs naming no tensor) names its file
    (the optimizer sees only the model in memory)."""
    try:
        result = job.optimize(model, phases)
    except OpfuseError as exc:
        raise type(exc)(f"{job.input_path}: {exc}") from None
    for name, dims in (job.static_shapes or {}).items():
        result.notes.append(f"input {name!r} is now static {list(dims)}: feed only that shape")
    untyped = untyped_declared(result.model)
    if untyped:  # every other value the input described keeps its value_info
        result.notes.append(_untyped_note(untyped))
    return result


def _untyped_note(names: list[str]) -> str:
    """Why the value_info of ``names``, values the input described, is not written."""
    shown = ", ".join(repr(name) for name in names[:3]) + (", ..." if len(names) > 3 else "")
    plural = "" if len(names) == 1 else "s"
    return (
        f"{len(names)} shape annotation{plural} (value_info) of the input not written: the "
        f"optimized graph no longer knows the type of {shown}"
    )


def _written(
    result: OptimizeResult[ir.Model],
    job: Job,
    output_path: PathLike,
    fusion_result: PathLike | None,
    phases: Phases,
    *,
    verified: bool,
) -> OptimizeResult[ir.Model]:
    """The result once its model is written: the time per phase, CANN's fusion result
    file when asked for, the sizes of the files."""
    result.timings = dict(phases.seconds)
    if verified:  # the verifier ran inside the write phase: count it once
        result.timings["write"] -= result.timings.get("verify", 0.0)
    if fusion_result is not None:
        write_fusion_result(result.log, fusion_result)
    result.input_bytes = _file_bytes(job.input_path)
    result.output_bytes = _file_bytes(output_path)
    result.output = Path(output_path)
    return result


def _pass_unchanged(
    job: Job, output_path: PathLike, model: ir.Model, phases: Phases
) -> OptimizeResult[ir.Model]:
    """Write the input's bytes as the output: onnx-ir could load the model only without a
    part (``io.must_pass_unchanged``), so nothing may be written from it."""
    result = job.optimize(model)
    input_path = job.input_path
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


def _file_bytes(path: PathLike) -> int:
    p = Path(path)
    data = p.with_name(p.name + ".data")
    return p.stat().st_size + (data.stat().st_size if data.exists() else 0)


def write_fusion_result(log: EffectLog, path: PathLike) -> None:
    io.write_text(path, json.dumps(log.fusion_result(), indent=2) + "\n", what="fusion result")
