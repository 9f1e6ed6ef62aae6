"""``opfuse quantize`` as numbered steps (``quantize_file``), as
``pipeline.conductor.optimize_file`` and ``tuning.conductor.tune_file`` are, over one
``QuantizeJob`` (the checked request) and the frozen record each step returns:

1. **check**, before any work: the output paths (none over the model), the model
   readable and not quantized already, ``--exclude leading=SHARE``'s syntax (the settings,
   a ``QuantizeSettings``, checked themselves when made);
2. **samples** (``Samples``): read, split into calibration, validation and evaluation;
3. **fuse** (``Fused``): opfuse's passes, verified on a real sample; the workspace (the
   models in memory) and the float original's outputs the figures compare with;
4. **recipe search** (``recipes.search``): the recipe kept on the validation part;
5. **restore accuracy** (``restore.restore``): heads, stem, parts, leading layers;
6. **form for the runtime**: OpenVINO's QDQ form with ``--runtime openvino``;
7. **judge** (``Judged``): the gate on the held-back samples, the clean-up, the integer
   kernels; a missed gate is exit 1 with the report and the command that writes the
   best model anyway (``QuantizeSettings.command_line``);
8. **measure the speed and choose** (``speed_choice``): int8 against the float original
   and the float optimized model, with the recipes of other forms that pass the gate too;
   the fastest that keeps the answers is kept where it is faster beyond the noise;
9. **write**: the model and the report.

Nothing is written when the input is bad (exit 2) or ``min_speedup`` fails (exit 1). A
failure inside quantization on a valid model is exit 3 with the fix to try; no message
names a temporary file."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from opfuse.errors import GateError, OpfuseError
from opfuse.model import io
from opfuse.pipeline.conductor import OptimizeResult
from opfuse.pipeline.opset import converted_if_old
from opfuse.quantization import (
    calibration,
    flow,
    quantizer_input,
    recipes,
    representative,
    speed_choice,
)
from opfuse.quantization.accuracy import OutputAccuracy, Task, brief
from opfuse.quantization.fallback import MAX_FALLBACK_TRIES, MAX_FLOAT_LAYERS, KeptFloat
from opfuse.quantization.kept_fusions import KeptFusions, kept_fusions
from opfuse.quantization.kernels import KernelCoverage, integer_coverage
from opfuse.quantization.model_kind import OTHER, ModelKind, model_kind
from opfuse.quantization.restore import Evaluator, Restoration, restore
from opfuse.quantization.result import (
    FLOAT_OPT,
    HARDSWISH_OPSET,
    INT8,
    QuantizeResult,
    decomposed_hardswish,
)
from opfuse.quantization.settings import RANDOM, Data, QuantizeSettings
from opfuse.quantization.trace import TensorError, error_trace, largest_drops
from opfuse.quantization.workspace import QuantizeInternalError, Sample, Workspace, run_model
from opfuse.runtime import Runtime
from opfuse.runtime.cpu import cpu_features
from opfuse.runtime.settings import RuntimeSettings
from opfuse.tuning.measure import Measurement, measure

__all__ = [
    "FLOAT_OPT",
    "INT8",
    "MAX_FALLBACK_TRIES",
    "MAX_FLOAT_LAYERS",
    "KeptFloat",
    "QuantizeInternalError",
    "QuantizeJob",
    "QuantizeResult",
    "Workspace",
    "quantize_file",
]

RANDOM_SAMPLES = 16
Progress = Callable[[str], None]


@dataclass(frozen=True)
class QuantizeJob:
    """The checked request: the model (``source``, as ``name`` says it), where to write,
    the calibration data, the settings, what to measure on, the staging folder."""

    source: Path
    name: str
    output: Path | None
    report: Path | None
    calibration: Data
    settings: QuantizeSettings
    runtime: RuntimeSettings | Runtime | None
    work: Path
    progress: Progress | None
    started: float

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(f"[{time.perf_counter() - self.started:5.1f} s] {text}")

    @property
    def model_path(self) -> Path | None:
        """The user's model file, as a command line names it (None: given in memory)."""
        return None if self.source.parent == self.work else self.source

    @property
    def runtime_name(self) -> str:
        runtime = self.runtime
        return runtime.runtime if isinstance(runtime, RuntimeSettings) else "onnxruntime"


