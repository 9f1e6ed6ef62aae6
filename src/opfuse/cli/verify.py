"""``opfuse verify``: compare two models' outputs under onnxruntime (its optimizations
off), with the bound applied to every output and the share of it the worst element used."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.table import Table

from opfuse.cli.console import deprecated, err, out, progress
from opfuse.cli.options import PathArg, check_verifier_options, verifier_options
from opfuse.errors import EXIT_STATUSES, OpfuseError


@click.command(epilog=EXIT_STATUSES)
@click.argument("original", type=PathArg)
@click.argument("optimized", type=PathArg)
@verifier_options
@click.option("--inputs", "old_inputs", type=PathArg, hidden=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A table per output, or JSON.",
)
def verify(
    original: Path,
    optimized: Path,
    rtol: float,
    atol: float,
    input_shape: tuple[str, ...],
    verify_inputs: Path | None,
    seed: int,
    save_failing_inputs: Path | None,
    old_inputs: Path | None,
    fmt: str,
) -> None:
    """Run both models under onnxruntime (its optimizations off) and compare outputs.

    An output passes when every element is within atol * max(1, max|ref|) + rtol * |ref|;
    the table shows that bound and how much of it the worst element used."""
    from opfuse.model.io import check_output_path, read_proto
    from opfuse.pipeline.run import save_inputs
    from opfuse.verification.compare import compare_files, parse_input_shapes
    from opfuse.verification.messages import bound_text, failure_message, inputs_text, share

    if old_inputs is not None:
        if verify_inputs is not None:
            raise OpfuseError("--inputs is the old name of --verify-inputs; give only one")
        deprecated("--inputs", "--verify-inputs")
        verify_inputs = old_inputs
    check_verifier_options(True, verify_inputs, "--verify-inputs", input_shape)
    for path in (original, optimized):
        read_proto(path)
    if save_failing_inputs is not None:
        check_output_path(save_failing_inputs, [original, optimized])
    with progress() as phases, phases("verify"):
        report = compare_files(
            original,
            optimized,
            rtol=rtol,
            atol=atol,
            input_shapes=parse_input_shapes(list(input_shape)),
            inputs_npz=verify_inputs,
            seed=seed,
        )
    if fmt == "json":
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        table = Table(
            title=f"rtol {rtol:g}, atol {atol:g}; inputs {inputs_text(report)}",
            title_justify="left",
        )
        for col in ("output", "max abs error", "max rel error", "bound", "used", "result"):
            table.add_column(col, overflow="fold")
        for o in report.outputs:
            verdict = "ok" if o.ok else f"DIFFERS {o.detail}"
            table.add_row(
                o.name,
                f"{o.max_abs:.3g}",
                f"{o.max_rel:.3g}",
                bound_text(o, rtol),
                share(o),
                verdict,
            )
        out.print(table)
    for warning in report.input_warnings:
        err.print(f"opfuse: warning: {warning}", markup=False, soft_wrap=True)
    if not report.ok:
        saved = None
        if save_failing_inputs is not None:
            saved = str(save_inputs(report.feeds, save_failing_inputs))
        err.print(
            f"opfuse: verification failed: {failure_message(report, saved=saved)}",
            markup=False,
            soft_wrap=True,
        )
        sys.exit(1)
