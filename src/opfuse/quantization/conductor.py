"""The conductor of ``opfuse quantize``: read the samples and split them (calibration,
validation, evaluation), fuse, build a ``Workspace`` (the models in memory), choose the
recipe (``recipes.search``), keep the heads' outputs in float where requantizing them
changes the top class (``heads``), gate on the held-back samples and fall back to float
for the most sensitive parts when needed (``fallback``), clean up, measure the speed, write.

Nothing is written when the input is bad (exit 2) or ``min_speedup`` fails (exit 1). When
the gate is missed (exit 1) the report is still written and the message gives the first
and the best figures and the command that writes that best model anyway. A failure
inside quantization on a valid model is exit 3 with the fix to try; no message names a
temporary file."""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from opfuse.errors import GateError, OpfuseError
from opfuse.model import io
from opfuse.pipeline.opset import converted_if_old
from opfuse.pipeline.switch import SwitchTable
from opfuse.quantization import calibration, flow, heads, quantizer_input, recipes
from opfuse.quantization.accuracy import OutputAccuracy, brief, compare_outputs
from opfuse.quantization.fallback import (
    FALLBACK_SECONDS,
    MAX_FALLBACK_TRIES,
    MAX_FLOAT_LAYERS,
    KeptFloat,
    fallback,
    stem_first,
)
from opfuse.quantization.gate import Gate
from opfuse.quantization.kernels import integer_coverage
from opfuse.quantization.preprocess import Preprocess
from opfuse.quantization.result import (
    FLOAT_OPT,
    HARDSWISH_OPSET,
    INT8,
    QuantizeResult,
    decomposed_hardswish,
)
from opfuse.quantization.steps import parse_recipe
from opfuse.quantization.trace import TensorError, error_trace, largest_drops
from opfuse.quantization.workspace import QuantizeInternalError, Workspace, run_model
from opfuse.runtime import Runtime
from opfuse.runtime.cpu import cpu_features
from opfuse.runtime.settings import RuntimeSettings
from opfuse.tuning.measure import measure

__all__ = [
    "FALLBACK_SECONDS",
    "FLOAT_OPT",
    "INT8",
    "MAX_FALLBACK_TRIES",
    "MAX_FLOAT_LAYERS",
    "KeptFloat",
    "QuantizeResult",
    "quantize_file",
]

RANDOM = "random"
RANDOM_SAMPLES = 16
Data = str | os.PathLike[str] | object  # a path, "random", or arrays in memory (the API)


