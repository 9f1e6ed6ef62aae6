"""The ``opfuse profile`` and ``opfuse advise`` commands (registered in opfuse.cli)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opfuse.advisor.profile_readers import GRAPH_OPT_LEVELS
from opfuse.advisor.report import CAPTION, ORIGINAL, RUNS_NOTE, nodes_text
from opfuse.cli.console import console, text_width
from opfuse.errors import EXIT_STATUSES

PathArg = click.Path(path_type=Path)
NUMERIC = ("Count", "Total Time(us)", "Avg Time(us)", "Ratio(%)")


@contextmanager
def _progress() -> Iterator:  # type: ignore[type-arg]
    """A rich progress bar on stderr (on a terminal only); step(what, done, total)
    advances it, step(what) shows a phase without a count (loading, mapping kernels).
    A new phase hides the phases before it."""
    err = Console(stderr=True)
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


def fit_columns(
    columns: Sequence[str], rows: Sequence[Sequence[str]], width: int, keep: Sequence[str] = ()
) -> tuple[list[str], list[list[str]], str]:
    """On a terminal too narrow for the whole table, drop (except ``keep``) the columns
    whose value is the same in every row, said once instead (``Count 1, Provider
    CPUExecutionProvider``), and those equal to an earlier column in every row (the
    average when every count is 1). Returns the columns, the rows and the note."""
    natural = sum(max([len(c), *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns))
    if natural <= width or len(rows) < 2:
        return list(columns), [list(r) for r in rows], ""
    constant = [
        i
        for i, c in enumerate(columns)
        if c not in keep and len({r[i] for r in rows}) == 1 and rows[0][i]
    ]
    kept: list[int] = []
    for i, c in enumerate(columns):
        repeats = any(all(r[i] == r[j] for r in rows) for j in kept)
        if i not in constant and (c in keep or not repeats):
            kept.append(i)
    same = ", ".join(f"{columns[i]} {rows[0][i]}" for i in constant)
    return [columns[i] for i in kept], [[r[i] for i in kept] for r in rows], same


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
    prof, stats, slow, originals = (
        report.profile,
        report.op_statistic,
        report.slow,
        report.originals,
    )
    total = prof.total_us or 1.0
    out = console()
    if fmt == "json":
        out.print_json(json.dumps(report.to_json()))
        return
    out.print(
        f"{model.name}: {report.nodes} nodes (Constant nodes not counted, as advise counts "
        f"them); {prof.runs} runs after {prof.warmup} warm-up, {prof.total_us:.1f} us per run "
        f"({provider}, onnxruntime graph optimization level {graph_opt})",
        markup=False,
    )
    # per run, as advise prints it: counts per run, each node's median time over the runs
    table = Table(title=f"Op Statistic (per run, {RUNS_NOTE})", title_justify="left")
    for col in ("OP Type", "Count", "Total Time(us)", "Avg Time(us)", "Ratio(%)"):
        table.add_column(col, justify="left" if col == "OP Type" else "right", overflow="fold")
    for s in stats:
        table.add_row(
            s.op_type,
            str(s.count),
            f"{s.total_us:.3f}",
            f"{s.mean_us:.3f}",
            f"{100 * s.share:.2f}",
        )
    out.print(table)
    columns = (
        "Op Name",
        "OP Type",
        "Count",
        "Total Time(us)",
        "Avg Time(us)",
        "Ratio(%)",
        "Provider",
        ORIGINAL,
    )
    rows = [
        (
            r.name,
            r.op_type,
            str(r.calls),
            f"{r.duration_us:.3f}",
            f"{r.duration_us / r.calls:.3f}",
            f"{100 * r.duration_us / total:.2f}",
            r.provider,
            nodes_text(r.name, originals[r.name]),
        )
        for r in slow
    ]
    shown, cells, same = fit_columns(columns, rows, out.width, keep=("Op Name", "Total Time(us)"))
    table = Table(
        title=f"Top {len(slow)} slow nodes (per run)" + (f"; {same}" if same else ""),
        title_justify="left",
        caption=CAPTION,
    )
    for col in shown:
        table.add_column(col, justify="right" if col in NUMERIC else "left", overflow="fold")
    for row in cells:
        table.add_row(*row)
    out.print(table)
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
    from opfuse.advisor.html import render_html
    from opfuse.advisor.report import render_text
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
        text = json.dumps(report, indent=2) + "\n"
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
    recorder = Console(record=True, width=text_width(), file=io.StringIO(), color_system=None)
    render_text(report, recorder, top)
    _write(output, recorder.export_text(), inputs)
