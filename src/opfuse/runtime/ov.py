"""OpenVINO on CPU: the optional extra ``pip install opfuse[openvino]``."""

from __future__ import annotations

import os
import time

import numpy as np

from opfuse.errors import OpfuseError, first_line


class OpenVinoSession:
    def __init__(self, compiled, path: str | os.PathLike[str] = "") -> None:  # type: ignore[no-untyped-def]
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


class OpenVinoRuntime:
    name = "openvino"
    clock = staticmethod(time.perf_counter)

    def __init__(self, threads: int = 1) -> None:
        try:
            import openvino
        except ImportError:
            raise OpfuseError(
                "--runtime openvino: OpenVINO is not installed (pip install 'opfuse[openvino]')"
            ) from None
        self.core = openvino.Core()
        self.version = openvino.__version__.split("-")[0]
        self.threads = threads

    def load(self, path: str | os.PathLike[str]) -> OpenVinoSession:
        config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = self.threads
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
        return f"openvino {self.version} CPU, {threads}"