def quantize_file(
    model: str | os.PathLike[str] | onnx.ModelProto,
    output: str | os.PathLike[str] | None,
    calibration_data: Data,
    *,
    eval_data: Data | None = None,
    samples_count: int | None = None,
    preprocess: Preprocess | None = None,
    exclude: Sequence[str] = (),
    max_drop: str | None = None,
    min_speedup: float | None = None,
    benchmark: bool = True,
    runtime: RuntimeSettings | Runtime | None = None,
    options: flow.QuantOptions | None = None,
    switch_table: SwitchTable | None = None,
    enable: Sequence[str] = (),
    disable: Sequence[str] = (),
    report: str | os.PathLike[str] | None = None,
    recipe: str = "auto",
    target_opset: int | None = None,
    fallback_seconds: float = FALLBACK_SECONDS,
    progress: Callable[[str], None] | None = None,
    command: Sequence[str] | None = None,
) -> QuantizeResult:
    """Quantize ``model`` (a file, or an ``onnx.ModelProto``) into ``output`` (None: not
    written; ``result.model`` holds it). See the module. ``command``: the user's command
    line, from which the exit-1 message builds the command that writes the best model."""
    started = time.perf_counter()
    options = options or flow.QuantOptions()
    gate = Gate.parse(max_drop)
    forced = parse_recipe(recipe)
    if options.activation_type not in flow.ACTIVATION_TYPES:
        raise OpfuseError(f"--activation-type {options.activation_type!r}: uint8 or int8")
    if options.calibrate_method not in flow.CALIBRATE_METHODS:
        raise OpfuseError(
            f"--calibrate-method {options.calibrate_method!r}: one of "
            f"{', '.join(flow.CALIBRATE_METHODS)}"
        )
    if min_speedup is not None and (min_speedup <= 0 or not benchmark):
        raise OpfuseError(
            "--min-speedup needs a number above 0 and the benchmark (not --no-benchmark)"
        )
    if samples_count is not None and samples_count < 1:
        raise OpfuseError(f"--samples {samples_count}: a count of at least 1")
    if fallback_seconds < 0:
        raise OpfuseError(f"--fallback-seconds {fallback_seconds:g}: 0 or more")
    with tempfile.TemporaryDirectory(prefix=io.STAGING_PREFIX + "quant-") as tmp:
        work = Path(tmp)
        if isinstance(model, onnx.ModelProto):
            name = "the model given"
            source = work / "model.onnx"
            try:
                io.write_bytes(source, model.SerializeToString(), what="the model")
            except ValueError as exc:  # over protobuf's 2 GB
                raise OpfuseError(f"cannot serialize the ModelProto: {exc}") from None
        elif isinstance(model, str | os.PathLike):
            name, source = str(model), Path(model)
        else:
            raise OpfuseError(f"expected a path or an onnx.ModelProto, got {type(model).__name__}")
        try:
            result = _quantize(
                source,
                name,
                output,
                calibration_data,
                eval_data,
                samples_count,
                preprocess,
                exclude,
                gate,
                forced,
                min_speedup,
                benchmark,
                runtime,
                options,
                switch_table,
                enable,
                disable,
                report,
                target_opset,
                fallback_seconds,
                progress,
                command,
                work,
            )
        except OpfuseError as exc:
            exc.args = (_no_temporary(str(exc), str(source), name),)
            raise
    result.notes = [_no_temporary(n, str(source), name) for n in result.notes]
    result.seconds = time.perf_counter() - started
    return result


def _no_temporary(text: str, source: str, name: str) -> str:
    """``text`` naming the user's model instead of its temporary copy, and no other
    temporary file (ours or onnxruntime's quantizer's)."""
    import re

    text = text.replace(source, name)
    temp = re.escape(tempfile.gettempdir().rstrip("/"))
    made = "|".join(re.escape(p) for p in (io.STAGING_PREFIX, "ort.quant.", "opfuse-"))
    return re.sub(temp + r"/(?:" + made + r")[^\s'\",:;)]*", "<a temporary file>", text)