@dataclass(frozen=True)
class Samples:
    """Step 2: the calibration samples (``calib_all``: all; ``calib``: the part that
    calibrates while the recipes are chosen, ``valid``: the part that chooses), the
    held-back ones and where they come from, the warnings about them."""

    calib_all: list[Sample]
    calib: list[Sample]
    valid: list[Sample]
    apart: bool
    held: list[Sample]
    held_source: str
    warnings: tuple[str, ...]
    task: Task | None = None  # the eval data's labels, the user's metric


@dataclass(frozen=True)
class Fused:
    """Step 3: the fused float model (its file and its result), the node names kept in
    float, the workspace, the float original as onnxruntime runs it and its outputs on the
    held-back samples."""

    result: OptimizeResult
    path: Path
    model: onnx.ModelProto
    excluded: list[str]
    ws: Workspace
    original: str | os.PathLike[str]
    held_reference: list[list[np.ndarray]]
    warnings: tuple[str, ...]
    kind: ModelKind = ModelKind(OTHER)  # said once: in the progress, the summary, the JSON


@dataclass(frozen=True)
class Judged:
    """Step 7: the model cleaned up and saved, the gate's verdict, where the first
    model's error grows (when it missed), the integer kernels, onnxruntime's fusions kept
    (None on another runtime) and the sizes."""

    model: onnx.ModelProto
    path: Path
    passed: bool
    growth: list[TensorError]
    coverage: KernelCoverage
    nodes: dict[str, int]
    sizes: dict[str, int]
    warnings: tuple[str, ...]
    apart: str | None = None  # the eval samples outside the calibrated ranges, said
    fusions: KeptFusions | None = None


def quantize_file(
    model: str | os.PathLike[str] | onnx.ModelProto,
    output: str | os.PathLike[str] | None,
    calibration_data: Data,
    settings: QuantizeSettings | None = None,
    *,
    runtime: RuntimeSettings | Runtime | None = None,
    report: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    **keywords: Any,
) -> QuantizeResult:
    """Quantize ``model`` (a file, or an ``onnx.ModelProto``) into ``output`` (None: not
    written; ``result.model`` holds it) with ``settings`` (or its keywords): the steps of
    this module's docstring."""
    started = time.perf_counter()
    settings = settings if settings is not None else QuantizeSettings(**keywords)
    with tempfile.TemporaryDirectory(prefix=io.STAGING_PREFIX + "quant-") as tmp:
        work = Path(tmp)
        name, source = _source(model, work)
        job = QuantizeJob(
            source,
            name,
            None if output is None else Path(output),
            None if report is None else Path(report),
            calibration_data,
            settings,
            runtime,
            work,
            progress,
            started,
        )
        try:
            result = _run(job)
        except OpfuseError as exc:
            exc.args = (_no_temporary(str(exc), str(source), name),)
            raise
    result.notes = [_no_temporary(n, str(source), name) for n in result.notes]
    result.seconds = time.perf_counter() - started
    return result


def _source(model: object, work: Path) -> tuple[str, Path]:
    """How messages name the model, and its file (a ModelProto saved in ``work``)."""
    if isinstance(model, onnx.ModelProto):
        source = work / "model.onnx"
        try:
            io.write_bytes(source, model.SerializeToString(), what="the model")
        except ValueError as exc:  # over protobuf's 2 GB
            raise OpfuseError(f"cannot serialize the ModelProto: {exc}") from None
        return "the model given", source
    if isinstance(model, str | os.PathLike):
        return str(model), Path(model)
    raise OpfuseError(f"expected a path or an onnx.ModelProto, got {type(model).__name__}")


