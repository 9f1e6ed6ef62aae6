"""The public Python API, re-exported by ``opfuse``: ``optimize``, ``verify``, ``passes``,
``tune``, ``advise``, ``batch``, ``InferenceSession``, and every type they take or return:
the results, the errors, and the settings objects (``OptimizeSettings``,
``VerifySettings``, ``RuntimeSettings``) that hold a group of options, checked when made
(``SettingsError`` names the keyword). Keyword names are the CLI's options; a command
parses its options into the same settings objects and calls the function here.

A model is given as a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``. An in-memory
model goes through the same checks and the same verifier as a file: it is written to a
temporary folder first (so a bad model is a one-line ``OpfuseError``, and verification can
re-run the original). The model given is never changed.

The engine's old entry points that used to live here (``opfuse.api.optimize_file``...) are
now in ``opfuse.pipeline.conductor``; reading them from here still works for one release, with a
``DeprecationWarning`` (``__getattr__`` at the end of this module).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, overload

import onnx
import onnx_ir as ir
import onnxruntime as ort

from opfuse.advisor import conductor as advisor
from opfuse.advisor import profile_report
from opfuse.advisor.analysis import AdviseOptions
from opfuse.advisor.profile_report import ProfileReport
from opfuse.advisor.report_types import AdviceReport
from opfuse.advisor.settings import ProfileSettings
from opfuse.batching.runner import (
    BatchInterrupted,
    BatchProgress,
    BatchRecords,
    BatchRun,
    batch,
)
from opfuse.errors import EngineError, GateError, OpfuseError, SettingsError, VerificationError
from opfuse.model import io
from opfuse.pipeline import conductor as pipeline
from opfuse.pipeline.conductor import OptimizeResult, save_inputs
from opfuse.pipeline.phases import Phases
from opfuse.pipeline.settings import OptimizeSettings
from opfuse.quantization.names import FALLBACK_TRIES
from opfuse.quantization.result import QuantizeResult
from opfuse.quantization.settings import QuantizeSettings
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT, Options
from opfuse.rewrite.registry import PassInfo
from opfuse.rules import all_passes
from opfuse.runtime.settings import (
    RuntimeSettings,
    SessionSettings,
    ort_session_options,
)
from opfuse.tuning import conductor
from opfuse.tuning import search as tuning
from opfuse.tuning.deployment import (
    Deployment,
    GraphSettings,
    read_deployment,
    sha256_bytes,
    sha256_file,
)
from opfuse.tuning.settings import TuneSettings
from opfuse.verification.compare import OutputDiff, VerifyReport, compare_files
from opfuse.verification.settings import VerifySettings

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "AdviceReport",
    "AdviseOptions",
    "BatchInterrupted",
    "BatchProgress",
    "BatchRecords",
    "BatchRun",
    "EngineError",
    "GateError",
    "InferenceSession",
    "OpfuseError",
    "OptimizeResult",
    "OptimizeSettings",
    "Options",
    "OutputDiff",
    "PassInfo",
    "Phases",
    "ProfileReport",
    "ProfileSettings",
    "QuantizeResult",
    "QuantizeSettings",
    "RuntimeSettings",
    "SessionSettings",
    "SettingsError",
    "TuneResult",
    "TuneSettings",
    "VerificationError",
    "VerifyReport",
    "VerifySettings",
    "advise",
    "batch",
    "optimize",
    "passes",
    "profile",
    "quantize",
    "tune",
    "verify",
]

ModelInput = str | os.PathLike[str] | onnx.ModelProto | ir.Model
TuneResult = tuning.TuneResult


class OptimizeKeywords(TypedDict, total=False):
    """The keywords of ``optimize`` (each one a CLI option of ``opfuse optimize``)."""

    output: str | os.PathLike[str] | None
    fusion_switch_file: str | os.PathLike[str] | None
    enable: Iterable[str]
    disable: Iterable[str]
    keep_inputs: Sequence[str] | None
    keep_outputs: Sequence[str] | None
    fusion_result: str | os.PathLike[str] | None
    verify: bool
    rtol: float
    atol: float
    input_shape: Mapping[str, Sequence[int]] | None
    inputs: str | os.PathLike[str] | None
    verify_inputs: str | os.PathLike[str] | None
    seed: int
    save_failing_inputs: str | os.PathLike[str] | None
    bisect: bool
    fold_size_limit: int
    target_opset: int | None
    layout: str
    target: str | None
    phases: Phases | None
    static_shapes: bool
    optimize_settings: OptimizeSettings | None
    verify_settings: VerifySettings | None


def _as_file(model: ModelInput, folder: Path, name: str) -> Path:
    """A path to ``model``: the path itself, or the in-memory model written to ``folder``."""
    if isinstance(model, str | os.PathLike):
        return Path(model)
    path = folder / name
    if isinstance(model, onnx.ModelProto):
        try:
            data = model.SerializeToString()
        except ValueError as exc:  # over protobuf's 2 GB
            raise OpfuseError(f"cannot serialize the ModelProto: {exc}") from None
        io.write_bytes(path, data, what="the model")
        return path
    if isinstance(model, ir.Model):
        return io.save_model(model, path)
    raise OpfuseError(
        f"expected a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}"
    )


@overload
def optimize(
    model: onnx.ModelProto, **options: Unpack[OptimizeKeywords]
) -> OptimizeResult[onnx.ModelProto]: ...
@overload
def optimize(
    model: ir.Model | str | os.PathLike[str], **options: Unpack[OptimizeKeywords]
) -> OptimizeResult[ir.Model]: ...
def optimize(
    model: ModelInput,
    *,
    output: str | os.PathLike[str] | None = None,
    fusion_switch_file: str | os.PathLike[str] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    keep_inputs: Sequence[str] | None = None,
    keep_outputs: Sequence[str] | None = None,
    fusion_result: str | os.PathLike[str] | None = None,
    verify: bool = True,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shape: Mapping[str, Sequence[int]] | None = None,
    inputs: str | os.PathLike[str] | None = None,
    verify_inputs: str | os.PathLike[str] | None = None,
    seed: int = 0,
    save_failing_inputs: str | os.PathLike[str] | None = None,
    bisect: bool = True,
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT,
    target_opset: int | None = None,
    layout: str = "keep",
    target: str | None = None,
    phases: Phases | None = None,
    static_shapes: bool = False,
    optimize_settings: OptimizeSettings | None = None,
    verify_settings: VerifySettings | None = None,
) -> OptimizeResult[onnx.ModelProto] | OptimizeResult[ir.Model]:
    """Optimize ``model`` (a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``) and
    verify the result against it under onnxruntime.

    Returns an ``OptimizeResult`` whose ``model`` is of the kind given (an
    ``onnx_ir.Model`` for a path); the model given is left unchanged. ``output`` also
    writes the result to that file (atomically; never over the input). The keywords are
    ``opfuse optimize``'s options. Raises ``OpfuseError`` on bad input (``SettingsError``
    naming the keyword for a refused setting) and ``VerificationError`` (naming the first
    pass whose output differs) when the outputs differ beyond ``atol * max(1, max|ref|) +
    rtol * |ref|``. ``inputs``: an .npz of arrays named after the model's inputs to verify
    on instead of generated ones (``verify_inputs`` is its older name); without it, the
    inputs are generated (``result.verify.fed`` says which, and their shapes).
    ``static_shapes`` re-declares the inputs with the ``input_shape`` dims
    (``--static-shapes``).

    ``optimize_settings`` (``OptimizeSettings``: the passes, the cut, the graph options,
    ``static_shapes``) and ``verify_settings`` (``VerifySettings``: tolerances, inputs,
    seed, ``save_failing_inputs``) may be given instead of those keywords.
    """
    graph = _given(
        optimize_settings,
        OptimizeSettings,
        fusion_switch_file=fusion_switch_file,
        enable=tuple(enable),
        disable=tuple(disable),
        keep_inputs=tuple(keep_inputs or ()),
        keep_outputs=tuple(keep_outputs or ()),
        fold_size_limit=fold_size_limit,
        target_opset=target_opset,
        layout=layout,
        target=target,
        static_shapes=static_shapes,
    )
    checks = _verify_settings(
        verify_settings, rtol, atol, input_shape, verify_inputs, seed, save_failing_inputs, inputs
    )
    workdir = tempfile.TemporaryDirectory(prefix="opfuse-")
    folder = Path(workdir.name)
    source = _as_file(model, folder, "input.onnx")
    result = pipeline.optimize_file(
        source,
        output if output is not None else folder / "optimized.onnx",
        settings=graph,
        verifier=checks,
        verify=verify,
        fusion_result=fusion_result,
        bisect=bisect,
        phases=phases,
    )
    result.output = Path(output) if output is not None else None
    return _of_kind(model, result, workdir)


def _of_kind(
    model: ModelInput, result: OptimizeResult[ir.Model], workdir: tempfile.TemporaryDirectory[str]
) -> OptimizeResult[onnx.ModelProto] | OptimizeResult[ir.Model]:
    """The result with its model of the kind given: a ModelProto for a ModelProto (the
    temporary folder removed), else the onnx_ir.Model (the folder kept: the model's lazy
    external tensors may still read from it)."""
    if isinstance(model, onnx.ModelProto):
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        fields["model"] = io.to_proto(result.model)
        workdir.cleanup()
        return OptimizeResult[onnx.ModelProto](**fields)
    result.workdir = workdir
    return result


def verify(
    original: ModelInput,
    optimized: ModelInput,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shape: Mapping[str, Sequence[int]] | None = None,
    inputs: str | os.PathLike[str] | None = None,
    verify_inputs: str | os.PathLike[str] | None = None,
    seed: int = 0,
    save_failing_inputs: str | os.PathLike[str] | None = None,
    verify_settings: VerifySettings | None = None,
) -> VerifyReport:
    """Run both models (paths or in-memory models) under onnxruntime with its graph
    optimizations off on the same inputs and compare every output by name.

    Never raises for differing outputs: read ``report.ok`` and ``report.outputs``
    (each with its error, the bound applied and the share of it the worst element used);
    with ``save_failing_inputs``, differing outputs also write the inputs there
    (``report.saved_inputs``). ``inputs``: an .npz of arrays named after the inputs
    (``verify_inputs``, its older name), else generated inputs (``report.fed`` says which,
    and their shapes). ``verify_settings`` (``VerifySettings``) may be given instead of
    the keywords. Raises ``OpfuseError`` on bad input."""
    checks = _verify_settings(
        verify_settings, rtol, atol, input_shape, verify_inputs, seed, save_failing_inputs, inputs
    )
    with tempfile.TemporaryDirectory(prefix="opfuse-") as tmp:
        a = _as_file(original, Path(tmp), "original.onnx")
        b = _as_file(optimized, Path(tmp), "optimized.onnx")
        for path in (a, b):
            io.read_proto(path)
        if checks.save_failing_inputs is not None:
            io.check_output_path(checks.save_failing_inputs, [a, b])
        report = compare_files(
            a,
            b,
            rtol=checks.rtol,
            atol=checks.atol,
            input_shapes=checks.shapes,
            inputs_npz=checks.inputs_npz,
            seed=checks.seed,
        )
    if not report.ok and checks.save_failing_inputs is not None:
        report.saved_inputs = save_inputs(report.feeds, checks.save_failing_inputs)
    return report


def _verify_settings(
    given: VerifySettings | None,
    rtol: float,
    atol: float,
    input_shape: Mapping[str, Sequence[int]] | None,
    verify_inputs: str | os.PathLike[str] | None,
    seed: int,
    save_failing_inputs: str | os.PathLike[str] | None,
    inputs: str | os.PathLike[str] | None = None,
) -> VerifySettings:
    """``verify_settings``, or the verifier's keywords made into one."""
    return _given(
        given,
        VerifySettings,
        rtol=rtol,
        atol=atol,
        input_shape=input_shape or {},
        verify_inputs=verify_inputs,
        seed=seed,
        save_failing_inputs=save_failing_inputs,
        inputs=inputs,
    )