def _quantize(
    source: Path,
    name: str,
    output: str | os.PathLike[str] | None,
    calibration_data: Data,
    eval_data: Data | None,
    samples_count: int | None,
    preprocess: Preprocess | None,
    exclude: Sequence[str],
    gate: Gate,
    forced: tuple[str, ...] | None,
    min_speedup: float | None,
    benchmark: bool,
    runtime: RuntimeSettings | Runtime | None,
    options: flow.QuantOptions,
    switch_table: SwitchTable | None,
    enable: Sequence[str],
    disable: Sequence[str],
    report: str | os.PathLike[str] | None,
    target_opset: int | None,
    fallback_seconds: float,
    progress: Callable[[str], None] | None,
    command: Sequence[str] | None,
    work: Path,
) -> QuantizeResult:
    outputs = [("-o", output)] if output is not None else []
    io.check_outputs(source, [*outputs, ("--report", report)])
    source_proto = io.read_proto(source)[0]
    quantized = quantizer_input.quantized_ops(source_proto)
    if quantized:
        raise OpfuseError(
            f"{name}: already quantized ({quantized}): give the float model it was made "
            "from (opfuse advise reads how much of a quantized model runs in int8)"
        )
    source_nodes = {n.name for n in source_proto.graph.node}
    for item in exclude:  # a node name is checked on the fused model, leading=SHARE now
        if item.startswith(flow.LEADING_KEY) and item not in source_nodes:
            flow.leading_share(item)
    inputs = calibration.model_inputs(source)
    warnings: list[str] = []
    samples = _samples(
        calibration_data, inputs, preprocess, samples_count, warnings, "--calibration"
    )
    if eval_data is not None:
        calib_all, held = samples, _samples(eval_data, inputs, preprocess, None, [], "--eval")
        where = eval_data if isinstance(eval_data, str | os.PathLike) else "the eval data given"
        held_source = f"samples from {where}"
    else:
        calib_all, held = calibration.split(samples)
        held_source = "samples held back from the calibration data (not used to calibrate)"
    calib, valid, apart = calibration.validation_split(calib_all)
    if len(held) < calibration.FEW_EVAL_SAMPLES:
        warnings.append(
            f"the accuracy figures rest on {len(held)} sample{'s' * (len(held) != 1)}: one "
            f"sample more or less can move them; give at least {calibration.FEW_EVAL_SAMPLES} "
            "(--eval, or more calibration data)"
        )
    opset = flow.default_opset(source)
    target = target_opset
    if (
        target is None
        and options.per_channel
        and opset is not None
        and opset < flow.PER_CHANNEL_OPSET
    ):
        target = flow.PER_CHANNEL_OPSET
        warnings.append(
            f"converted from opset {opset} to {target}: per-channel QuantizeLinear/"
            "DequantizeLinear (their axis) need it"
        )
    # verified on a real sample: generated inputs can be ones the model refuses (a voice
    # detector's window shorter than its STFT's padding, a rate it has no branch for)
    sample = work / "sample.npz"
    np.savez(sample, **cast(dict[str, Any], calib[0]))  # numpy stubs: allow_pickle
    fused_path = work / "fused.onnx"
    start = time.perf_counter()

    def say(text: str) -> None:
        if progress is not None:
            progress(f"[{time.perf_counter() - start:5.1f} s] {text}")

    say("fusing")
    fused = flow.fuse(
        source, fused_path, switch_table, enable, disable, target, verify_inputs=sample
    )
    fused_model = onnx.load_model(str(fused_path))
    excluded = flow.excluded_names(fused_model, exclude, name, calib[0])
    ws = Workspace(
        name,
        fused_model,
        fused_model,
        calib,
        valid,
        per_channel=options.per_channel,
        activation_type=options.activation_type,
        calibrate_method=options.calibrate_method,
        exclude=excluded,
        progress=progress,
        started=start,
        cache_dir=work,
    )
    original, (ws.valid_reference, held_reference) = _references(source, [valid, held], name, work)
    if original != source:
        warnings.append(
            "onnxruntime cannot load the model's opset: it is judged and timed as onnx's "
            f"version converter makes it (opset {io.MIN_OPSET})"
        )

    def on_held(model: onnx.ModelProto) -> list[OutputAccuracy]:
        return compare_outputs(
            ws.output_names,
            held_reference,
            run_model(model, held, name, internal=True),
            ws.scoring,
            ws.maps,
        )

    best, tried, skipped = recipes.search(ws, gate, forced)
    assert best.model is not None
    chosen = best.steps
    valid_figures = best.accuracy
    model = best.model
    # heads: keep a float output where requantizing it changes the top class
    head_choices: list[heads.HeadChoice] = []
    float_heads: list[str] = []
    for out_name, op_type in heads.requantized_heads(model, ws.scoring).items():
        candidate = heads.float_output(model, out_name)
        figures = ws.score(candidate)
        was = next(a for a in valid_figures if a.name == out_name)
        now = next(a for a in figures if a.name == out_name)
        keep = heads.keep_float(was.top1, now.top1, was.sqnr_db, now.sqnr_db)
        head_choices.append(
            heads.HeadChoice(out_name, op_type, was.top1, now.top1, keep, was.sqnr_db, now.sqnr_db)
        )
        ws.say(head_choices[-1].describe())
        if keep:
            float_heads.append(out_name)
            model, valid_figures = candidate, figures
    split_model, split_steps = model, chosen
    # the model written is calibrated on every calibration sample (the validation part
    # only chooses): the recipe, its heads and what the fallback keeps in float
    everything = ws.fork()
    everything.calib = calib_all

    def final(in_float: list[str]) -> onnx.ModelProto:
        if not apart:
            return build(in_float) if in_float or chosen != split_steps else split_model
        ws.say(f"the recipe on all {len(calib_all)} calibration samples")
        made = recipes.build(everything, chosen, in_float, tuple(float_heads))
        assert made.model is not None
        return made.model

    def build(in_float: list[str]) -> onnx.ModelProto:
        # from the workspace before any step (a float step runs once: its result is cached)
        made = recipes.build(ws, chosen, in_float, tuple(float_heads))
        assert made.model is not None
        return made.model

    def cross_scored(in_float: list[str]) -> list[OutputAccuracy] | None:
        # the recipe with these nodes in float, cross-validated over every calibration
        # sample (a few validation samples cannot tell 98% from 99%: fallback._leading)
        if not halves:
            halves.append(recipes.folds(ws, always=True))
        if halves[0] is None:
            return None
        made = recipes.cross_validated(
            ws, halves[0], chosen, in_float, tuple(float_heads), say=False
        )
        return None if made.error else made.accuracy

    halves: list[list[Workspace] | None] = []  # made on the first call
    model = first_model = final([])
    accuracy = first_accuracy = on_held(model)
    searched = chosen  # the search's recipe (the stem may join it below)
    kept: list[KeptFloat] = []
    tries, stopped = 0, ""
    ranked_on = best.ws  # the workspace the fallback ranks its candidates on
    fallback_start = time.perf_counter()
    if gate.misses(accuracy) and fallback_seconds > 0:
        stem_tries: list[recipes.Built] = []
        stem = stem_first(ws, gate, best, tried, forced is not None, fallback_seconds, stem_tries)
        tried.extend(stem_tries)
        if stem is None and stem_tries:
            ws.notes.append(
                "with the stem in float ("
                + "; ".join(t.line() for t in stem_tries)
                + f") did not score better than recipe {best.name}: not kept"
            )
        if stem is not None:
            chosen = stem.steps
            candidate = final([])
            figures = on_held(candidate)
            ws.say(
                f"the stem in float: recipe {stem.name}: {brief(figures)} on the evaluation samples"
            )
            if gate.better(figures, first_accuracy):
                model, accuracy = candidate, figures
                for t in tried:  # the search's choice is not the model written
                    t.kept = t is stem
                ws.notes.append(
                    f"recipe {recipes.recipe_name(searched)} missed the gate "
                    f"({brief(first_accuracy)}); with the stem in float (mixed precision: its "
                    f"layers lose their int8 kernels) recipe {stem.name} reached "
                    f"{brief(figures)} on the evaluation samples"
                )
                if gate.misses(accuracy):  # the rest of the fallback starts from it
                    made = recipes.build(ws, chosen, [], tuple(float_heads))
                    assert made.model is not None
                    ranked_on, split_model, split_steps = made.ws, made.model, chosen
                    valid_figures = ws.score(made.model)
            else:
                chosen = searched
                ws.notes.append(
                    f"with the stem in float (recipe {stem.name}) the evaluation samples did "
                    f"not score better ({brief(figures)} against {brief(first_accuracy)}): "
                    "not kept"
                )
    # the stem's tries count in the fallback's seconds
    left = fallback_seconds - (time.perf_counter() - fallback_start)
    if gate.misses(accuracy) and fallback_seconds > 0 and left > 0:
        found = fallback(ranked_on, gate, build, split_model, valid_figures, left, cross_scored)
        tries, stopped = found.tries, found.stopped
        if found.kept:
            candidate = final(found.exclude)
            figures = on_held(candidate)
            if gate.better(figures, accuracy):
                kept, model, accuracy = found.kept, candidate, figures
            else:  # parts in float cost speed: only for a gain that holds
                ws.notes.append(
                    f"the fallback's choice on the validation part ({', '.join(k.node for k in found.kept)} "
                    f"in float) did not score better on the evaluation samples ({brief(figures)} "
                    f"against {brief(accuracy)}): the model without it is kept"
                )
                stopped += "; not kept: the evaluation samples scored no better"
    elif gate.misses(accuracy) and fallback_seconds > 0:
        stopped = f"its {fallback_seconds:g} s budget, spent on the stem in float"
    growth = []
    if gate.misses(accuracy):  # where the first model's error grows, for the message
        growth = largest_drops(error_trace(best.ws.float_model, first_model, held[:4]))
    form = "onnxruntime"
    if isinstance(runtime, RuntimeSettings) and runtime.runtime == "openvino":
        # the runtime it ships on: OpenVINO runs in int8 the compute ops whose inputs are
        # quantized (NNCF's convention); onnxruntime's form would requantize every output
        from opfuse.quantization.openvino_form import openvino_form_report

        form = "openvino"
        model, done = openvino_form_report(model)
        accuracy = on_held(model)
        ws.notes.append(
            "written in OpenVINO's QDQ form (--runtime openvino): Q/DQ on the inputs of the "
            f"compute ops and pooling ({done.kept_activation_pairs} activation pairs kept, "
            f"{done.removed_activation_pairs} removed, {done.float_constants} biases and "
            "constants in float); the figures are this form's"
        )
        ws.say("the model in OpenVINO's QDQ form")
    passed = not gate.misses(accuracy)
    result = QuantizeResult(
        fused,
        accuracy,
        gate,
        len(calib_all),
        len(held),
        held_source,
        kept,
        warnings=warnings,
        error_growth=growth,
        validation_samples=len(valid),
        validation_apart=apart,
        recipe=recipes.recipe_name(chosen),
        first_recipe=recipes.recipe_name(searched),
        recipes=[t.to_json() for t in tried],
        recipe_lines=[t.line() for t in tried],
        skipped=skipped,
        heads=head_choices,
        notes=ws.notes,
        first_accuracy=first_accuracy,
        fallback_tries=tries,
        fallback_stopped=stopped,
        passed=passed,
        # the model before the fallback in the same form (onnxruntime's) as its figures
        first_passes=(gate.loosened(first_accuracy) or "")
        if (kept or chosen != searched) and form == "onnxruntime" and passed
        else "",
    )
    result.form = form
    if (flow.default_opset(fused_path) or 0) < HARDSWISH_OPSET:
        result.hardswish_written_out = decomposed_hardswish(fused_model)
    say("cleaning up the QDQ graph")
    model = flow.clean_up_proto(model, calib[0], name)
    result.model = model
    empty = flow.nothing_quantized(model)
    if empty:
        warnings.append(empty)
    result.nodes = {
        "original": _nodes(source),
        FLOAT_OPT: len(fused_model.graph.node),
        INT8: len(model.graph.node),
    }
    int8_path = work / "int8.onnx"
    onnx.save_model(model, str(int8_path))
    result.sizes = {"original": source.stat().st_size, "int8": int8_path.stat().st_size}
    result.coverage = integer_coverage(model, feed=calib[0])
    if not passed:
        result.command = _best_command(
            command, name, output, chosen, kept, ws.exclude, excluded, exclude
        )
        _write_report(report, result)
        raise GateError(_gate_message(gate, result, growth), report=result)
    if benchmark:
        say("measuring the speed")
        settings = runtime if isinstance(runtime, RuntimeSettings) else RuntimeSettings()
        rt = settings.make() if runtime is None or isinstance(runtime, RuntimeSettings) else runtime
        result.speed = measure(
            original,
            {FLOAT_OPT: fused_path, INT8: int8_path},
            rt,
            seconds=settings.bench_seconds,
            feeds=held[0],
        )
        result.cpu = cpu_features()
        if min_speedup is not None and (result.speedup or 0) < min_speedup:
            _write_report(report, result)  # the figures, as on the accuracy gate's exit 1
            written = "; the report is" if report is not None else ""
            raise GateError(
                f"int8 runs at {result.speedup:.2f}x the float original's speed on "
                f"{result.speed.runtime} ({result.cpu.describe()}), below --min-speedup "
                f"{min_speedup:g}: no model written{written} (the same command without "
                "--min-speedup writes the model)",
                report=result,
            )
    if output is not None:
        io.save_model(io.load_model(int8_path), output, input_path=source)
        result.output = Path(output)
    _write_report(report, result)
    return result


