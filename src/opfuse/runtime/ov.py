"""OpenVINO on CPU: the optional extra ``pip install opfuse[openvino]``."""

from __future__ import annotations

import os
import time
from typing import Protocol

import numpy as np

from opfuse.errors import OpfuseError, first_line


class _InferRequest(Protocol):
    def infer(self, inputs: dict[str, np.ndarray]) -> object: ...


class _CompiledModel(Protocol):
    """What a session needs of ``openvino.CompiledModel`` (openvino ships no stubs)."""

    def create_infer_request(self) -> _InferRequest: ...


class OpenVinoSession:
    def __init__(self, compiled: _CompiledModel, path: str | os.PathLike[str] = "") -> None:
        self.request = compiled.create_infer_request()
        self.path = path

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        try:
            return self.request.infer(feeds)
        except Exception as exc:  # OpenVINO raises RuntimeError with long texts
            shapes = ", ".join(f"{k} {list(getattr(v, 'shape', []))}" for k, v in feeds.items())
            raise OpfuseError(
                f"{self.path}: OpenVINO cannot run the model on inputs {shapes}: {first_line(exc)}"
            ) from None


# INFERENCE_PRECISION_HINT values: f32 always; bf16 where the CPU has AMX/AVX512-BF16 (then
# OpenVINO's default), f16 on some ARM CPUs
PRECISIONS = ("f32", "bf16", "f16")


class _PropertyReader(Protocol):
    def get_property(self, device: str, name: str) -> object: ...


def default_precision(core: _PropertyReader) -> str:
    """The float precision OpenVINO's CPU plugin runs a float model in by default on this
    CPU (bf16 where the CPU has AMX or AVX512-BF16, f32 otherwise)."""
    hint = str(core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
    return (
        hint.replace("<Type: '", "")
        .replace("'>", "")
        .replace("float32", "f32")
        .replace("bfloat16", "bf16")
        .replace("float16", "f16")
    )


class OpenVinoRuntime:
    name = "openvino"
    clock = staticmethod(time.perf_counter)

    def __init__(self, threads: int = 1, precision: str | None = None) -> None:
        """``precision``: INFERENCE_PRECISION_HINT for the float ops (None: OpenVINO's
        default on this CPU, see :func:`default_precision`)."""
        if precision is not None and precision not in PRECISIONS:
            raise OpfuseError(f"OpenVINO precision {precision!r}: one of {', '.join(PRECISIONS)}")
        try:
            import openvino
        except ImportError:
            raise OpfuseError(
                "--runtime openvino: OpenVINO is not installed (pip install 'opfuse[openvino]')"
            ) from None
        self.core = openvino.Core()
        self.version = openvino.__version__.split("-")[0]
        self.threads = threads
        self.precision = precision

    def load(self, path: str | os.PathLike[str]) -> OpenVinoSession:
        config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = self.threads
        if self.precision is not None:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        try:
            compiled = self.core.compile_model(str(path), "CPU", config)
        except Exception as exc:  # OpenVINO raises RuntimeError with long texts
            first = first_line(exc)
            raise OpfuseError(f"{path}: OpenVINO cannot load the model: {first}") from None
        return OpenVinoSession(compiled, path)

    def describe(self) -> str:
        threads = (
            "default threads"
            if self.threads == 0
            else f"{self.threads} thread" + ("" if self.threads == 1 else "s")
        )
        precision = (
            f"default precision ({default_precision(self.core)})"
            if self.precision is None
            else f"{self.precision} precision"
        )
        return f"openvino {self.version} CPU, {threads}, {precision}"
