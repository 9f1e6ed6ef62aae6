"""``opfuse tune``: the measured search for the fastest verified variant (``opfuse.api.tune``),
with a progress bar over the budget and the table of trials."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opfuse.cli.console import console, err
from opfuse.cli.options import (
    F,
    PathArg,
    names,
    runtime_options,
    settings_from,
    verifier_options,
)
from opfuse.tuning.measure import pct

if TYPE_CHECKING:
    from opfuse.tuning.search import TuneResult
    from opfuse.tuning.session_search import SessionSearch
    from opfuse.tuning.settings import TuneSettings


# what tune searches and writes (into a TuneSettings, and the output paths), in --help's
# order around the runtime's options (cli.options.runtime_options)
_OUTPUT_OPTIONS = [
    click.option(
        "--switch-file-out",
        type=PathArg,
        help="Where to write the fusion switch file [default: OUTPUT.fusion_switch.cfg].",
    ),
    click.option("--report", type=PathArg, help="Write every trial as JSON here."),
    click.option(
        "--budget",
        default=120.0,
        show_default=True,
        help="Seconds of search (trials in progress end).",
    ),
]
_SEARCH_OPTIONS = [
    verifier_options.only(
        "rtol",
        "atol",
        "input_shape",
        "inputs",
        "verify_inputs",
        atol="Absolute tolerance (scaled).",
        input_shape="Dims for dynamic inputs: NAME:1,3,224,224.",
        inputs=".npz of arrays named after the model's inputs: every variant is verified and "
        "timed on them. [default: generated]",
    ),
    click.option(
        "--static-shapes",
        is_flag=True,
        help="Also try the inputs re-declared with the --input-shape dims (changes the inputs).",
    ),
    click.option(
        "--layout",
        type=click.Choice(["nchw", "nhwc"]),
        multiple=True,
        help="Also try this layout for image inputs (changes the inputs: callers must transpose).",
    ),
    click.option(
        "--allow-interface-change",
        is_flag=True,
        help="Also try every variant that changes the model's inputs (layouts; static shapes "
        "with --input-shape). Without it the output takes the original's inputs.",
    ),
    click.option(
        "--no-session-search",
        is_flag=True,
        help="Search the graph only, not the session settings (threads, execution mode, level).",
    ),
    click.option(
        "--max-threads",
        type=click.IntRange(min=1),
        help="Most intra-op threads the session search tries [default: the machine's cores].",
    ),
    click.option(
        "--runtimes",
        help="Runtimes the session search compares, e.g. onnxruntime,openvino [default: --runtime].",
    ),
]


def _options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


@click.command()
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the result.")
@_options(_OUTPUT_OPTIONS)
@runtime_options
@_options(_SEARCH_OPTIONS)
def tune(
    model: Path,
    output: Path,
    switch_file_out: Path | None,
    report: Path | None,
    **options: Any,
) -> None:
    """Search for the fastest verified variant of MODEL on the runtime and write it to
    OUTPUT, with the fusion switch file and the optimize command line that rebuild it, and
    OUTPUT.session.json, the settings it was measured at (graph and session), for
    opfuse.InferenceSession(OUTPUT or MODEL, session_file=...)."""
    from opfuse import api

    runtime_settings = settings_from(options)
    settings = _tune_settings(options)  # a refusal: speaks_flags says it with the flag
    with _trial_progress(settings.budget) as step:
        result = api.tune(
            model,
            output,
            settings=settings,
            runtime_settings=runtime_settings,
            switch_file_out=switch_file_out,
            report=report,
            progress=step,
        )
    _print_tune(result, result.command, result.switch_file or Path())


def _tune_settings(options: dict[str, Any]) -> TuneSettings:
    """The search options into a ``TuneSettings``: each option's name is a field's, but
    --no-session-search (``session_search``), and --input-shape and --runtimes are parsed."""
    from opfuse.tuning.settings import TuneSettings
    from opfuse.verification.compare import parse_input_shapes

    options["input_shape"] = parse_input_shapes(list(options["input_shape"]))
    options["session_search"] = not options.pop("no_session_search")
    options["runtimes"] = names((options["runtimes"],)) if options["runtimes"] else None
    return TuneSettings(**{f.name: options.pop(f.name) for f in dataclasses.fields(TuneSettings)})


@contextmanager
def _trial_progress(budget: float) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr over the budget; step(what) names the trial under way."""
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
    return "" if x is None else f"+-{pct(x)}"


