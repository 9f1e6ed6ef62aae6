"""``opfuse verify``: compare two models' outputs under onnxruntime (its optimizations
off), with the bound applied to every output and the share of it the worst element used."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from opfuse.cli.console import err, out, progress
from opfuse.cli.options import PathArg, format_option, settings_from, verifier_options
from opfuse.errors import EXIT_STATUSES

if TYPE_CHECKING:
    from opfuse.verification.compare import VerifyReport


@click.command(epilog=EXIT_STATUSES)
@click.argument("original", type=PathArg)
@click.argument("optimized", type=PathArg)
@verifier_options
@format_option("A table per output, or JSON.")
def verify(original: Path, optimized: Path, fmt: str, **params: Any) -> None:
    """Run both models under onnxruntime (its optimizations off) and compare outputs.

    An output passes when every element is within atol * max(1, max|ref|) + rtol * |ref|;
    the table shows that bound and how much of it the worst element used."""
    from opfuse import api
    from opfuse.verification.messages import failure_message
    from opfuse.verification.settings import VerifySettings

    checks = settings_from(params, VerifySettings)
    with progress() as phases, phases("verify"):
        report = api.verify(original, optimized, verify_settings=checks)
    if fmt == "json":
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_table(report)
    for warning in report.input_warnings:
        err.print(f"opfuse: warning: {warning}", markup=False, soft_wrap=True)
    if not report.ok:
        saved = None if report.saved_inputs is None else str(report.saved_inputs)
        err.print(
            f"opfuse: verification failed: {failure_message(report, saved=saved)}",
            markup=False,
            soft_wrap=True,
        )
        sys.exit(1)


def _print_table(report: VerifyReport) -> None:
    """One row per output: its errors, the bound applied, the share of it used, the verdict."""
    from opfuse.verification.messages import bound_text, inputs_text, share

    table = Table(
        title=f"rtol {report.rtol:g}, atol {report.atol:g}; inputs {inputs_text(report)}",
        title_justify="left",
    )
    for col in ("output", "max abs error", "max rel error", "bound", "used", "result"):
        table.add_column(col, overflow="fold")
    for o in report.outputs:
        # over 100% of its bound and still ok: the float64 judge says why
        verdict = (f"ok: {o.detail}" if o.detail else "ok") if o.ok else f"DIFFERS {o.detail}"
        table.add_row(
            o.name,
            f"{o.max_abs:.3g}",
            f"{o.max_rel:.3g}",
            bound_text(o, report.rtol),
            share(o),
            verdict,
        )
    out.print(table)
