"""onnxruntime with any installed execution provider (CPU by default)."""

from __future__ import annotations

import os
import time

import numpy as np
import onnxruntime as ort

from opfuse.errors import OpfuseError, first_line
from opfuse.runtime import GRAPH_OPT_LEVELS

LEVELS = {
    "off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}


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
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[graph_opt]
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = inter_threads
    opts.execution_mode = MODES[execution_mode]
    opts.log_severity_level = 3
    return opts


class OrtSession:
    def __init__(self, sess: ort.InferenceSession) -> None:
        self.sess = sess

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        return self.sess.run(None, feeds)


class OrtRuntime:
    name = "onnxruntime"
    version = ort.__version__
    clock = staticmethod(time.perf_counter)

    def __init__(
        self,
        provider: str | None = None,
        threads: int = 1,
        graph_opt: str = "all",
        execution_mode: str = "sequential",
        inter_threads: int = 1,
    ):
        available = ort.get_available_providers()
        provider = provider or "CPUExecutionProvider"
        if provider not in available:
            raise OpfuseError(
                f"--provider {provider}: not available in this onnxruntime ({', '.join(available)})"
            )
        if graph_opt not in GRAPH_OPT_LEVELS:
            raise OpfuseError(
                f"--graph-opt {graph_opt!r}: expected one of {', '.join(GRAPH_OPT_LEVELS)}"
            )
        self.provider = provider
        self.threads = threads
        self.graph_opt = graph_opt
        self.execution_mode = execution_mode
        self.inter_threads = inter_threads

    def load(self, path: str | os.PathLike[str]) -> OrtSession:
        opts = session_options(
            self.graph_opt, self.threads, self.execution_mode, self.inter_threads
        )
        try:
            sess = ort.InferenceSession(str(path), opts, providers=[self.provider])
        except Exception as exc:  # onnxruntime raises its own exception types
            first = first_line(exc)
            raise OpfuseError(f"{path}: onnxruntime cannot load the model: {first}") from None
        return OrtSession(sess)

    def describe(self) -> str:
        level = str(LEVELS[self.graph_opt]).rsplit(".", 1)[-1]
        threads = "default threads" if self.threads == 0 else _plural(self.threads, "thread")
        mode = (
            f", parallel ({_plural(self.inter_threads, 'inter-op thread')})"
            if self.execution_mode == "parallel"
            else ""
        )
        return f"onnxruntime {self.version} {self.provider}, {level}, {threads}{mode}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