def _wrapped_command(command: str, width: int) -> str:
    """A shell command folded within ``width`` with backslash-newline continuations: at
    argument boundaries, and inside an argument longer than a line (a long path) where
    it is not quoted (the shell removes a backslash-newline anywhere outside quotes). It
    still pastes as one command."""
    width = max(width, 20)
    lines: list[str] = []
    line = ""
    for arg in map(shlex.quote, shlex.split(command)):
        if line and len(line) + 1 + len(arg) + 2 > width:
            lines.append(line + " \\")
            line = "    "
        else:
            line = f"{line} " if line else ""
        while len(line) + len(arg) + 2 > width and not arg.startswith("'"):
            cut = width - 1 - len(line)  # the rest of this line, less the backslash
            lines.append(line + arg[:cut] + "\\")
            line, arg = "", arg[cut:]
        line += arg
    return "\n".join([*lines, line])


def _print_tune(result: TuneResult, command: str, switch_file: Path) -> None:
    out = console()  # COLUMNS on and off a terminal, else the terminal's width, else 100
    title = f"tune on {result.runtime}"
    if result.inputs is not None:
        title += f"; inputs {result.inputs.text()}"
    table = Table(title=title, title_justify="left")
    for col in ("#", "settings", "nodes", "verification", "latency", "noise", "kept", "note"):
        table.add_column(
            col,
            justify="right" if col in ("#", "nodes", "latency") else "left",
            # what a user must read folds (never cut short); the figures keep their line
            overflow="fold" if col in ("settings", "verification", "note") else "ellipsis",
            no_wrap=col not in ("settings", "verification", "note"),
            ratio=3 if col == "settings" else 2 if col == "note" else None,
            # a pass name whole on one line where the width leaves room for the notes
            min_width=32 if col == "settings" and out.width >= 120 else None,
        )
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
    for name, (opset, n) in result.open_upgrades().items():
        out.print(
            f"note: {name} would fire at a higher opset: {n} match{'' if n == 1 else 'es'} at --target-opset {opset}",
            markup=False,
        )
    if result.final is not None:
        out.print(
            f"best variant: {result.searched.label}: {result.final.line('best')}", markup=False
        )
    if result.inputs is not None:
        out.print(result.inputs.line("timed"), markup=False)
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
    if result.interface_changed:
        out.print(
            "interface changed (asked for): callers must feed the output differently: "
            + "; ".join(result.interface_changed),
            markup=False,
        )
    out.print(f"switch file: {switch_file}", markup=False)
    out.print(
        f"rebuild: {_wrapped_command(command, out.width - len('rebuild: '))}",
        markup=False,
        soft_wrap=True,
    )
    if result.session is not None:
        _print_session(out, result.session)
    if result.session_file is not None:
        out.print(
            f"session file: {result.session_file} (graph and session settings; "
            "opfuse.InferenceSession(OUTPUT or MODEL, session_file=...))",
            markup=False,
        )
    for warning in result.warnings:
        err.print(f"opfuse: warning: {warning}", markup=False, soft_wrap=True)


def _print_session(out: Console, search: SessionSearch) -> None:
    """The session settings tried, each with its latency over the best at the time."""
    table = Table(title="session settings", title_justify="left")
    for col in ("settings", "latency vs best", "noise", "kept", "note"):
        table.add_column(
            col,
            justify="right" if col.startswith("latency") else "left",
            overflow="fold" if col in ("settings", "note") else "ellipsis",
            no_wrap=col not in ("settings", "note"),
        )
    for t in search.trials:
        ratio = "" if t.ratio is None else f"{t.ratio:.3f}x"
        table.add_row(t.settings.label, ratio, _pct(t.noise), "yes" if t.kept else "", t.note)
    out.print(table)
    if search.budget_spent:
        out.print("the budget ran out before every session setting was tried")
    if search.best == search.start:
        out.print(f"session: {search.start.label} kept (nothing beat it beyond the noise)")
    else:
        out.print(
            f"session: {search.best.label}: {search.ratio:.2f}x the latency of "
            f"{search.start.label} (noise {_pct(search.final.noise if search.final else None)})",
            markup=False,
        )