def _run(job: QuantizeJob) -> QuantizeResult:
    """The steps, in order."""
    _check(job)  # 1
    samples = _samples(job)  # 2
    fused = _fuse(job, samples)  # 3
    gate = job.settings.gate
    best, tried, skipped = recipes.search(  # 4
        fused.ws, gate, job.settings.forced, runtime=job.runtime_name
    )
    restored, evaluator = _restore(job, samples, fused, best, tried)  # 5
    model, accuracy, form = _form(job, samples, fused, restored)  # 6
    judged = _judge(job, samples, fused, restored, best, model, accuracy)  # 7
    record = _Record(samples, fused, restored, judged, tried, skipped, accuracy, form)
    if not judged.passed:
        result = _result(job, record, command=_best_command(job, fused, restored))
        _write_report(job.report, result)
        raise GateError(_gate_message(job, result), report=result)
    speed = None
    if job.settings.benchmark:  # 8
        others = _other_forms(job, samples, fused, evaluator, record)
        speed, record = _speed(job, record, others, samples.held[0])
        measured = _result(job, record, speed=speed)
        _check_speedup(job, measured)
        _check_faster(job, measured)
    if job.output is not None:  # 9
        io.save_model(io.load_model(judged.path), job.output, input_path=job.source)
    result = _result(job, record, speed=speed, output=job.output)
    _write_report(job.report, result)
    return result


def _check(job: QuantizeJob) -> None:
    """Step 1: the output paths, the model readable and not quantized already, and
    ``leading=SHARE``'s syntax unless a node has that name (before any work)."""
    outputs = [("-o", job.output)] if job.output is not None else []
    io.check_outputs(job.source, [*outputs, ("--report", job.report)])
    source_proto = io.read_proto(job.source)[0]
    quantized = quantizer_input.quantized_ops(source_proto)
    if quantized:
        raise OpfuseError(
            f"{job.name}: already quantized ({quantized}): give the float model it was made "
            "from (opfuse advise reads how much of a quantized model runs in int8)"
        )
    source_nodes = {n.name for n in source_proto.graph.node}
    for item in job.settings.exclude:  # a node name is checked on the fused model
        if item.startswith(flow.LEADING_KEY) and item not in source_nodes:
            flow.leading_share(item)


def _samples(job: QuantizeJob) -> Samples:
    """Step 2: the samples read (``eval``: the held-back ones; else every 4th calibration
    sample), the calibration samples split into a calibration and a validation part."""
    settings = job.settings
    inputs = calibration.model_inputs(job.source)
    warnings: list[str] = []
    read = _read(job.calibration, inputs, settings, warnings, "--calibration")
    if settings.eval is not None:
        calib_all, held = read, _read(settings.eval, inputs, settings, [], "--eval")
        given = settings.eval
        where = given if isinstance(given, str | os.PathLike) else "the eval data given"
        held_source = f"samples from {where}"
    else:
        calib_all, held = calibration.split(read)
        held_source = "samples held back from the calibration data (not used to calibrate)"
    calib, valid, apart = calibration.validation_split(calib_all)
    task = _task(settings, inputs, held)
    if len(held) < calibration.FEW_EVAL_SAMPLES:
        warnings.append(
            f"the accuracy figures rest on {len(held)} sample{'s' * (len(held) != 1)}: one "
            f"sample more or less can move them; give at least {calibration.FEW_EVAL_SAMPLES} "
            "(--eval, or more calibration data)"
        )
    return Samples(calib_all, calib, valid, apart, held, held_source, tuple(warnings), task)


def _task(
    settings: QuantizeSettings, inputs: list[calibration.ModelInput], held: list[Sample]
) -> Task | None:
    """The task's own measure: the eval data's labels (one per sample), the metric."""
    labels = None if settings.eval is None else calibration.read_labels(settings.eval, inputs)
    if labels is not None and len(labels.reshape(-1)) != len(held):
        raise OpfuseError(
            f"--eval {settings.eval}: {len(labels.reshape(-1))} labels for {len(held)} "
            "samples: give one class index per sample"
        )
    if labels is None and settings.metric is None:
        return None
    return Task(labels, settings.metric)


