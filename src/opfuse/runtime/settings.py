"""The runtime a measurement runs on, as the command line and the API name it (runtime,
provider, threads, graph optimization level, seconds per comparison)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opfuse.errors import OpfuseError, SettingsError
from opfuse.runtime import Runtime, get_runtime


@dataclass(frozen=True)
class RuntimeSettings:
    """The runtime a measurement runs on: ``runtime`` (onnxruntime or openvino), the
    onnxruntime execution ``provider``, intra-op ``threads`` (0: the runtime's),
    onnxruntime's graph optimization level ``graph_opt``, and ``bench_seconds`` of
    measuring per comparison; checked when made (a ``SettingsError`` names the field)."""

    runtime: str = "onnxruntime"
    provider: str | None = None
    threads: int = 1
    graph_opt: str = "all"
    bench_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.bench_seconds <= 0:
            raise SettingsError("bench_seconds", float(self.bench_seconds), "must be more than 0")

    def make(self) -> Runtime:
        """The runtime (an unknown runtime or provider is an ``OpfuseError``)."""
        return get_runtime(
            self.runtime, provider=self.provider, threads=self.threads, graph_opt=self.graph_opt
        )


SESSION_SCHEMA = "opfuse.session/2"  # /1 held the session settings alone; both are read
READ_SCHEMAS = ("opfuse.session/1", SESSION_SCHEMA)
EXECUTION_MODES = ("sequential", "parallel")


@dataclass(frozen=True)
class SessionSettings:
    """The session settings ``opfuse tune`` chooses and writes as ``OUTPUT.session.json``
    (onnxruntime's SessionOptions names; ``runtime`` may be ``openvino``)."""

    runtime: str = "onnxruntime"
    provider: str | None = None
    intra_op_num_threads: int = 1
    inter_op_num_threads: int = 1
    execution_mode: str = "sequential"
    graph_optimization_level: str = "all"

    @property
    def label(self) -> str:
        n = self.intra_op_num_threads
        threads = "default threads" if n == 0 else f"{n} thread{'' if n == 1 else 's'}"
        if self.runtime != "onnxruntime":
            return f"{self.runtime}, {threads}"
        mode = (
            f", parallel x{self.inter_op_num_threads}" if self.execution_mode == "parallel" else ""
        )
        return f"{threads}{mode}, level {self.graph_optimization_level}"

    def make(self) -> Runtime:
        """The runtime measuring with these settings."""
        return get_runtime(
            self.runtime,
            provider=self.provider,
            threads=self.intra_op_num_threads,
            graph_opt=self.graph_optimization_level,
            execution_mode=self.execution_mode,
            inter_threads=self.inter_op_num_threads,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "schema": SESSION_SCHEMA,
            "runtime": self.runtime,
            "provider": self.provider or "CPUExecutionProvider"
            if self.runtime == "onnxruntime"
            else self.provider,
            "intra_op_num_threads": self.intra_op_num_threads,
            "inter_op_num_threads": self.inter_op_num_threads,
            "execution_mode": self.execution_mode,
            "graph_optimization_level": self.graph_optimization_level,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> SessionSettings:
        """Read the settings a session file holds; one-line OpfuseError naming ``where``."""
        if not isinstance(data, dict) or data.get("schema") not in READ_SCHEMAS:
            raise OpfuseError(f"{where}: not an opfuse session file (schema {SESSION_SCHEMA})")
        kwargs: dict[str, Any] = {}  # JSON values: the constructor and check() judge them
        for field in dataclasses.fields(cls):
            if field.name in data:
                kwargs[field.name] = data[field.name]
        try:
            settings = cls(**kwargs)
        except TypeError as exc:
            raise OpfuseError(f"{where}: {exc}") from None
        settings.check(where)
        return settings

    def check(self, where: str) -> None:
        from opfuse.runtime import GRAPH_OPT_LEVELS, RUNTIMES

        problems = []
        if self.runtime not in RUNTIMES:
            problems.append(f"runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        for name in ("intra_op_num_threads", "inter_op_num_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} {value!r} is not a count of threads")
        if self.execution_mode not in EXECUTION_MODES:
            problems.append(
                f"execution_mode {self.execution_mode!r} is not one of {EXECUTION_MODES}"
            )
        if self.graph_optimization_level not in GRAPH_OPT_LEVELS:
            problems.append(
                f"graph_optimization_level {self.graph_optimization_level!r} is not one of "
                f"{', '.join(GRAPH_OPT_LEVELS)}"
            )
        if problems:
            raise OpfuseError(f"{where}: {'; '.join(problems)}")


def read_session_json(path: str | os.PathLike[str]) -> dict[str, object]:
    """The JSON of a session file; a one-line OpfuseError when it cannot be read or parsed."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise OpfuseError(f"{path}: cannot read the session file: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OpfuseError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise OpfuseError(f"{path}: not an opfuse session file (schema {SESSION_SCHEMA})")
    return data


def read_session_file(path: str | os.PathLike[str]) -> SessionSettings:
    """The settings of an ``OUTPUT.session.json`` that ``opfuse tune`` wrote."""
    return SessionSettings.from_json(read_session_json(path), str(path))


def ort_session_options(settings: SessionSettings) -> tuple[object, list[str]]:
    """onnxruntime ``SessionOptions`` and providers applying ``settings``. A session file
    that chose OpenVINO runs through onnxruntime's OpenVINOExecutionProvider when this
    onnxruntime has it; otherwise an OpfuseError says how to run it."""
    import onnxruntime as ort

    from opfuse.model.sessions import session_options

    opts = session_options(
        settings.graph_optimization_level,
        settings.intra_op_num_threads,
        settings.execution_mode,
        settings.inter_op_num_threads,
    )
    if settings.runtime == "openvino":
        if "OpenVINOExecutionProvider" not in ort.get_available_providers():
            raise OpfuseError(
                "the session file chose OpenVINO, which this onnxruntime cannot run: install "
                "onnxruntime-openvino, or run the model with openvino.Core().compile_model(path, "
                f"'CPU', {{'INFERENCE_NUM_THREADS': {settings.intra_op_num_threads}}})"
            )
        return opts, ["OpenVINOExecutionProvider"]
    return opts, [settings.provider or "CPUExecutionProvider"]
