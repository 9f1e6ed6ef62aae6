"""opfuse quantize: fuse, then int8 (QDQ), accuracy gated on held-back samples, speed
measured (opfuse.quantization)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from opfuse.cli.console import err, out
from opfuse.cli.options import PathArg, runtime_options, settings_from
from opfuse.errors import EXIT_STATUSES


@click.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the int8 model.")
@click.option(
    "--calibration",
    required=True,
    help="Samples: an .npz (arrays named after the inputs, N samples on axis 0), a folder "
    "of .npz (one sample each) or of images (with --preprocess), or 'random' (structure only).",
)
@click.option(
    "--eval",
    "eval_data",
    type=PathArg,
    help="Samples to measure accuracy on [default: every 4th calibration sample, held back].",
)
@click.option(
    "--samples",
    type=int,
    help="Use the first N calibration samples (exit 2 when the data holds fewer).",
)
@click.option(
    "--preprocess",
    help="Images: size=224,layout=NCHW,order=RGB,scale=1/255,mean=0.485:0.456:0.406,std=...",
)
@click.option(
    "--exclude", multiple=True, help="An op type or node name kept in float (repeatable)."
)
@click.option(
    "--max-drop",
    default="auto",
    show_default=True,
    help="Accuracy gate: top1=1% (agreement with float), sqnr=25 (dB), auto, or off.",
)
@click.option("--min-speedup", type=float, help="Exit 1, nothing written, below this speed-up.")
@click.option("--no-benchmark", is_flag=True, help="Do not measure the speed.")
@click.option(
    "--calibrate-method",
    type=click.Choice(("minmax", "entropy", "percentile")),
    default="minmax",
    show_default=True,
    help="How the calibration picks each activation's range.",
)
@click.option("--per-tensor", is_flag=True, help="Per-tensor weights [default: per channel].")
@click.option(
    "--activation-type",
    type=click.Choice(("uint8", "int8")),
    default="uint8",
    show_default=True,
    help="The activations' integer type (the weights are int8).",
)
@click.option("--fusion-switch-file", type=PathArg, help="CANN-format switch file for the fusions.")
@click.option("--enable", multiple=True, help="Turn a fusion pass on (repeatable).")
@click.option("--disable", multiple=True, help="Turn a fusion pass off (repeatable).")
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
    eval_data: Path | None,
    samples: int | None,
    preprocess: str | None,
    exclude: tuple[str, ...],
    max_drop: str,
    min_speedup: float | None,
    no_benchmark: bool,
    calibrate_method: str,
    per_tensor: bool,
    activation_type: str,
    fusion_switch_file: Path | None,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
    report: Path | None,
    fmt: str,
    **runtime: object,
) -> None:
    """Fuse MODEL, quantize it to int8 (QDQ) with the calibration samples, check its
    accuracy against the float model on held-back samples, measure its speed, and write it
    to OUTPUT."""
    from opfuse import api

    result = api.quantize(
        model,
        output,
        calibration=calibration,
        eval=eval_data,
        samples=samples,
        preprocess=preprocess,
        exclude=list(exclude),
        max_drop=max_drop,
        min_speedup=min_speedup,
        benchmark=not no_benchmark,
        calibrate_method=calibrate_method,
        per_channel=not per_tensor,
        activation_type=activation_type,
        fusion_switch_file=fusion_switch_file,
        enable=list(enable),
        disable=list(disable),
        report=report,
        runtime_settings=settings_from(runtime),
    )
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        out.print(f"{model.name} -> {output.name}: nodes {result.nodes}", markup=False)
        for line in result.lines():
            (err if line.startswith("warning:") else out).print(line, markup=False, soft_wrap=True)
