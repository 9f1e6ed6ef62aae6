"""The runtime options shared by ``optimize --benchmark`` and ``opfuse tune``, the
benchmark's summary lines, and the ``opfuse tune`` command (registered in opfuse.cli)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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


def opset_hints(model) -> list[str]:  # type: ignore[no-untyped-def]
    """``GeluFusionPass would fire at a higher opset: 18 matches at --target-opset 20``"""
    from opfuse.variants import opset_upgrades

    return [
        f"{name} would fire at a higher opset: {n} match{'' if n == 1 else 'es'} at --target-opset {opset}"
        for name, (opset, n) in opset_upgrades(model).items()
    ]


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


def _check_outputs(model: Path, paths: list[tuple[str, Path | None]]) -> None:
    """Every output writable, none the input nor another output."""
    from opfuse.io import check_output_path

    given = [(flag, p) for flag, p in paths if p is not None]
    for i, (_flag, path) in enumerate(given):
        others: list[str | os.PathLike[str]] = [model, *(p for _, p in given[:i])]
        labels = ["input model"] + [f"{f} path" for f, _ in given[:i]]
        check_output_path(path, others, labels)


@click.command()
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the result.")
@click.option(
    "--switch-file-out",
    type=PathArg,
    help="Where to write the fusion switch file [default: OUTPUT.fusion_switch.cfg].",
)
@click.option("--report", type=PathArg, help="Write every trial as JSON here.")
@click.option(
    "--budget", default=120.0, show_default=True, help="Seconds of search (trials in progress end)."
)
@runtime_options
@click.option("--rtol", default=1e-4, show_default=True, help="Relative tolerance.")
@click.option("--atol", default=1e-5, show_default=True, help="Absolute tolerance (scaled).")
@click.option("--input-shape", multiple=True, help="Dims for dynamic inputs: NAME:1,3,224,224.")
@click.option("--verify-inputs", type=PathArg, help=".npz of inputs (verification and timing).")
def tune(
    model: Path,
    output: Path,
    switch_file_out: Path | None,
    report: Path | None,
    budget: float,
    rtol: float,
    atol: float,
    input_shape: tuple[str, ...],
    verify_inputs: Path | None,
    **runtime: object,
) -> None:
    """Search for the fastest verified variant of MODEL on the runtime and write it to
    OUTPUT, with the fusion switch file and the optimize command line that rebuild it."""
    from opfuse import tune as tuning
    from opfuse.io import read_proto
    from opfuse.verify import check_feeds, parse_input_shapes

    settings = settings_from(runtime)
    if budget <= 0:
        raise OpfuseError(f"--budget {budget:g}: must be more than 0")
    if verify_inputs is not None and input_shape:
        raise OpfuseError(
            f"--input-shape and --verify-inputs {verify_inputs} both give the input shapes "
            "(the .npz arrays' shapes are used); drop --input-shape"
        )
    switch_file = switch_file_out or output.with_name(output.name + ".fusion_switch.cfg")
    _check_outputs(
        model, [("-o", output), ("--switch-file-out", switch_file), ("--report", report)]
    )
    read_proto(model)
    shapes = parse_input_shapes(list(input_shape))
    if shapes or verify_inputs is not None:
        check_feeds(model, shapes, verify_inputs)
    rt = settings.make()
    tune_settings = tuning.TuneSettings(
        budget_s=budget,
        bench_seconds=settings.bench_seconds,
        input_shapes=shapes,
        inputs_npz=verify_inputs,
        rtol=rtol,
        atol=atol,
    )
    with _trial_progress(budget) as step:
        written: dict[str, str] = {}
        result = tuning.tune(
            model,
            rt,
            tune_settings,
            progress=step,
            workdir=output.parent,
            keep=lambda found, built: written.update(
                command=tuning.write_outputs(found, built, model, output, switch_file, report)
            ),
        )
    _print_tune(result, written.get("command", ""), switch_file)


@contextmanager
def _trial_progress(budget: float) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr over the budget; step(what) names the trial under way."""
    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("tune", total=budget)
        start = time.monotonic()

        def step(what: str) -> None:
            bar.update(task, description=f"trial: {what}", completed=time.monotonic() - start)

        yield step


def _pct(x: float | None) -> str:
    return "" if x is None else f"+-{x:.1%}"


def _print_tune(result, command: str, switch_file: Path) -> None:  # type: ignore[no-untyped-def]
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
    table = Table(title=f"tune on {result.runtime}", title_justify="left")
    for col in ("#", "settings", "nodes", "verification", "latency", "noise", "kept", "note"):
        table.add_column(col, justify="right" if col in ("#", "nodes", "latency") else "left")
    for i, t in enumerate(result.trials):
        ratio = "" if t.ratio is None else f"{t.ratio:.3f}x"
        kept = "yes" if t.kept else ""
        table.add_row(
            str(i),
            t.variant.label,
            str(t.nodes),
            t.verification,
            ratio,
            _pct(t.noise),
            kept,
            t.note,
        )
    out.print(table)
    if result.budget_spent:
        out.print("the budget ran out before every flip was tried")
    for name, (opset, n) in result.probe.upgrades.items():
        out.print(
            f"note: {name} would fire at a higher opset: {n} match{'' if n == 1 else 'es'} at --target-opset {opset}",
            markup=False,
        )
    if result.final is not None:
        out.print(
            f"best variant: {result.searched.label}: {result.final.line('best')}",
            markup=False,
            soft_wrap=True,
        )
    if result.best.original:
        out.print(
            "nothing beat the original beyond the noise: the output is the original unchanged",
            markup=False,
        )
    elif not result.beat_original:
        out.print(
            "nothing beat the original beyond the noise: the output is the variant measured "
            "fastest",
            markup=False,
        )
    out.print(f"switch file: {switch_file}", markup=False)
    out.print(f"rebuild: {command}", markup=False, soft_wrap=True)
