"""opfuse quantize: fuse, then int8 (QDQ), accuracy gated on held-back samples, speed
measured (opfuse.quantization). The options parse into a ``QuantizeSettings`` and a
``RuntimeSettings`` (``cli.options.settings_from``), as every command's do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from opfuse.cli.console import deprecated, err, out
from opfuse.cli.options import (
    PathArg,
    quantize_options,
    runtime_options,
    settings_from,
    switch_options,
)
from opfuse.errors import EXIT_STATUSES, GateError


@click.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the int8 model.")
@click.option(
    "--calibration",
    required=True,
    help="Samples: an .npz (arrays named after the inputs, N samples on axis 0), a folder "
    "of .npz (one sample each) or of images (with --preprocess), or 'random' (structure only).",
)
@quantize_options
@click.option("--fallback-seconds", type=float, hidden=True)  # deprecated: --fallback-tries
@switch_options.only(
    "fusion_switch_file",
    "enable",
    "disable",
    fusion_switch_file="CANN-format switch file for the fusions.",
    enable="Turn a fusion pass on (repeatable).",
    disable="Turn a fusion pass off (repeatable).",
)
@click.option("--report", type=PathArg, help="Write the figures as JSON here.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("text", "json")),
    default="text",
    show_default=True,
    help="json: the figures as JSON on stdout.",
)
@runtime_options
def quantize(
    model: Path,
    output: Path,
    calibration: str,
    fallback_seconds: float | None,
    report: Path | None,
    fmt: str,
    **options: Any,
) -> None:
    """Fuse MODEL, quantize it to int8 (QDQ) with the calibration samples, check its
    accuracy against the float model on held-back samples, measure its speed, and write it
    to OUTPUT."""
    from opfuse import api
    from opfuse.quantization.settings import QuantizeSettings

    if fallback_seconds is not None:
        deprecated(
            "--fallback-seconds", "--fallback-tries (a count: the same model on a busy machine)"
        )
        options["fallback_tries"] = options["fallback_tries"] if fallback_seconds > 0 else 0
    settings = settings_from(options, QuantizeSettings)
    try:
        result = api.quantize(
            model,
            output,
            calibration=calibration,
            settings=settings,
            runtime_settings=settings_from(options),
            report=report,
            progress=_progress,
        )
    except GateError as exc:
        if exc.report is not None:  # the figures, on exit 1 too
            _show(exc.report, model, output, fmt, failed=True)
        raise
    _show(result, model, output, fmt)


def _progress(line: str) -> None:
    err.print(f"opfuse: {line}", markup=False, soft_wrap=True)


SHOWN_OUTPUTS = 3  # a failed run's summary names the figures of this many outputs


def _show(result: object, model: Path, output: Path, fmt: str, failed: bool = False) -> None:
    """The result as JSON, or as text: the whole summary, or on exit 1 a short one (the
    figures measured, the gate, the speed; the error line after it says why and gives
    the command), the warnings on stderr."""
    from opfuse.quantization.result import QuantizeResult

    assert isinstance(result, QuantizeResult)
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    written = output.name if result.output is not None else "nothing written"
    nodes = ", ".join(f"{kind} {count}" for kind, count in result.nodes.items())
    out.print(f"{model.name} -> {written}: nodes {nodes}", markup=False)
    lines = _failed_lines(result) if failed else result.lines()
    for line in lines:
        (err if line.startswith("warning:") else out).print(line, markup=False, soft_wrap=True)


def _failed_lines(result: Any) -> list[str]:
    """Exit 1 in a few lines: each output's figures (the first SHOWN_OUTPUTS), the gate
    and, when measured, the speed; the whole summary is the report's (--report)."""
    figures = [f"  {a.line()}" for a in result.accuracy[:SHOWN_OUTPUTS]]
    more = len(result.accuracy) - SHOWN_OUTPUTS
    figures += [f"  and {more} more outputs (--report)"] if more > 0 else []
    gate = "passed" if result.passed else "MISSED"
    lines = [*figures, f"gate: {result.gate.describe(result.measures)}: {gate}"]
    lines += [result.speed_verdict()] if result.speed is not None else []
    return lines + [w for w in result.lines() if w.startswith("warning:")]