def _read(
    data: Data,
    inputs: list[calibration.ModelInput],
    settings: QuantizeSettings,
    warnings: list[str],
    option: str,
) -> list[Sample]:
    """The samples of ``data`` (a path, ``random``, or arrays in memory)."""
    count = settings.samples if option == "--calibration" else None
    if isinstance(data, str) and data == RANDOM:
        if option == "--eval":
            raise OpfuseError("--eval random: give real samples to measure accuracy on")
        warnings.append(
            "calibrated on RANDOM data (--calibration random): the scales and the accuracy "
            "figures say nothing about real inputs; give real samples before shipping"
        )
        return calibration.random_samples(inputs, count or RANDOM_SAMPLES)
    if isinstance(data, str | os.PathLike):
        samples = calibration.read_samples(data, inputs, settings.preprocessing)
        where = str(data)
    else:
        where = option.removeprefix("--")
        samples = calibration.from_arrays(data, inputs, where)
    chosen = calibration.first(samples, count, where)
    calibration.check_finite(chosen, f"{option} {data}" if where == str(data) else where)
    return chosen


def _fuse(job: QuantizeJob, samples: Samples) -> Fused:
    """Step 3: opfuse's passes (converted to opset 13 for per-channel scales where the
    model is older), verified on a real sample (generated inputs can be ones the model
    refuses: a voice detector's window shorter than its STFT's padding); the workspace;
    the float original's outputs on the validation and held-back samples."""
    settings, work = job.settings, job.work
    warnings: list[str] = []
    opset = flow.default_opset(job.source)
    target = settings.target_opset
    old = opset is not None and opset < flow.PER_CHANNEL_OPSET
    if target is None and settings.per_channel and old:
        target = flow.PER_CHANNEL_OPSET
        warnings.append(
            f"converted from opset {opset} to {target}: per-channel QuantizeLinear/"
            "DequantizeLinear (their axis) need it"
        )
    sample = work / "sample.npz"
    np.savez(sample, **cast(dict[str, Any], samples.calib[0]))  # numpy stubs: allow_pickle
    fused_path = work / "fused.onnx"
    job.say("fusing")
    result = flow.fuse(
        job.source,
        fused_path,
        settings.switch_table(),
        settings.enable,
        settings.disable,
        target,
        verify_inputs=sample,
    )
    model = onnx.load_model(str(fused_path))
    kind = model_kind(model)
    job.say(f"the model: {kind.describe()}")
    excluded = flow.excluded_names(model, settings.exclude, job.name, samples.calib[0])
    ws = Workspace(
        job.name,
        model,
        model,
        samples.calib,
        samples.valid,
        per_channel=settings.per_channel,
        activation_type=settings.activation_type,
        calibrate_method=settings.calibrate_method,
        exclude=excluded,
        progress=job.progress,
        started=job.started,
        cache_dir=work,
    )
    parts = [samples.valid, samples.held]
    original, (ws.valid_reference, held_reference) = _references(job.source, parts, job.name, work)
    if original != job.source:
        warnings.append(
            "onnxruntime cannot load the model's opset: it is judged and timed as onnx's "
            f"version converter makes it (opset {io.MIN_OPSET})"
        )
    return Fused(
        result, fused_path, model, excluded, ws, original, held_reference, tuple(warnings), kind
    )


def _references(
    source: str | os.PathLike[str],
    parts: list[list[Sample]],
    name: str,
    work: Path,
) -> tuple[str | os.PathLike[str], list[list[list[np.ndarray]]]]:
    """The float original as onnxruntime runs it (for the speed too), and its outputs on
    each part: ``source``, or for a model below opset 7 onnxruntime cannot load, its
    conversion (``converted_if_old``: what the fused model is verified against), saved in
    ``work``."""
    try:
        return source, [run_model(str(source), part, name) for part in parts]
    except OpfuseError:
        converted = converted_if_old(source)
        if converted is None:
            raise
        path = work / "original-opset7.onnx"
        onnx.save_model(converted, str(path))
        return path, [run_model(converted, part, name) for part in parts]