_Settings = TypeVar(
    "_Settings", OptimizeSettings, VerifySettings, TuneSettings, RuntimeSettings, QuantizeSettings
)


def _given(given: _Settings | None, kind: type[_Settings], **keywords: Any) -> _Settings:
    """The settings object given, else one made of the keywords; a keyword changed from
    its default beside the object is refused (one of the two would be ignored)."""
    if given is None:
        return kind(**keywords)
    if not isinstance(given, kind):
        raise OpfuseError(f"expected {kind.__name__}, got {type(given).__name__}")
    default = kind()
    for name, value in keywords.items():
        if value != getattr(default, name):
            raise SettingsError(
                name, value, f"give it in the {kind.__name__} or as a keyword, not both"
            )
    return given


def passes() -> list[PassInfo]:
    """Every pass in execution order: switch name, section, default, opset range, what it
    does (``info.description``)."""
    return all_passes()


def profile(
    model: str | os.PathLike[str],
    settings: ProfileSettings | None = None,
    *,
    top: int = 20,
    profile_out: str | os.PathLike[str] | None = None,
    step: Callable[..., None] | None = None,
) -> ProfileReport:
    """Profile the model file ``model`` with onnxruntime (``opfuse profile``): the op
    statistic per op type and the ``top`` slowest nodes, each with the model's nodes its
    time belongs to. ``settings``: runs, warm-up, threads, provider, graph optimization
    level (default ``all``: the graph onnxruntime deploys), input shapes; ``profile_out``
    also writes onnxruntime's profile JSON (never over the model). ``step(what)`` /
    ``step(what, done, total)`` follows the progress. ``result.to_json()`` is ``opfuse
    profile --format json``. Raises ``OpfuseError`` on bad input."""
    return profile_report.profile(model, settings, top=top, profile_out=profile_out, step=step)


