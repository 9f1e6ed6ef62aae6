"""The ``opfuse profile`` and ``opfuse advise`` commands (registered in opfuse.cli)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from opfuse.advisor.profile_readers import GRAPH_OPT_LEVELS
from opfuse.cli.console import console, err, recorder
from opfuse.errors import EXIT_STATUSES

PathArg = click.Path(path_type=Path)


@contextmanager
def _progress() -> Iterator:  # type: ignore[type-arg]
    """A rich progress bar on stderr (on a terminal only); step(what, done, total)
    advances it, step(what) shows a phase without a count (loading, mapping kernels).
    A new phase hides the phases before it."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        tasks: dict[str, object] = {}

        def step(what: str, done: int = 0, total: int | None = None) -> None:
            if what not in tasks:
                for task in tasks.values():
                    bar.update(task, visible=False)  # type: ignore[arg-type]
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)  # type: ignore[arg-type]

        yield step


def _write(output: Path, text: str, inputs: dict[str, Path | None]) -> None:
    """Atomically (a temporary file beside it, renamed), never over an input."""
    from opfuse.model.io import write_text

    given = {k: v for k, v in inputs.items() if v is not None}
    write_text(output, text, inputs=list(given.values()), labels=list(given))


def _shapes(specs: tuple[str, ...]) -> dict[str, list[int]]:
    from opfuse.verification.compare import parse_input_shapes

    return parse_input_shapes(list(specs))


@click.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg)
@click.option("--runs", default=10, show_default=True, help="Profiled inference runs.")
@click.option("--warmup", default=2, show_default=True, help="Runs dropped before profiling.")
@click.option("--threads", default=0, show_default=True, help="Intra-op threads (0: default).")
@click.option(
    "--provider",
    default="CPUExecutionProvider",
    show_default=True,
    help="onnxruntime execution provider.",
)
@click.option(
    "--graph-opt",
    type=click.Choice(GRAPH_OPT_LEVELS),
    default="all",
    show_default=True,
    help="onnxruntime graph optimization level while profiling.",
)
@click.option("--input-shape", multiple=True, help="Dims for dynamic inputs: NAME:1,3,224,224.")
@click.option("--top", default=20, show_default=True, help="Slow nodes to list.")
@click.option("-o", "--output", type=PathArg, help="Write onnxruntime's profile JSON here.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Tables on the terminal, or the profile as JSON.",
)
def profile(
    model: Path,
    runs: int,
    warmup: int,
    threads: int,
    provider: str,
    graph_opt: str,
    input_shape: tuple[str, ...],
    top: int,
    output: Path | None,
    fmt: str,
) -> None:
    """Profile MODEL with onnxruntime: op statistics per op type and the slowest nodes."""
    from opfuse.advisor.profile_report import profile as profile_model

    with _progress() as step:
        report = profile_model(
            model,
            runs=runs,
            warmup=warmup,
            threads=threads,
            provider=provider,
            graph_opt=graph_opt,
            input_shapes=_shapes(input_shape),
            top=top,
            profile_out=output,
            step=step,
        )
    from opfuse.advisor.profile_report import render_profile

    out = console()
    if fmt == "json":
        out.print_json(json.dumps(report.to_json()))
        return
    render_profile(report, out, model.name, provider)
    if output is not None:
        out.print(f"profile written to {output}", markup=False)


@click.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg, required=False)
@click.option(
    "--profile",
    "profile_path",
    type=PathArg,
    help="An onnxruntime profile JSON of MODEL instead of profiling it.",
)
@click.option("--op-summary", type=PathArg, help="An Ascend msprof op_summary_*.csv.")
@click.option(
    "--target",
    help="ascend310, cpu, cuda or a target JSON file "
    "[default: cpu; cuda for CUDA; ascend310 with --op-summary].",
)
@click.option("--runs", default=10, show_default=True, help="Profiled inference runs.")
@click.option("--warmup", default=2, show_default=True, help="Runs dropped before profiling.")
@click.option("--threads", default=0, show_default=True, help="Intra-op threads (0: default).")
@click.option(
    "--provider",
    default="CPUExecutionProvider",
    show_default=True,
    help="onnxruntime execution provider.",
)
@click.option(
    "--graph-opt",
    type=click.Choice(GRAPH_OPT_LEVELS),
    default=None,
    help="onnxruntime optimization level while profiling [default: disable, a time per "
    "node; all for a quantized (QDQ) model, the graph onnxruntime deploys].",
)
@click.option("--input-shape", multiple=True, help="Dims for dynamic inputs: NAME:1,3,224,224.")
@click.option("--top", default=10, show_default=True, help="Entries per list in text and HTML.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
    help="The report as text, JSON (schema opfuse.advise/1) or a self-contained HTML page.",
)
@click.option("-o", "--output", type=PathArg, help="Write the report here.")
@click.option(
    "--no-onnxruntime-compare",
    is_flag=True,
    help="Do not check which groups onnxruntime fuses itself.",
)
@click.option(
    "--no-trial",
    is_flag=True,
    help="Skip Next steps' short trial of opfuse optimize commands on this machine.",
)
def advise(
    model: Path | None,
    profile_path: Path | None,
    op_summary: Path | None,
    target: str | None,
    runs: int,
    warmup: int,
    threads: int,
    provider: str,
    graph_opt: str | None,
    input_shape: tuple[str, ...],
    top: int,
    fmt: str,
    output: Path | None,
    no_onnxruntime_compare: bool,
    no_trial: bool,
) -> None:
    """Rank the operator groups of MODEL a backend could fuse (UB, first-layer AIPP, L2)."""
    from opfuse.advisor.advise import AdviseOptions
    from opfuse.advisor.advise import advise as run_advise
    from opfuse.advisor.render import render_html, render_text
    from opfuse.model.io import check_output_path

    inputs = {"input model": model, "profile": profile_path, "op summary": op_summary}
    if output is not None:  # before profiling: never over an input, a folder that exists
        given = {k: v for k, v in inputs.items() if v is not None}
        check_output_path(output, list(given.values()), list(given))
    options = AdviseOptions(
        target=target,
        runs=runs,
        warmup=warmup,
        threads=threads,
        provider=provider,
        graph_opt=graph_opt,
        input_shapes=_shapes(input_shape),
        top=top,
        compare_onnxruntime=not no_onnxruntime_compare,
        next_steps=not no_trial,
    )
    with _progress() as step:
        report = run_advise(
            model, profile_path=profile_path, op_summary=op_summary, options=options, step=step
        )
    if fmt == "json":
        text = json.dumps(report.to_json(), indent=2) + "\n"
        if output is None:
            click.echo(text, nl=False)
        else:
            _write(output, text, inputs)
        return
    if fmt == "html":
        page = render_html(report, top)
        if output is None:
            click.echo(page, nl=False)
        else:
            _write(output, page, inputs)
        return
    if output is None:
        render_text(report, console(), top)
        return
    written = recorder()
    render_text(report, written, top)
    _write(output, written.export_text(), inputs)
