"""The runtime a measurement runs on, as the command line and the API name it (runtime,
provider, threads, graph optimization level, seconds per comparison)."""

from __future__ import annotations

from dataclasses import dataclass

from opfuse.errors import OpfuseError
from opfuse.runtime import Runtime, get_runtime


@dataclass(frozen=True)
class RuntimeSettings:
    runtime: str = "onnxruntime"
    provider: str | None = None
    threads: int = 1
    graph_opt: str = "all"
    bench_seconds: float = 5.0

    def make(self) -> Runtime:
        if self.bench_seconds <= 0:
            raise OpfuseError(f"--bench-seconds {self.bench_seconds:g}: must be more than 0")
        return get_runtime(
            self.runtime, provider=self.provider, threads=self.threads, graph_opt=self.graph_opt
        )