def advise(
    model_path: str | os.PathLike[str] | None,
    *,
    profile_path: str | os.PathLike[str] | None = None,
    op_summary: str | os.PathLike[str] | None = None,
    options: AdviseOptions | None = None,
    step: Callable[..., None] | None = None,
) -> AdviceReport:
    """The advisor's report on ``model_path`` (``opfuse advise``): the operator groups a
    backend could fuse, ranked, from a profile run here (``options``: the
    ``ProfileSettings`` and the advisor's own), read from ``profile_path`` (an onnxruntime
    profile JSON of the model) or from ``op_summary`` (an Ascend msprof CSV, the model
    optional). Returns an ``AdviceReport``: typed sections, ``to_json()`` (schema
    ``opfuse.advise/2``, docs/ADVISOR.md), also a read-only mapping of that JSON.
    Raises ``OpfuseError`` on bad input."""
    return advisor.advise(
        model_path, profile_path=profile_path, op_summary=op_summary, options=options, step=step
    )


def tune(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    settings: TuneSettings | None = None,
    runtime_settings: RuntimeSettings | None = None,
    budget: float = 120.0,
    switch_file_out: str | os.PathLike[str] | None = None,
    report: str | os.PathLike[str] | None = None,
    runtime: str = "onnxruntime",
    provider: str | None = None,
    threads: int = 1,
    graph_opt: str = "all",
    bench_seconds: float = 5.0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shape: Mapping[str, Sequence[int]] | None = None,
    inputs: str | os.PathLike[str] | None = None,
    verify_inputs: str | os.PathLike[str] | None = None,
    static_shapes: bool = False,
    layout: Sequence[str] = (),
    allow_interface_change: bool = False,
    session_search: bool = True,
    max_threads: int | None = None,
    runtimes: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Search for the fastest verified variant of the model file ``model`` on the runtime
    (``opfuse tune``) and write it to ``output``, with the fusion switch file that rebuilds
    it (``switch_file_out``, default ``OUTPUT.fusion_switch.cfg``) and, if asked, the
    ``report`` of every trial (JSON). Returns the ``TuneResult``: ``best`` (the variant
    written), ``ratio`` (its latency over the original's), ``trials``, ``command``.

    ``settings`` (a ``TuneSettings``) or its keywords (``budget``, ``rtol``, ``atol``,
    ``input_shape``, ``inputs``, ``static_shapes``, ``layout``, ``allow_interface_change``,
    ``session_search``, ``max_threads``, ``runtimes``) say what is searched (``inputs``,
    older name ``verify_inputs``: an .npz of the input arrays verified and timed on, else
    generated; ``result.inputs`` names them); ``runtime_settings`` (a ``RuntimeSettings``)
    or its keywords (``runtime``, ``provider``, ``threads``, ``graph_opt``,
    ``bench_seconds``) what it is measured on; both together are refused. A bad value is
    a ``SettingsError`` naming the keyword (``budget=0: must be more than 0``).

    The model's interface is the caller's: variants that change its inputs are tried only
    when asked (``layout``, ``static_shapes`` with ``input_shape``, or
    ``allow_interface_change``); ``result.interface_changed`` says how the written model's
    inputs/outputs differ. Then (``session_search``) the session settings are searched on
    that model (threads up to ``max_threads``, execution mode, graph optimization level,
    the ``runtimes``: ``result.session``); ``OUTPUT.session.json`` records the graph and
    session settings, for ``InferenceSession(output or the original, session_file=)``.
    ``progress`` is told each trial's name as it starts (``opfuse.tuning.conductor``)."""
    return conductor.tune_file(
        model,
        conductor.TuneOutputs.beside(output, switch_file_out, report),
        _given(
            settings,
            TuneSettings,
            budget=budget,
            rtol=rtol,
            atol=atol,
            input_shape=input_shape,
            inputs=inputs,
            verify_inputs=verify_inputs,
            static_shapes=static_shapes,
            layout=layout,
            allow_interface_change=allow_interface_change,
            session_search=session_search,
            max_threads=max_threads,
            runtimes=runtimes,
        ),
        _given(
            runtime_settings,
            RuntimeSettings,
            runtime=runtime,
            provider=provider,
            threads=threads,
            graph_opt=graph_opt,
            bench_seconds=bench_seconds,
        ),
        progress,
    )


def quantize(
    model: str | os.PathLike[str] | onnx.ModelProto,
    output: str | os.PathLike[str] | None = None,
    *,
    calibration: str | os.PathLike[str] | Mapping[str, Any] | Iterable[Mapping[str, Any]],
    settings: QuantizeSettings | None = None,
    runtime_settings: RuntimeSettings | None = None,
    report: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    eval: str | os.PathLike[str] | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None = None,  # noqa: A002 - the CLI's --eval
    samples: int | None = None,
    preprocess: str | None = None,
    exclude: Sequence[str] = (),
    max_drop: str = "auto",
    recipe: str = "auto",
    fallback_tries: int = FALLBACK_TRIES,
    target_opset: int | None = None,
    min_speedup: float | None = None,
    benchmark: bool = True,
    write_slower: bool = False,
    calibrate_method: str = "minmax",
    per_channel: bool = True,
    activation_type: str = "uint8",
    fusion_switch_file: str | os.PathLike[str] | None = None,
    enable: Sequence[str] = (),
    disable: Sequence[str] = (),
    metric: Callable[[list[dict[str, Any]]], float] | None = None,
    fallback_seconds: float | None = None,
) -> QuantizeResult:
    """``opfuse quantize``: fuse ``model`` (a path or an ``onnx.ModelProto``), int8 (QDQ)
    calibrated on ``calibration``, the ``recipe`` chosen, accuracy against the float model
    on ``eval`` (else every 4th calibration sample) gated by ``max_drop``, the speed.

    ``settings`` (a ``QuantizeSettings``) or its keywords (``eval`` to ``disable``) say what
    is done (``metric``: your task's figure of one model's outputs, higher is better, both
    models' gated by ``drop=``), ``runtime_settings`` what the speed is measured on; both
    an object and its keywords are refused (``SettingsError``). ``calibration``/``eval``:
    a path (``.npz``, folders), ``"random"``, a mapping of input name -> N samples on
    axis 0, or an iterable of feeds. ``fallback_seconds``: deprecated (0: no fallback).

    Returns a ``QuantizeResult`` (``.model``: the int8 ModelProto). ``GateError`` (nothing
    written; ``exc.report``: the figures and the command that writes the best model anyway)
    when the gate or ``min_speedup`` fails. Steps: ``opfuse.quantization.conductor``."""
    from opfuse.quantization.conductor import quantize_file

    _check_types(model, output, {"samples": samples, "target_opset": target_opset})
    _check_texts({"max_drop": max_drop, "recipe": recipe, "preprocess": preprocess}, exclude)
    fallback_tries = _fallback_tries(fallback_tries, fallback_seconds)
    chosen = _given(
        settings,
        QuantizeSettings,
        eval=eval,
        samples=samples,
        preprocess=preprocess,
        exclude=tuple(exclude),
        max_drop=max_drop,
        recipe=recipe,
        fallback_tries=fallback_tries,
        target_opset=target_opset,
        min_speedup=min_speedup,
        benchmark=benchmark,
        write_slower=write_slower,
        calibrate_method=calibrate_method,
        per_channel=per_channel,
        activation_type=activation_type,
        fusion_switch_file=fusion_switch_file,
        enable=tuple(enable),
        disable=tuple(disable),
        metric=metric,
    )
    return quantize_file(
        model,
        output,
        calibration,
        chosen,
        runtime=runtime_settings,
        report=report,
        progress=progress,
    )


def _fallback_tries(tries: int, seconds: float | None) -> int:
    """``fallback_seconds`` (deprecated: the fallback counts tries, so that a busy machine
    writes the same model): 0 turns the fallback off, another value is ignored."""
    if seconds is None:
        return tries
    warnings.warn(
        "fallback_seconds is deprecated: the fallback is bounded by fallback_tries (a "
        "count: the same model on an idle or a busy machine)",
        DeprecationWarning,
        stacklevel=3,
    )
    return tries if seconds > 0 else 0


def _check_types(model: object, output: object, counts: Mapping[str, object]) -> None:
    """``quantize``'s arguments of the wrong type: a one-line OpfuseError naming them."""
    if not isinstance(model, str | os.PathLike | onnx.ModelProto):
        raise OpfuseError(
            f"model: expected a path or an onnx.ModelProto, got {type(model).__name__}"
        )
    if output is not None and not isinstance(output, str | os.PathLike):
        raise OpfuseError(f"output: expected a path or None, got {type(output).__name__}")
    for label, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise OpfuseError(f"{label}: expected an int, got {type(value).__name__}")


def _check_texts(texts: Mapping[str, object], exclude: object) -> None:
    """``quantize``'s texts (and ``exclude``, names) of the wrong type."""
    for label, text in texts.items():
        if text is not None and not isinstance(text, str):
            raise OpfuseError(f"{label}: expected a string, got {type(text).__name__}")
    if isinstance(exclude, str) or not (
        isinstance(exclude, Iterable) and all(isinstance(e, str) for e in exclude)
    ):
        raise OpfuseError("exclude: expected a list of op types or node names")


PROTOBUF_LIMIT = 2**31 - 1


class InferenceSession(ort.InferenceSession):
    """A drop-in for ``onnxruntime.InferenceSession`` that runs the opfuse-optimized model.

    ``path_or_model``: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model`` (or the
    serialized bytes onnxruntime takes). ``sess_options``, ``providers`` and
    ``provider_options`` go to onnxruntime unchanged; other keywords are
    ``opfuse.optimize``'s (verification is on by default: the session is built only on
    a model that verified). ``optimize_result`` tells what was done.

    ``session_file``: the ``OUTPUT.session.json`` ``opfuse tune`` wrote. Its threads,
    execution mode, graph optimization level and provider make the SessionOptions (give
    it instead of ``sess_options``). Its graph settings decide the model: the tuned model
    itself (the file it names, by its SHA-256) runs as written, not optimized again; any
    other model (the original) is rebuilt with the passes, target opset, layout and static
    shapes tune chose (optimize keywords that contradict them are refused), or run as is
    when tune kept the original. ``deployed`` says which of the three happened.
    """

    def __init__(
        self,
        path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto | ir.Model,
        sess_options: ort.SessionOptions | None = None,
        providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        *,
        session_file: str | os.PathLike[str] | None = None,
        **optimize_options: Unpack[OptimizeKeywords],
    ) -> None:
        if optimize_options.get("output") is not None:
            raise OpfuseError("InferenceSession optimizes in memory; it takes no output")
        self.deployed = "optimized"
        keywords: dict[str, Any] = dict(optimize_options)
        if session_file is not None:
            if sess_options is not None:
                raise OpfuseError(
                    f"{session_file}: give the session file or sess_options, not both"
                )
            deployment = read_deployment(session_file)
            self.session_settings = deployment.session
            sess_options, file_providers = ort_session_options(self.session_settings)
            providers = providers or file_providers
            if deployment.graph is not None:
                if deployment.graph.original or _is_tuned(path_or_model, deployment):
                    self.deployed = "as written"
                    _refuse_graph_keywords(keywords, session_file)  # nothing is optimized
                else:
                    self.deployed = "rebuilt"
                    keywords = _tuned_keywords(deployment.graph, keywords, session_file)
        self._optimize_result: OptimizeResult[Any] | None = None
        if self.deployed == "as written":
            if isinstance(path_or_model, str | os.PathLike | bytes):
                model_arg: Any = (
                    str(path_or_model) if not isinstance(path_or_model, bytes) else path_or_model
                )
            else:
                proto = (
                    path_or_model
                    if isinstance(path_or_model, onnx.ModelProto)
                    else io.to_proto(path_or_model)
                )
                model_arg = proto.SerializeToString()
            super().__init__(model_arg, sess_options, providers, provider_options)
            return
        model = (
            onnx.load_model_from_string(path_or_model)
            if isinstance(path_or_model, bytes)
            else path_or_model
        )
        result = optimize(model, **keywords)
        self._optimize_result = result
        optimized = result.model
        proto = optimized if isinstance(optimized, onnx.ModelProto) else io.to_proto(optimized)
        if proto.ByteSize() > PROTOBUF_LIMIT:
            raise OpfuseError(
                "the optimized model is over 2 GB: write it with opfuse.optimize(..., output=) "
                "and load that file in onnxruntime"
            )
        super().__init__(proto.SerializeToString(), sess_options, providers, provider_options)

    @property
    def optimize_result(self) -> OptimizeResult[Any]:
        """What was done to the model; an OpfuseError when the session file made the
        session run the model as written (``deployed == "as written"``)."""
        if self._optimize_result is None:
            raise OpfuseError(
                "the session runs the model as written (the tuned model of its session file): "
                "nothing was optimized"
            )
        return self._optimize_result


def _is_tuned(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto | ir.Model, deployment: Deployment
) -> bool:
    """Whether ``model`` is the tuned model the deployment file names (by SHA-256)."""
    if deployment.model_sha256 is None:
        return False
    if isinstance(model, bytes):
        digest = sha256_bytes(model)
    elif isinstance(model, onnx.ModelProto | ir.Model):
        proto = model if isinstance(model, onnx.ModelProto) else io.to_proto(model)
        digest = sha256_bytes(proto.SerializeToString())
    else:
        try:
            digest = sha256_file(model)
        except OSError:
            return False  # optimize says what is wrong with the path
    return digest == deployment.model_sha256


def _refuse_graph_keywords(given: dict[str, Any], where: str | os.PathLike[str]) -> None:
    """The session file decides the graph (the tuned model as written, or rebuilt with its
    settings): optimize keywords that would change it are refused, not ignored."""
    for key in (
        "enable",
        "disable",
        "target_opset",
        "layout",
        "static_shapes",
        "fusion_switch_file",
        "optimize_settings",
    ):
        if key in given and given[key] not in (None, (), [], False, "keep"):
            raise OpfuseError(
                f"{where}: the session file sets the graph settings; drop {key}= (or give "
                "sess_options instead of the session file)"
            )


def _tuned_keywords(
    graph: GraphSettings, given: dict[str, Any], where: str | os.PathLike[str]
) -> dict[str, Any]:
    """The optimize keywords that rebuild the tuned model; the caller's own may add to
    them (verify, tolerances, input shapes) but not contradict them."""
    tuned = graph.optimize_keywords()
    _refuse_graph_keywords(given, where)
    if "input_shape" in tuned and given.get("input_shape"):
        raise OpfuseError(
            f"{where}: the tuned model has static input shapes {tuned['input_shape']}; drop "
            "input_shape="
        )
    return {**given, **tuned}


# The engine's entry points that lived in ``opfuse.api`` before the API moved here.
_MOVED_TO_PIPELINE = (
    "op_counts",
    "timings_text",
    "verification_text",
    "default_opset",
    "convert_opset",
    "select_passes",
    "optimize_model",
    "optimize_file",
    "save_inputs",
    "write_fusion_result",
    "MAX_ROUNDS",
)


def __getattr__(name: str) -> Any:
    """``opfuse.api.optimize_file`` and the other old names: moved to opfuse.pipeline.conductor."""
    if name in _MOVED_TO_PIPELINE:
        from opfuse.pipeline import conductor as run

        warnings.warn(
            f"opfuse.api.{name} moved to opfuse.pipeline.conductor.{name}; the old path goes in the "
            "next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(run, name)
    raise AttributeError(f"module 'opfuse.api' has no attribute {name!r}")