def _restore(
    job: QuantizeJob,
    samples: Samples,
    fused: Fused,
    best: recipes.Built,
    tried: list[recipes.Built],
) -> tuple[Restoration, Evaluator]:
    """Step 5: the accuracy restorer on the recipe kept, through one evaluator (which
    step 8 builds the recipes of other forms with)."""
    assert best.model is not None
    everything = fused.ws.fork()  # the model written calibrates on every sample
    everything.use_samples(samples.calib_all, "all")
    evaluator = Evaluator(
        fused.ws,
        everything,
        samples.apart,
        samples.held,
        fused.held_reference,
        best.steps,
        best.model,
        best.steps,
        task=samples.task,
    )
    settings = job.settings
    forced = settings.forced is not None
    restored = restore(evaluator, settings.gate, best, tried, forced, settings.fallback_tries)
    return restored, evaluator


def _form(
    job: QuantizeJob, samples: Samples, fused: Fused, restored: Restoration
) -> tuple[onnx.ModelProto, list[OutputAccuracy], str]:
    """Step 6: the form of the runtime it ships on. OpenVINO runs in int8 the compute ops
    whose inputs are quantized (NNCF's convention); onnxruntime's form would requantize
    every output."""
    if job.runtime_name != "openvino":
        return restored.model, restored.accuracy, "onnxruntime"
    from opfuse.quantization.openvino_form import openvino_form_report

    model, done = openvino_form_report(restored.model)
    ws = fused.ws
    got = run_model(model, samples.held, job.name, internal=True)
    accuracy = ws.compare(fused.held_reference, got, samples.held, samples.task)
    ws.notes.append(
        "written in OpenVINO's QDQ form (--runtime openvino): Q/DQ on the inputs of the "
        f"compute ops and pooling ({done.kept_activation_pairs} activation pairs kept, "
        f"{done.removed_activation_pairs} removed, {done.float_constants} biases and "
        "constants in float); the figures are this form's"
    )
    ws.say("the model in OpenVINO's QDQ form")
    return model, accuracy, "openvino"


def _judge(
    job: QuantizeJob,
    samples: Samples,
    fused: Fused,
    restored: Restoration,
    best: recipes.Built,
    model: onnx.ModelProto,
    accuracy: list[OutputAccuracy],
) -> Judged:
    """Step 7: the gate on the held-back samples (where the first model's error grows
    when the restored one still misses it), the QDQ graph cleaned up and saved, its
    integer kernels, nodes and sizes."""
    gate = job.settings.gate
    growth: list[TensorError] = []
    if gate.misses(restored.accuracy):  # where the first model's error grows, said
        trace = error_trace(best.ws.float_model, restored.first_model, samples.held[:4])
        growth = largest_drops(trace)
    apart = representative.warning(
        representative.outside_ranges(fused.model, samples.calib_all, samples.held)
    )
    return _cleaned(job, samples, fused, model, accuracy, growth, apart, "int8.onnx")


def _cleaned(
    job: QuantizeJob,
    samples: Samples,
    fused: Fused,
    model: onnx.ModelProto,
    accuracy: list[OutputAccuracy],
    growth: list[TensorError],
    apart: str | None,
    filename: str,
    recipe: tuple[str, ...] = (),
    float_kernels: dict[str, int] | None = None,
) -> Judged:
    """The QDQ graph cleaned up and saved as ``filename``, its gate verdict, integer
    kernels, nodes and sizes (``apart``: the representativeness warning, said once;
    ``float_kernels``: the float optimized model's fused kernels, read once)."""
    of = f" of recipe {recipes.recipe_name(recipe)}" if recipe else ""  # a speed candidate
    job.say(f"cleaning up the QDQ graph{of}")
    model = flow.clean_up_proto(model, samples.calib[0], job.name)
    empty = flow.nothing_quantized(model)
    nodes = {
        "original": _nodes(job.source),
        FLOAT_OPT: len(fused.model.graph.node),
        INT8: len(model.graph.node),
    }
    path = job.work / filename
    onnx.save_model(model, str(path))
    sizes = {"original": job.source.stat().st_size, "int8": path.stat().st_size}
    coverage = integer_coverage(model, feed=samples.calib[0])
    fusions = _fusions(job, fused, path, float_kernels)
    passed = not job.settings.gate.misses(accuracy)
    unsaid = fusions if isinstance(fusions, str) else ""
    warnings = tuple(w for w in (empty, apart, unsaid) if w)
    kept = None if isinstance(fusions, str) else fusions
    return Judged(model, path, passed, growth, coverage, nodes, sizes, warnings, apart, kept)


