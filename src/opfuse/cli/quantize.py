"""opfuse quantize: fuse, then int8 (QDQ), accuracy gated on held-back samples, speed
measured (opfuse.quantization)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from opfuse.cli.console import err, out
from opfuse.cli.options import PathArg, runtime_options, settings_from, switch_options
from opfuse.errors import EXIT_STATUSES, GateError
from opfuse.quantization.names import FALLBACK_SECONDS, KEYS_HELP, RECIPE_HELP


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
    "--exclude",
    multiple=True,
    help="An op type or node name kept in float, or leading=SHARE: the leading layers up "
    "to that share of the multiply-adds (e.g. leading=25%) (repeatable).",
)
@click.option(
    "--max-drop",
    default="auto",
    show_default=True,
    help=f"Accuracy gate on the held-back samples, {KEYS_HELP}.",
)
@click.option(
    "--recipe", default="auto", show_default=True, help=f"Accuracy recovery: {RECIPE_HELP}."
)
@click.option(
    "--fallback-seconds",
    type=float,
    default=FALLBACK_SECONDS,
    show_default=True,
    help="Time the fallback may spend keeping sensitive parts in float (0: none).",
)
@click.option(
    "--target-opset",
    type=int,
    help="Convert to this opset before fusing (e.g. 14: a decomposed HardSwish becomes one op).",
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
    eval_data: Path | None,
    samples: int | None,
    preprocess: str | None,
    exclude: tuple[str, ...],
    max_drop: str,
    recipe: str,
    fallback_seconds: float,
    target_opset: int | None,
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

    command = _command_line(
        model,
        output,
        calibration,
        {
            "--eval": eval_data,
            "--samples": samples,
            "--preprocess": preprocess,
            "--calibrate-method": calibrate_method,
            "--activation-type": activation_type,
            "--fusion-switch-file": fusion_switch_file,
            "--target-opset": target_opset,
            "--runtime": runtime.get("runtime"),
        },
        per_tensor,
        enable,
        disable,
    )

    try:
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
            recipe=recipe,
            fallback_seconds=fallback_seconds,
            target_opset=target_opset,
            progress=_progress,
            _command=command,
        )
    except GateError as exc:
        if exc.report is not None:  # the figures, on exit 1 too
            _show(exc.report, model, output, fmt)
        raise
    _show(result, model, output, fmt)


# the defaults the command line leaves out
COMMAND_DEFAULTS = {
    "--calibrate-method": "minmax",
    "--activation-type": "uint8",
    "--runtime": "onnxruntime",
}


def _command_line(
    model: Path,
    output: Path,
    calibration: str,
    values: dict[str, object],
    per_tensor: bool,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
) -> list[str]:
    """The user's command line, the options that change the model written (the exit-1
    message rebuilds from it the command that writes the best model reached); --runtime:
    the form of the model written (the OpenVINO form's figures are that form's)."""
    command = ["opfuse", "quantize", str(model), "-o", str(output), "--calibration", calibration]
    for flag, value in values.items():
        if value is not None and value != COMMAND_DEFAULTS.get(flag):
            command += [flag, str(value)]
    command += ["--per-tensor"] if per_tensor else []
    for name in enable:
        command += ["--enable", name]
    for name in disable:
        command += ["--disable", name]
    return command


def _progress(line: str) -> None:
    err.print(f"opfuse: {line}", markup=False, soft_wrap=True)


def _show(result: object, model: Path, output: Path, fmt: str) -> None:
    from opfuse.quantization.result import QuantizeResult

    assert isinstance(result, QuantizeResult)
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        written = output.name if result.output is not None else "nothing written"
        nodes = ", ".join(f"{kind} {count}" for kind, count in result.nodes.items())
        out.print(f"{model.name} -> {written}: nodes {nodes}", markup=False)
        for line in result.lines():
            (err if line.startswith("warning:") else out).print(line, markup=False, soft_wrap=True)
