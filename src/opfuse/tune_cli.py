"""The runtime options shared by ``optimize --benchmark`` and ``opfuse tune``, the
benchmark's summary lines, and the ``opfuse tune`` command (registered in opfuse.cli)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from opfuse.errors import OpfuseError
from opfuse.runtime import GRAPH_OPT_LEVELS, RUNTIMES, Runtime, get_runtime

PathArg = click.Path(path_type=Path)
RUNTIME_OPTIONS = ("runtime", "provider", "threads", "graph_opt", "bench_seconds")


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


def runtime_options(f: Callable) -> Callable:
    """--runtime, --provider, --threads, --graph-opt, --bench-seconds (into ``runtime``)."""
    options = [
        click.option(
            "--runtime",
            type=click.Choice(RUNTIMES),
            default="onnxruntime",
            show_default=True,
            help="Runtime to measure on (openvino: pip install 'opfuse[openvino]').",
        ),
        click.option(
            "--provider", help="onnxruntime execution provider [default: CPUExecutionProvider]."
        ),
        click.option(
            "--threads", default=1, show_default=True, help="Intra-op threads (0: the runtime's)."
        ),
        click.option(
            "--graph-opt",
            type=click.Choice(GRAPH_OPT_LEVELS),
            default="all",
            show_default=True,
            help="onnxruntime's graph optimization level while measuring (all: what users run).",
        ),
        click.option(
            "--bench-seconds",
            default=5.0,
            show_default=True,
            help="Measuring time per comparison, after the warm-up.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def settings_from(kwargs: dict[str, object]) -> RuntimeSettings:
    """Pop the runtime options out of a command's keyword arguments."""
    return RuntimeSettings(**{k: kwargs.pop(k) for k in RUNTIME_OPTIONS})  # type: ignore[arg-type]


def refuse_without_benchmark(benchmark: bool) -> None:
    """Runtime options without --benchmark would be ignored: refuse them."""
    if benchmark:
        return
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in RUNTIME_OPTIONS
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        one = len(given) == 1
        raise OpfuseError(
            f"{', '.join(given)} only appl{'ies' if one else 'y'} with --benchmark; "
            f"add it or drop {'it' if one else 'them'}"
        )


def benchmark_lines(
    original: str | os.PathLike[str],
    output: str | os.PathLike[str],
    settings: RuntimeSettings,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(summary lines, warnings) of ``optimize --benchmark``: the latency line, and the
    fused kernels onnxruntime made from the original but not from the output."""
    from opfuse.measure import measure
    from opfuse.runtime.fused import lost_fusions, lost_text, runtime_kernels

    runtime = settings.make()
    found = measure(
        original,
        {"opfuse": output},
        runtime,
        seconds=settings.bench_seconds,
        input_shapes=input_shapes,
        inputs_npz=inputs_npz,
    )
    warnings = []
    provider = settings.provider or "CPUExecutionProvider"
    lost = lost_fusions(runtime_kernels(original, provider), runtime_kernels(output, provider))
    if lost:
        warnings.append(
            f"onnxruntime fuses fewer kernels from the output than from the original: "
            f"{lost_text(lost)}"
        )
    return [found.line("opfuse")], warnings