def _fusions(
    job: QuantizeJob, fused: Fused, path: Path, float_kernels: dict[str, int] | None
) -> KeptFusions | str | None:
    """onnxruntime's fused kernels (Attention, SkipLayerNormalization, Gelu...) the int8
    model keeps against the float optimized model, on the provider measured (None where
    the model is written for another runtime)."""
    if job.runtime_name != "onnxruntime":
        return None
    runtime = job.runtime
    provider = runtime.provider if isinstance(runtime, RuntimeSettings) else None
    return kept_fusions(fused.path, path, provider or "CPUExecutionProvider", float_kernels)


@dataclass(frozen=True)
class _Record:
    """What the steps made, for the result."""

    samples: Samples
    fused: Fused
    restored: Restoration
    judged: Judged
    tried: list[recipes.Built]
    skipped: list[str]
    accuracy: list[OutputAccuracy]
    form: str


def _result(
    job: QuantizeJob,
    record: _Record,
    *,
    command: str = "",
    speed: tuple[Measurement, Any] | None = None,
    output: Path | None = None,
) -> QuantizeResult:
    """The result, made of the steps' records."""
    samples, fused, restored, judged = record.samples, record.fused, record.restored, record.judged
    gate = job.settings.gate
    changed = bool(restored.kept) or restored.recipe != restored.searched
    # the --max-drop the model before the fallback passes, in the form of its figures
    first_passes = ""
    if changed and record.form == "onnxruntime" and judged.passed:
        first_passes = gate.loosened(restored.first_accuracy) or ""
    hardswish = 0
    if (flow.default_opset(fused.path) or 0) < HARDSWISH_OPSET:
        hardswish = decomposed_hardswish(fused.model)
    return QuantizeResult(
        fused.result,
        record.accuracy,
        gate,
        len(samples.calib_all),
        len(samples.held),
        samples.held_source,
        restored.kept,
        speed=None if speed is None else speed[0],
        cpu=None if speed is None else speed[1],
        warnings=[*samples.warnings, *fused.warnings, *judged.warnings],
        output=output,
        nodes=judged.nodes,
        coverage=judged.coverage,
        fusions=judged.fusions,
        error_growth=judged.growth,
        validation_samples=len(samples.valid),
        validation_apart=samples.apart,
        recipe=recipes.recipe_name(restored.recipe),
        recipes=[t.to_json() for t in record.tried],
        recipe_lines=[t.line() for t in record.tried],
        skipped=record.skipped,
        heads=restored.heads,
        notes=fused.ws.notes,
        first_accuracy=restored.first_accuracy,
        first_recipe=recipes.recipe_name(restored.searched),
        first_passes=first_passes,
        fallback_tries=restored.fallback_tries,
        fallback_stopped=restored.fallback_stopped,
        trials=list(restored.trials),
        passed=judged.passed,
        command=command,
        sizes=judged.sizes,
        model=judged.model,
        form=record.form,
        hardswish_written_out=hardswish,
        timed_on=_timed_on(samples) if speed is not None else "",
        model_kind=fused.kind,
    )


def _timed_on(samples: Samples) -> str:
    """The sample the speed is measured on, named: the first held-back one, its shapes."""
    shapes = ", ".join(
        f"{name}[{','.join(map(str, array.shape))}]" for name, array in samples.held[0].items()
    )
    return f"the first evaluation sample ({shapes})"


