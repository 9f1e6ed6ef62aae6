"""The ``opfuse profile`` and ``opfuse advise`` commands (registered in opfuse.cli): the
profiling options of ``cli.options.profile_options`` into a ``ProfileSettings``, a call of
``opfuse.api.profile`` / ``opfuse.api.advise``, and the report rendered by the advisor's
renderers (advisor/profile_report.py, advisor/render.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from opfuse.cli.console import console, err, recorder
from opfuse.cli.options import PathArg, profile_options, profile_settings
from opfuse.errors import EXIT_STATUSES

if TYPE_CHECKING:
    from opfuse.advisor.report_types import AdviceReport

Step = Callable[..., None]  # step(what) a phase; step(what, done, total) a count


@contextmanager
def _progress() -> Iterator[Step]:
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
        tasks: dict[str, TaskID] = {}

        def step(what: str, done: int = 0, total: int | None = None) -> None:
            if what not in tasks:
                for task in tasks.values():
                    bar.update(task, visible=False)
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)

        yield step


def _write(output: Path, text: str, inputs: dict[str, Path | None]) -> None:
    """Atomically (a temporary file beside it, renamed), never over an input."""
    from opfuse.model.io import write_text

    given = {k: v for k, v in inputs.items() if v is not None}
    write_text(output, text, inputs=list(given.values()), labels=list(given))


@click.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg)
@profile_options("all", "onnxruntime graph optimization level while profiling.")
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
def profile(model: Path, top: int, output: Path | None, fmt: str, **profiling: object) -> None:
    """Profile MODEL with onnxruntime: op statistics per op type and the slowest nodes."""
    from opfuse import api
    from opfuse.advisor.profile_report import render_profile

    settings = profile_settings(profiling)
    with _progress() as step:
        report = api.profile(model, settings, top=top, profile_out=output, step=step)
    out = console()
    if fmt == "json":
        out.print_json(json.dumps(report.to_json()))
        return
    render_profile(report, out, model.name, settings.provider)
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
@profile_options(
    None,
    "onnxruntime optimization level while profiling [default: disable, a time per "
    "node; all for a quantized (QDQ) model, the graph onnxruntime deploys].",
)
@click.option("--top", default=10, show_default=True, help="Entries per list in text and HTML.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
    help="The report as text, JSON (schema opfuse.advise/2) or a self-contained HTML page.",
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
    top: int,
    fmt: str,
    output: Path | None,
    no_onnxruntime_compare: bool,
    no_trial: bool,
    **profiling: object,
) -> None:
    """Rank the operator groups of MODEL a backend could fuse (UB, first-layer AIPP, L2)."""
    from opfuse import api
    from opfuse.model.io import check_output_path

    inputs = {"input model": model, "profile": profile_path, "op summary": op_summary}
    if output is not None:  # before profiling: never over an input, a folder that exists
        given = {k: v for k, v in inputs.items() if v is not None}
        check_output_path(output, list(given.values()), list(given))
    options = api.AdviseOptions.of(
        profile_settings(profiling),
        target=target,
        top=top,
        compare_onnxruntime=not no_onnxruntime_compare,
        next_steps=not no_trial,
    )
    with _progress() as step:
        report = api.advise(
            model, profile_path=profile_path, op_summary=op_summary, options=options, step=step
        )
    _emit(report, fmt, top, output, inputs)


def _emit(
    report: AdviceReport, fmt: str, top: int, output: Path | None, inputs: dict[str, Path | None]
) -> None:
    """The report as the format asks, on stdout or written to ``output``."""
    from opfuse.advisor.render import render_html, render_text

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
