"""Runtimes opfuse measures latency on: one small interface (load, run, name and version),
one module per runtime. onnxruntime is the default; OpenVINO is the optional extra
``opfuse[openvino]``; ``fake`` gives deterministic timings for unit tests. ``memory`` reads
a process's peak resident memory. Sessions are opened by ``opfuse.model.sessions``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import numpy as np

from opfuse.errors import OpfuseError

RUNTIMES = ("onnxruntime", "openvino")
GRAPH_OPT_LEVELS = ("off", "basic", "extended", "all")


class Session(Protocol):
    """One model loaded on a runtime."""

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        """One inference on ``feeds`` (input name -> array); the outputs are not compared."""
        ...


class Runtime(Protocol):
    """What measurement needs of a runtime."""

    name: str  # "onnxruntime", "openvino", ...
    version: str
    clock: Callable[[], float]  # seconds; time.perf_counter for a real runtime

    def load(self, path: str | os.PathLike[str]) -> Session:
        """Compile/load a model file; a model the runtime refuses is an OpfuseError."""
        ...

    def describe(self) -> str:
        """Name, version and settings, as every latency report states them."""
        ...


def get_runtime(
    name: str = "onnxruntime",
    *,
    provider: str | None = None,
    threads: int = 1,
    graph_opt: str = "all",
    execution_mode: str = "sequential",
    inter_threads: int = 1,
) -> Runtime:
    """The runtime called ``name`` with these settings (``--runtime``, ``--provider``,
    ``--threads``, ``--graph-opt``)."""
    if threads < 0:
        raise OpfuseError(f"--threads {threads}: must be 0 (the runtime's default) or more")
    if name == "onnxruntime":
        from opfuse.runtime.ort import OrtRuntime

        return OrtRuntime(
            provider=provider,
            threads=threads,
            graph_opt=graph_opt,
            execution_mode=execution_mode,
            inter_threads=inter_threads,
        )
    if name == "openvino":
        if provider not in (None, "CPU"):
            raise OpfuseError(f"--provider {provider}: the openvino runtime runs on CPU only")
        from opfuse.runtime.ov import OpenVinoRuntime

        return OpenVinoRuntime(threads=threads)
    raise OpfuseError(f"--runtime {name!r}: expected one of {', '.join(RUNTIMES)}")