def _other_forms(
    job: QuantizeJob, samples: Samples, fused: Fused, ev: Evaluator, record: _Record
) -> list[tuple[Restoration, Judged]]:
    """Step 8's candidates (``speed_choice``): the recipes of other forms that passed the
    gate on the validation part, built with what the restorer kept in float, cleaned up,
    where they pass on the held-back samples too; none with a forced recipe or in
    OpenVINO's form."""
    if job.settings.forced is not None or record.form != "onnxruntime":
        return []
    gate, restored = job.settings.gate, record.restored
    count = speed_choice.alternatives_for(len(fused.model.graph.node))
    recipes_to_try = speed_choice.other_forms(
        gate, record.tried, restored.recipe, count, restored=bool(restored.kept)
    )
    out = []
    made = speed_choice.candidates(ev, gate, restored, recipes_to_try)
    apart, read = record.judged.apart, record.judged.fusions
    before = None if read is None else read.float_kernels  # the float model's, read once
    for k, other in enumerate(made):
        filename = f"int8-other{k}.onnx"
        judged = _cleaned(
            job, samples, fused, other.model, other.accuracy, [], apart, filename, other.recipe,
            before,
        )  # fmt: skip
        out.append((other, judged))
    return out


def _speed(
    job: QuantizeJob, record: _Record, others: list[tuple[Restoration, Judged]], feeds: Sample
) -> tuple[tuple[Measurement, Any], _Record]:
    """Step 8: int8 (and the recipes of other forms that pass) and the float optimized
    model against the float original, paired; the fastest int8 model that keeps the
    answers chosen (``speed_choice.choose``), the record with it."""
    job.say("measuring the speed")
    runtime = job.runtime
    settings = runtime if isinstance(runtime, RuntimeSettings) else RuntimeSettings()
    measured_on = runtime if runtime is not None and runtime is not settings else settings.make()
    assert not isinstance(measured_on, RuntimeSettings)
    by_label = {speed_choice.label(r.recipe): (r, j) for r, j in others}
    models = {
        FLOAT_OPT: record.fused.path,
        INT8: record.judged.path,
        **{name: j.path for name, (_, j) in by_label.items()},
    }
    original, seconds = record.fused.original, settings.bench_seconds
    speed = measure(original, models, measured_on, seconds=seconds, feeds=feeds)
    recipes_of = {name: r.recipe for name, (r, _) in by_label.items()}
    choice = speed_choice.choose(speed, record.restored.recipe, recipes_of)
    if choice.kept != INT8:  # confirmed in the reverse order, as tune confirms a flip
        job.say(
            f"confirming the speed of recipe {speed_choice.recipe_name(recipes_of[choice.kept])}"
        )
        pair = {INT8: models[INT8], choice.kept: models[choice.kept]}
        again = measure(original, pair, measured_on, seconds=seconds, feeds=feeds, reverse=True)
        choice = speed_choice.confirmed(choice, again, record.restored.recipe)
    if choice.note:
        record.fused.ws.notes.append(choice.note)
    if choice.kept != INT8:
        restored, judged = by_label[choice.kept]
        for t in record.tried:
            t.kept = t.steps == restored.recipe
        record = dataclasses.replace(
            record, restored=restored, judged=judged, accuracy=restored.accuracy
        )
    return (choice.speed, cpu_features()), record


def _check_speedup(job: QuantizeJob, result: QuantizeResult) -> None:
    """``min_speedup``: below it, exit 1 with the report written and nothing else."""
    floor = job.settings.min_speedup
    if floor is None or (result.speedup or 0) >= floor:
        return
    assert result.speed is not None and result.cpu is not None
    _write_report(job.report, result)  # the figures, as on the accuracy gate's exit 1
    written = "; the report is" if job.report is not None else ""
    raise GateError(
        f"int8 runs at {result.speedup:.2f}x the float original's speed on "
        f"{result.speed.runtime} ({result.cpu.describe()}), below --min-speedup "
        f"{floor:g}: no model written{written} (the same command without "
        "--min-speedup writes the model)",
        report=result,
    )


