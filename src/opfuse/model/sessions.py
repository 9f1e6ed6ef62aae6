"""The one place opfuse opens an onnxruntime session: ``open_session``.

Every session the package opens (the verifier's, the runtime's measurement, the graph
onnxruntime saves after its fusions, the advisor's profile, the quantizer's statistics,
the engine's constant evaluation) goes through it, so the log level, the providers and
the one-line error are set here once:

- the session logs at FATAL only (``log_level`` 4): a model onnxruntime refuses is reported
  once, as the one-line error below, not after a log line of onnxruntime's own; and
  onnxruntime's default logger (the sessions of its quantizer, subgraph resolution) at
  errors only (``quiet``, applied when this module is imported);
- a model onnxruntime refuses is a ``SessionError`` (an ``OpfuseError``: bad input, exit
  status 2) that reads ``NAME: onnxruntime cannot load the model: FIRST LINE``; a model
  opfuse built itself (``errors="onnxruntime"``) lets onnxruntime's exception through: its
  refusal is an internal failure (exit status 3), or the caller words it itself.

It lives in ``model`` (below the engine) because three layers open sessions: ``runtime``
and ``verification``, which may not import each other, and the engine's constant
evaluation (``rewrite.evaluate``), which may import neither. The rules may not import it
(they evaluate constants through ``rewrite.evaluate``; the import-linter contract says so).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

import onnx
import onnxruntime as ort

from opfuse.errors import OpfuseError, first_line

CPU = "CPUExecutionProvider"
# graph optimization levels by the names the options use (``disable``: the advisor's name)
LEVELS = {
    "off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
LOG_LEVEL = 4  # FATAL: a refusal is reported once, as the one-line error

ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto


class SessionError(OpfuseError):
    """onnxruntime refused a model: ``detail`` is the first line of its message."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def quiet() -> None:
    """onnxruntime's default logger at errors only: the sessions opfuse makes set their
    own severity, but subgraph resolution and the sessions of onnxruntime's quantizer log
    through the default one (warnings about initializers they drop)."""
    ort.set_default_logger_severity(3)


quiet()


def session_options(
    graph_opt: str = "all",
    threads: int = 1,
    execution_mode: str = "sequential",
    inter_threads: int = 1,
) -> ort.SessionOptions:
    """The measured settings as onnxruntime ``SessionOptions`` (log level 3): what
    ``opfuse.InferenceSession(session_file=)`` gives the user's own session."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[graph_opt]
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = inter_threads
    opts.execution_mode = MODES[execution_mode]
    opts.log_severity_level = 3
    return opts


def open_session(
    model: ModelSource,
    *,
    provider: str | Sequence[str] | None = None,
    cpu_fallback: bool = False,
    threads: int = 1,
    inter_threads: int | None = None,
    execution_mode: str | None = None,
    graph_opt: str = "all",
    log_level: int = LOG_LEVEL,
    profile_prefix: str | os.PathLike[str] | None = None,
    optimized_path: str | os.PathLike[str] | None = None,
    name: str | os.PathLike[str] | None = None,
    errors: Literal["opfuse", "onnxruntime"] = "opfuse",
) -> ort.InferenceSession:
    """An onnxruntime session on ``model`` (a path, serialized bytes or a ``ModelProto``,
    serialized once here).

    ``provider``: one execution provider or a list (default CPU); ``cpu_fallback`` adds
    CPU after one that is not CPU. ``threads``: intra-op threads (0: onnxruntime's
    default); ``inter_threads`` and ``execution_mode`` (``sequential``/``parallel``) are
    left at onnxruntime's defaults when None. ``graph_opt``: ``off`` (or ``disable``),
    ``basic``, ``extended`` or ``all``. ``profile_prefix``: profiling on, its file there;
    ``optimized_path``: onnxruntime saves the graph it runs there.

    A refusal: ``SessionError`` naming ``name`` (default: the path; nothing for a model in
    memory; ``""``: nothing), or with ``errors="onnxruntime"`` onnxruntime's own exception."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[graph_opt]
    opts.intra_op_num_threads = threads
    if inter_threads is not None:
        opts.inter_op_num_threads = inter_threads
    if execution_mode is not None:
        opts.execution_mode = MODES[execution_mode]
    opts.log_severity_level = log_level
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(profile_prefix)
    if optimized_path is not None:
        opts.optimized_model_filepath = str(optimized_path)
    providers = [provider or CPU] if isinstance(provider, str | None) else list(provider)
    if cpu_fallback and CPU not in providers:
        providers.append(CPU)
    if isinstance(model, onnx.ModelProto):
        source: str | bytes = model.SerializeToString()
    elif isinstance(model, bytes):
        source = model
    else:
        source = str(model)
    try:
        return ort.InferenceSession(source, opts, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types
        if errors == "onnxruntime":
            raise
        detail = first_line(exc)
        shown = str(source) if name is None and isinstance(source, str) else str(name or "")
        if isinstance(source, str) and shown:  # onnxruntime names the file it loaded
            detail = detail.replace(source, shown)
        message = f"onnxruntime cannot load the model: {detail}"
        raise SessionError(f"{shown}: {message}" if shown else message, detail) from None
