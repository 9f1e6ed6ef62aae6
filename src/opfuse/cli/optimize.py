"""``opfuse optimize``: fuse and simplify a model, verify it, write it, and with
``--benchmark`` measure it on the runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from opfuse.cli.benchmark import benchmark_of, opset_hints
from opfuse.cli.console import deprecated, err, out, print_wrapped, progress, size
from opfuse.cli.options import (
    PathArg,
    format_option,
    graph_options,
    refuse_without_benchmark,
    refuse_without_verify,
    runtime_options,
    settings_from,
    switch_options,
    verifier_options,
)
from opfuse.errors import EXIT_STATUSES, OpfuseError

if TYPE_CHECKING:
    from opfuse.pipeline.result import OptimizeResult
    from opfuse.verification.compare import VerifyReport

LOG_LEVELS = ("error", "warning", "info", "debug")


@click.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the result.")
@switch_options
@click.option(
    "--keep-inputs",
    multiple=True,
    help="Cut the graph at these tensors, which become its inputs (names). [default: none]",
)
@click.option(
    "--keep-outputs",
    multiple=True,
    help="Keep only what these tensors need; they become the outputs (names). [default: none]",
)
@click.option("--outputs", "old_outputs", multiple=True, hidden=True)
@click.option("--fusion-result", type=PathArg, help="Write CANN's fusion_result.json here.")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="warning",
    show_default=True,
    help="info prints the effect log, debug also why patterns did not fire (on stderr).",
)
@format_option("Summary on stdout: a table, or JSON (counts, passes, verification, timings).")
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare outputs with the input model before writing.",
)
@verifier_options.only("rtol", "atol", "input_shape")
@click.option(
    "--inputs",
    "inputs",
    multiple=True,
    help="An .npz of arrays named after the model's inputs: verification and --benchmark "
    "run on them. [default: generated]",
)
@verifier_options.only("verify_inputs", "seed", "save_failing_inputs")
@click.option(
    "--bisect/--no-bisect",
    default=True,
    show_default=True,
    help="On a failed verification, re-run with halves of the fired passes off to name "
    "the first pass to blame.",
)
@graph_options
@click.option(
    "--static-shapes",
    is_flag=True,
    help="Re-declare the inputs with the --input-shape dims (shape arithmetic folds).",
)
@click.option("--benchmark", is_flag=True, help="Measure the original and the output's latency.")
@runtime_options
def optimize(
    model: Path,
    output: Path,
    inputs: tuple[str, ...],
    old_outputs: tuple[str, ...],
    fusion_result: Path | None,
    log_level: str,
    fmt: str,
    verify: bool,
    bisect: bool,
    benchmark: bool,
    **params: Any,
) -> None:
    """Fuse and simplify MODEL, verify it, and write it to OUTPUT."""
    from opfuse import api
    from opfuse.pipeline.settings import OptimizeSettings
    from opfuse.verification.settings import VerifySettings

    params["inputs"], old_inputs = _samples_or_names(inputs)
    if old_inputs:
        err.print(
            "opfuse: warning: --inputs with tensor names is deprecated; use --keep-inputs "
            "(--inputs takes an .npz of input arrays)",
            markup=False,
        )
    if old_outputs:
        deprecated("--outputs", "--keep-outputs")
    params["keep_inputs"] += old_inputs
    params["keep_outputs"] += old_outputs
    if params["static_shapes"] and not verify:
        raise OpfuseError("--static-shapes changes the model's inputs: drop --no-verify")
    refuse_without_verify(verify, benchmark)
    checks = settings_from(params, VerifySettings)
    refuse_without_benchmark(benchmark)
    runtime = settings_from(params)
    if benchmark:
        from opfuse.tuning.measure import feeds_for

        runtime.make()  # a bad --runtime/--provider fails before the work
        # as does a model the measurement's inputs cannot run (optimize's one-line error
        # and hint, exit 2): before the output is written, not after (--no-verify)
        feeds_for(model, checks.shapes, checks.inputs_npz)
    with progress() as phases:
        result = api.optimize(
            model,
            output=output,
            fusion_result=fusion_result,
            verify=verify,
            bisect=bisect,
            phases=phases,
            optimize_settings=settings_from(params, OptimizeSettings),
            verify_settings=checks,
        )
    _print_logs(result, log_level)
    measured = None
    if benchmark:
        effected = {name: result.log.effected(name) for name in result.passes}
        measured = benchmark_of(model, output, runtime, checks.shapes, checks.inputs_npz, effected)
    if fmt == "json":
        data = result.to_json()
        if measured is not None:
            data["benchmark"] = measured.to_json()
        click.echo(json.dumps(data, indent=2))
    else:
        _print_summary(result, model, output)
        for line in opset_hints(result.model):
            out.print(f"note: {line}", markup=False)
    if measured is not None:
        for line in measured.lines():  # on stderr under --format json, which owns stdout
            print_wrapped(err if fmt == "json" else out, line)
        for warning in measured.warnings:
            err.print(f"opfuse: warning: {warning}", markup=False, soft_wrap=True)


def _samples_or_names(values: tuple[str, ...]) -> tuple[Path | None, tuple[str, ...]]:
    """--inputs: the .npz of input arrays (a value ending in .npz, or a file), and the
    tensor names of its deprecated meaning (--keep-inputs)."""
    samples = [v for v in values if v.endswith(".npz") or Path(v).is_file()]
    if len(samples) > 1:
        raise OpfuseError(f"--inputs {samples[1]}: give one .npz of input arrays")
    return (Path(samples[0]) if samples else None), tuple(v for v in values if v not in samples)


def _print_logs(result: OptimizeResult[Any], log_level: str) -> None:
    """The warnings, and the effect log at --log-level info/debug, on stderr."""
    if log_level != "error":
        input_warnings = [] if result.verify is None else result.verify.input_warnings
        for warning in [*result.warnings, *input_warnings]:
            err.print(f"opfuse: warning: {warning}", markup=False, soft_wrap=True)
    if log_level in ("info", "debug"):
        for line in result.skipped:
            err.print(f"[INFO] OPFUSE {line}", soft_wrap=True, markup=False)
        for line in result.log.lines():
            err.print(f"[INFO] OPFUSE {line}", soft_wrap=True, markup=False)
    if log_level == "debug":
        for r in result.log.reasons():
            nodes = ", ".join(r["nodes"])
            err.print(
                f"[DEBUG] OPFUSE {r['pass']}: pattern={r['pattern']} not applied "
                f"{r['count']}x: {r['reason']} ({nodes})",
                soft_wrap=True,
                markup=False,
            )


def _print_summary(result: OptimizeResult[Any], model: Path, output: Path) -> None:
    from opfuse.pipeline.result import timings_text
    from opfuse.verification.messages import inputs_text

    before, after = result.before, result.after
    table = Table(title=f"{model.name} -> {output.name}", title_justify="left")
    table.add_column("op type")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    changed = sorted(
        (op for op in set(before) | set(after) if before[op] != after[op]),
        key=lambda op: (after[op] - before[op], op),
    )
    for op in changed:
        table.add_row(op, str(before[op]), str(after[op]))
    table.add_row("nodes", str(sum(before.values())), str(sum(after.values())), style="bold")
    table.add_row("file size", size(result.input_bytes), size(result.output_bytes))
    out.print(table)
    if not result.changed:
        out.print("no pass changed the model (it was written unchanged)")
    report = result.verify
    if report is None:
        out.print("verification: off")
    else:
        out.print(f"verification: ok on inputs {inputs_text(report)}", markup=False)
        _print_outputs(report, indent="  ")
        if report.inputs:
            grown = [f"{report.grown} ({report.refused})"] if report.grown else []
            out.print("generated inputs: " + "; ".join([*report.inputs, *grown]), markup=False)
    out.print(f"{result.rounds} rounds; time: {timings_text(result.timings)}")
    for note in result.notes:
        out.print(f"note: {note}", markup=False)
    for part in result.left_alone:
        out.print(f"left alone: {part}", markup=False)


def _print_outputs(report: VerifyReport, indent: str = "") -> None:
    """One line per output: its error, the bound applied, the share the worst element used."""
    from opfuse.verification.messages import output_line

    for o in report.outputs:
        print_wrapped(out, indent + output_line(o, report.rtol))