def _check_faster(job: QuantizeJob, result: QuantizeResult) -> None:
    """The fastest model that keeps the answers: int8 is written only where it is faster
    than the float original and the float optimized model beyond the noise (or
    ``write_slower``); else exit 1, the report written, the faster model named with the
    command that writes it."""
    if job.settings.write_slower or result.pays() is not False:
        return
    assert result.speed is not None and result.cpu is not None
    speed = result.speed
    command = job.settings.optimize_command(job.model_path, job.output)
    result.command = command
    _write_report(job.report, result)
    ms = {label: 1000 * t for label, t in speed.medians.items()}
    raise GateError(
        f"int8 is not faster than the float models on {speed.runtime} "
        f"({result.cpu.describe()}): it runs at {speed.ratio(INT8, FLOAT_OPT):.2f}x the float "
        f"optimized model's time and {speed.ratio(INT8):.2f}x the float original's (paired, "
        f"the figures to trust; medians {ms[INT8]:.3g}, {ms[FLOAT_OPT]:.3g} and "
        f"{speed.original_s * 1000:.3g} ms; noise +-{speed.noise:.0%}): nothing written"
        + ("; the report is" if job.report is not None else "")
        + f". The float optimized model is as fast or faster, and exact: {command} writes "
        "it (--write-slower writes the int8 model anyway)",
        report=result,
    )


def _no_temporary(text: str, source: str, name: str) -> str:
    """``text`` naming the user's model instead of its temporary copy, and no other
    temporary file (ours or onnxruntime's quantizer's)."""
    text = text.replace(source, name)
    temp = re.escape(tempfile.gettempdir().rstrip("/"))
    made = "|".join(re.escape(p) for p in (io.STAGING_PREFIX, "ort.quant.", "opfuse-"))
    return re.sub(temp + r"/(?:" + made + r")[^\s'\",:;)]*", "<a temporary file>", text)


def _nodes(path: Path) -> int:
    return len(onnx.load_model(str(path), load_external_data=False).graph.node)


def _write_report(report: Path | None, result: QuantizeResult) -> None:
    if report is not None:
        io.write_text(report, json.dumps(result.to_json(), indent=2) + "\n", what="report")


def _gate_message(job: QuantizeJob, result: QuantizeResult) -> str:
    gate = job.settings.gate
    grows = "; ".join(e.describe() for e in result.error_growth[:2])
    parts = len(result.kept_float)
    tries = result.fallback_tries
    kept = (
        f"keeping {parts} part{'s' * (parts != 1)} in float "
        f"({', '.join(k.node for k in result.kept_float)})"
        if result.kept_float
        else f"no part kept in float helped ({tries} tr{'y' if tries == 1 else 'ies'})"
    )
    return (
        f"the int8 model misses --max-drop ({'; '.join(gate.misses(result.accuracy))}): "
        f"recipe {result.first_recipe or result.recipe} reached {brief(result.first_accuracy)}, "
        f"the best after the fallback {brief(result.accuracy)} ({kept}; stopped at "
        f"{result.fallback_stopped or 'no fallback'})"
        + (f"; the error grows most at {grows}" if grows else "")
        + "; nothing written. To write that best model anyway: "
        + result.command
    )


def _best_command(job: QuantizeJob, fused: Fused, restored: Restoration) -> str:
    """The command that rebuilds the best model reached with the gate off: the user's
    settings with the recipe, ``--max-drop off`` and ``--exclude``: the user's items as
    given (op types, node names, ``leading=SHARE``), the nodes a workaround for
    onnxruntime's quantizer kept in float (the workspace's beyond the user's), and the
    fallback's parts (``KeptFloat.exclude_items``: node names, or ``leading=SHARE``). An
    API caller with a model or data in memory gets the keywords."""
    nodes = list(
        dict.fromkeys(
            [
                *job.settings.exclude,
                *(n for n in fused.ws.exclude if n not in fused.excluded),
                *(item for k in restored.kept for item in k.exclude_items),
            ]
        )
    )
    anyway = job.settings.written_anyway(restored.recipe, nodes)
    return anyway.command_line(job.model_path, job.output, job.calibration, job.runtime_name)