def _references(
    source: str | os.PathLike[str],
    parts: list[list[calibration.Sample]],
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


def _samples(
    data: Data,
    inputs: list[calibration.ModelInput],
    preprocess: Preprocess | None,
    count: int | None,
    warnings: list[str],
    option: str,
) -> list[calibration.Sample]:
    if isinstance(data, str) and data == RANDOM:
        if option == "--eval":
            raise OpfuseError("--eval random: give real samples to measure accuracy on")
        warnings.append(
            "calibrated on RANDOM data (--calibration random): the scales and the accuracy "
            "figures say nothing about real inputs; give real samples before shipping"
        )
        return calibration.random_samples(inputs, count or RANDOM_SAMPLES)
    if isinstance(data, str | os.PathLike):
        samples = calibration.read_samples(data, inputs, preprocess)
        return calibration.first(samples, count, str(data))
    samples = calibration.from_arrays(data, inputs, option.removeprefix("--"))
    return calibration.first(samples, count, option.removeprefix("--"))


def _nodes(path: Path) -> int:
    return len(onnx.load_model(str(path), load_external_data=False).graph.node)


def _write_report(report: str | os.PathLike[str] | None, result: QuantizeResult) -> None:
    if report is not None:
        import json

        io.write_text(report, json.dumps(result.to_json(), indent=2) + "\n", what="report")


def _gate_message(gate: Gate, result: QuantizeResult, growth: list[TensorError]) -> str:
    grows = "; ".join(e.describe() for e in growth[:2])
    parts = len(result.kept_float)
    kept = (
        f"keeping {parts} part{'s' * (parts != 1)} in float ({', '.join(k.node for k in result.kept_float)})"
        if result.kept_float
        else f"no part kept in float helped ({result.fallback_tries} tr{'y' if result.fallback_tries == 1 else 'ies'})"
    )
    return (
        f"the int8 model misses --max-drop ({'; '.join(gate.misses(result.accuracy))}): "
        f"recipe {result.first_recipe or result.recipe} reached {brief(result.first_accuracy)}, the best after the "
        f"fallback {brief(result.accuracy)} ({kept}; stopped at {result.fallback_stopped or 'no fallback'})"
        + (f"; the error grows most at {grows}" if grows else "")
        + "; nothing written. To write that best model anyway: "
        + result.command
    )


def _best_command(
    command: Sequence[str] | None,
    name: str,
    output: str | os.PathLike[str] | None,
    recipe: tuple[str, ...],
    kept: list[KeptFloat],
    ws_exclude: list[str],
    user_exclude: list[str],
    given: Sequence[str] = (),
) -> str:
    """The command line that rebuilds the best model reached with the gate off: the
    user's own (``command``) with --recipe, --exclude and --max-drop replaced; an API
    caller gets the keywords. --exclude: the user's items as given (op types, node names,
    ``leading=SHARE``), the nodes a workaround for onnxruntime's quantizer kept in float
    (``ws_exclude`` beyond the user's ``user_exclude``), and the fallback's parts
    (``KeptFloat.exclude_items``: node names, or ``leading=SHARE``)."""
    nodes = list(
        dict.fromkeys(
            [
                *given,
                *(n for n in ws_exclude if n not in user_exclude),
                *(item for k in kept for item in k.exclude_items),
            ]
        )
    )
    if command is None:
        return (
            f"opfuse.quantize(..., recipe={recipes.recipe_name(recipe)!r}, "
            f"exclude={nodes!r}, max_drop='off')"
        )
    args = list(command)
    kept_args: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        key = arg.split("=", 1)[0]
        if key in ("--recipe", "--exclude", "--max-drop"):
            skip = "=" not in arg and i + 1 < len(args)
            continue
        kept_args.append(arg)
    kept_args += ["--recipe", recipes.recipe_name(recipe), "--max-drop", "off"]
    for node in nodes:
        kept_args += ["--exclude", node]
    return shlex.join(kept_args)


__all__ += ["QuantizeInternalError", "Workspace"]
