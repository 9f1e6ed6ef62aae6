"""The ``opfuse batch`` command: options, a progress bar, the summary."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar
from rich.table import Table

from opfuse.batching.jobs import Job
from opfuse.batching.runner import BatchProgress, BatchRun
from opfuse.cli.console import console
from opfuse.cli.options import (
    PathArg,
    format_option,
    graph_options,
    settings_from,
    switch_options,
    verifier_options,
)
from opfuse.errors import OpfuseError

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
SHOWN_RUNNING = 3
ERROR_WIDTH = 120


def parse_size(text: str) -> int:
    """``8G``, ``512M``, ``1.5GiB``, ``1000000`` (bytes) to bytes; ``0`` means no limit."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise OpfuseError(f"--max-memory {text!r}: give a size such as 4G, 512M or 0 (no limit)")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


class BarProgress(BatchProgress):
    """A rich progress bar on stderr naming the models running now; without a terminal,
    one line per finished model instead."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[running]}"),
            console=console,
            transient=True,
            disable=not self.live,
        )
        self.task = self.bar.add_task("models", total=0, running="")
        self.running: list[str] = []
        self.done = 0
        self.total = 0

    def __enter__(self) -> BarProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def _show(self) -> None:
        names = ", ".join(self.running[:SHOWN_RUNNING])
        more = len(self.running) - SHOWN_RUNNING
        self.bar.update(
            self.task, completed=self.done, running=names + (f" +{more}" if more > 0 else "")
        )

    def planned(self, total: int, skipped: int) -> None:
        self.total = total - skipped
        self.bar.update(self.task, total=self.total)
        if skipped:
            self.console.print(f"{skipped} of {total} models done before: skipped (--force redoes)")

    def started(self, job: Job) -> None:
        self.running.append(job.relpath)
        self._show()

    def finished(self, job: Job, record: dict[str, Any]) -> None:
        if job.relpath in self.running:
            self.running.remove(job.relpath)
        self.done += 1
        self._show()
        line = f"[{self.done}/{self.total}] {job.relpath}: {record['status']}"
        if record.get("error"):
            line += f": {record['error']}"
        self.console.print(line, markup=False, soft_wrap=True, highlight=False)


def print_summary(run: BatchRun, console: Console) -> None:
    table = Table(title=f"{run.outdir} ({run.engine})", title_justify="left")
    for col in ("model", "status", "nodes", "seconds", "error"):
        # within the console's width: the model and its error fold, never cut short
        table.add_column(col, overflow="fold", no_wrap=col in ("status", "nodes", "seconds"))
    for r in run.ran:
        nodes = (
            f"{r['nodes_before']} -> {r['nodes_after']}" if r.get("nodes_after") is not None else ""
        )
        seconds = f"{r['seconds']:.1f}" if r.get("seconds") is not None else ""
        error = r.get("error") or ""
        error = error if len(error) <= ERROR_WIDTH else error[: ERROR_WIDTH - 3] + "..."
        table.add_row(r["relpath"], r["status"], nodes, seconds, error)
    if run.ran:
        console.print(table)
    for line in run.summary().splitlines():
        console.print(line, markup=False)


@click.command()
@click.argument("inputs", nargs=-1, required=True, type=PathArg)
@click.option("-o", "--outdir", type=PathArg, required=True, help="Folder for all outputs.")
@click.option("--workers", type=click.IntRange(min=1), help="Parallel models [default: cores].")
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    default=None,
    help="Run on Ray: a local cluster (--ray) or an existing one (--ray ADDRESS or auto).",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds per model.")
@click.option(
    "--max-memory",
    default="8G",
    show_default=True,
    help="Memory limit per model (heap, RLIMIT_DATA); 0 for none.",
)
@click.option("--force", is_flag=True, help="Redo models done before with the same options.")
@click.option("--advise", is_flag=True, help="Also write each model's advisor JSON and HTML.")
@click.option(
    "--benchmark", is_flag=True, help="Also measure latency optimized / original (onnxruntime)."
)
@click.option(
    "--tune",
    "tune_budget",
    type=float,
    help="Also run opfuse tune with this budget (seconds) per model; NAME.tuned.onnx.",
)
@switch_options.only(
    "fusion_switch_file",
    "enable",
    "disable",
    fusion_switch_file="CANN-format switch file for all models.",
    enable="Turn a pass on.",
    disable="Turn a pass off.",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare each output with its input model before writing it.",
)
@verifier_options.only(
    "rtol",
    "atol",
    "input_shape",
    atol="Absolute tolerance.",
    input_shape="Dims for dynamic inputs: NAME:1,3,224,224.",
)
@graph_options
@format_option("json: the summary and every record on stdout.")
def batch(
    inputs: tuple[Path, ...],
    outdir: Path,
    workers: int | None,
    ray_address: str | None,
    timeout: float,
    max_memory: str,
    force: bool,
    advise: bool,
    benchmark: bool,
    tune_budget: float | None,
    verify: bool,
    fmt: str,
    **params: Any,
) -> None:
    """Optimize and verify every model of INPUTS (files, folders, .txt/.jsonl manifests)
    into OUTDIR, each in its own worker process; resumable (see docs/BATCH.md)."""
    from opfuse import api
    from opfuse.batching.runner import BatchInterrupted
    from opfuse.batching.summary import summary_json
    from opfuse.pipeline.settings import OptimizeSettings
    from opfuse.verification.settings import VerifySettings

    graph = settings_from(params, OptimizeSettings)
    checks = settings_from(params, VerifySettings)
    limit = parse_size(max_memory)
    err = console(stderr=True)  # COLUMNS, else the terminal's width, else 100 columns
    out = console()
    if ray_address not in (None, "local", "auto") and Path(ray_address).exists():
        raise OpfuseError(
            f"--ray {ray_address}: that is a file or folder, not a cluster address; put --ray "
            "after the inputs (or write --ray=ADDRESS)"
        )
    _skip_main_in_workers()
    with BarProgress(err) as progress:
        try:
            records = api.batch(
                inputs,
                outdir,
                engine="local" if ray_address is None else "ray",
                workers=workers,
                ray_address=None if ray_address in (None, "local") else ray_address,
                force=force,
                optimize_settings=graph,
                verify_settings=checks,
                progress=progress,
                verify=verify,
                advise=advise,
                benchmark=benchmark,
                tune=tune_budget,
                timeout=timeout,
                max_memory=limit,
            )
        except BatchInterrupted as exc:
            records = exc.records
    run = records.run
    if fmt == "json":
        click.echo(summary_json(run.records, run.totals()), nl=False)
    else:
        print_summary(run, out)
    if run.interrupted:
        sys.exit(130)
    if any(r["status"] != "ok" for r in run.records):
        sys.exit(1)


def _skip_main_in_workers() -> None:
    """Worker processes re-import the ``__main__`` module; a console script installed
    without the ``if __name__ == "__main__"`` guard would run the CLI again in each. Name
    the package's own ``__main__`` instead, which multiprocessing does not re-run."""
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) is None:
        main.__spec__ = importlib.util.find_spec("opfuse.__main__")
