"""The ``opfuse`` command line: optimize, verify, passes.

Errors are one line on stderr with exit status 2 (1 for a failed verification), never a
traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from opfuse import __version__
from opfuse.errors import OpfuseError

# piped output keeps whole names (rich would cut tables at 80 columns)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 240)
DEBUG = {"on": False}
LOG_LEVELS = ("error", "warning", "info", "debug")
PathArg = click.Path(path_type=Path)


def _names(values: tuple[str, ...]) -> list[str]:
    """Accept repeated options and comma-separated lists alike."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="opfuse")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def app(debug: bool) -> None:
    """Operator-fusion optimizer and advisor for ONNX inference models."""
    DEBUG["on"] = debug


def verifier_options(f):  # type: ignore[no-untyped-def]
    for option in reversed(
        [
            click.option("--rtol", default=1e-4, show_default=True, help="Relative tolerance."),
            click.option(
                "--atol",
                default=1e-5,
                show_default=True,
                help="Absolute tolerance, scaled by the output's magnitude.",
            ),
            click.option(
                "--input-shape", multiple=True, help="Dims for dynamic inputs: NAME:1,3,224,224."
            ),
        ]
    ):
        f = option(f)
    return f


@app.command()
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the result.")
@click.option(
    "--fusion-switch-file", type=PathArg, help="CANN-format JSON file turning passes on/off."
)
@click.option("--enable", multiple=True, help="Turn a pass on (overrides the switch file).")
@click.option("--disable", multiple=True, help="Turn a pass off (overrides the switch file).")
@click.option("--inputs", multiple=True, help="Cut the graph at these tensors (names).")
@click.option("--outputs", multiple=True, help="Keep only what these tensors need (names).")
@click.option("--fusion-result", type=PathArg, help="Write CANN's fusion_result.json here.")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="warning",
    show_default=True,
    help="info prints the effect log; debug also why patterns did not fire.",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare outputs with the input model before writing.",
)
@verifier_options
@click.option("--verify-inputs", type=PathArg, help=".npz of inputs for the verifier.")
@click.option(
    "--fold-size-limit",
    default=1 << 20,
    show_default=True,
    help="Largest constant (bytes) a fold may create, unless it frees as much; a fold "
    "also grows the model by at most 4 KiB.",
)
@click.option(
    "--target-opset", type=int, help="Convert to this opset first (enables newer fusions)."
)
@click.option(
    "--layout",
    type=click.Choice(["keep", "nchw", "nhwc"]),
    default="keep",
    show_default=True,
    help="Layout of image inputs/outputs; nchw changes the model's interface.",
)
@click.option("--target", help="Runtime whose UBFusion passes may run.")
def optimize(
    model: Path,
    output: Path,
    fusion_switch_file: Path | None,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    fusion_result: Path | None,
    log_level: str,
    verify: bool,
    rtol: float,
    atol: float,
    input_shape: tuple[str, ...],
    verify_inputs: Path | None,
    fold_size_limit: int,
    target_opset: int | None,
    layout: str,
    target: str | None,
) -> None:
    """Fuse and simplify MODEL, verify it, and write it to OUTPUT."""
    from opfuse.api import optimize_file
    from opfuse.rewrite.context import Options
    from opfuse.verify import parse_input_shapes

    _check_verifier_options(verify, verify_inputs, "--verify-inputs", input_shape)
    options = Options(
        fold_size_limit=fold_size_limit,
        target_opset=target_opset,
        layout=layout,
        target=target,
        keep_inputs=_names(inputs) or None,
        keep_outputs=_names(outputs) or None,
    )
    result = optimize_file(
        model,
        output,
        fusion_switch_file=fusion_switch_file,
        enable=_names(enable),
        disable=_names(disable),
        options=options,
        verify=verify,
        rtol=rtol,
        atol=atol,
        input_shapes=parse_input_shapes(list(input_shape)),
        inputs_npz=verify_inputs,
        fusion_result=fusion_result,
    )
    if log_level != "error":
        for warning in result.warnings:
            err.print(f"opfuse: warning: {warning}", markup=False)
    if log_level in ("info", "debug"):
        for line in result.skipped:
            out.print(f"[INFO] OPFUSE {line}", soft_wrap=True, markup=False)
        for line in result.log.lines():
            out.print(f"[INFO] OPFUSE {line}", soft_wrap=True, markup=False)
    if log_level == "debug":
        for r in result.log.reasons():
            nodes = ", ".join(r["nodes"])  # type: ignore[arg-type]
            out.print(
                f"[DEBUG] OPFUSE {r['pass']}: pattern={r['pattern']} not applied "
                f"{r['count']}x: {r['reason']} ({nodes})",
                soft_wrap=True,
                markup=False,
            )
    _print_summary(result, model, output)


def _check_verifier_options(
    verify: bool, npz: Path | None, npz_option: str, input_shape: tuple[str, ...]
) -> None:
    """Refuse verifier options that would be ignored: with --no-verify any of them, and
    --input-shape next to an .npz (its arrays give the shapes)."""
    ctx = click.get_current_context()
    if not verify:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("verify_inputs", "input_shape", "rtol", "atol")
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            one = len(given) == 1
            raise OpfuseError(
                f"{', '.join(given)} {'has' if one else 'have'} no effect with --no-verify "
                f"(no verification runs); drop {'it' if one else 'them'} or --no-verify"
            )
    if npz is not None and input_shape:
        raise OpfuseError(
            f"--input-shape and {npz_option} {npz} both give the input shapes "
            "(the .npz arrays' shapes are used); drop --input-shape"
        )


def _print_summary(result, model: Path, output: Path) -> None:  # type: ignore[no-untyped-def]
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
    table.add_row("file size", _size(result.input_bytes), _size(result.output_bytes))
    out.print(table)
    status = "off"
    if result.verify is not None:
        worst = max((o.max_abs for o in result.verify.outputs), default=0.0)
        status = f"ok ({len(result.verify.outputs)} outputs, max abs error {worst:.3g})"
    out.print(f"time {result.seconds:.2f} s in {result.rounds} rounds; verification: {status}")
    for note in result.notes:
        out.print(f"note: {note}", markup=False)


@app.command()
@click.argument("original", type=PathArg)
@click.argument("optimized", type=PathArg)
@verifier_options
@click.option("--inputs", type=PathArg, help=".npz of input arrays.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def verify(
    original: Path,
    optimized: Path,
    rtol: float,
    atol: float,
    input_shape: tuple[str, ...],
    inputs: Path | None,
    seed: int,
    fmt: str,
) -> None:
    """Run both models under onnxruntime (its optimizations off) and compare outputs."""
    from opfuse.io import read_proto
    from opfuse.verify import compare_files, parse_input_shapes

    _check_verifier_options(True, inputs, "--inputs", input_shape)
    for path in (original, optimized):
        read_proto(path)
    report = compare_files(
        original,
        optimized,
        rtol=rtol,
        atol=atol,
        input_shapes=parse_input_shapes(list(input_shape)),
        inputs_npz=inputs,
        seed=seed,
    )
    if fmt == "json":
        out.print_json(json.dumps(report.to_json()))
    else:
        table = Table(title=f"rtol {rtol:g}, atol {atol:g}", title_justify="left")
        for col in ("output", "max abs error", "max rel error", "result"):
            table.add_column(col)
        for o in report.outputs:
            verdict = "ok" if o.ok else f"DIFFERS {o.detail}"
            table.add_row(o.name, f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", verdict)
        out.print(table)
    if not report.ok:
        err.print(f"opfuse: verification failed: {report.failure()}", markup=False)
        sys.exit(1)


@app.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table")
def passes(fmt: str) -> None:
    """List every pass: switch name, section, default, opset range."""
    from opfuse.registry import all_passes, markdown_table

    infos = all_passes()
    if fmt == "markdown":
        click.echo(markdown_table(infos), nl=False)
        return
    if fmt == "json":
        rows = [
            {
                "name": p.name,
                "section": p.section,
                "default": "on" if p.default else "off",
                "mandatory": p.mandatory,
                "opset": p.opset_range,
                "description": p.description,
                "note": p.note,
                "patterns": [r.name for r in p.rules],
            }
            for p in infos
        ]
        out.print_json(json.dumps(rows))
        return
    table = Table()
    table.add_column("pass", no_wrap=True)
    for col in ("section", "default", "mandatory", "opset", "description"):
        table.add_column(col)
    for p in infos:
        desc = p.description + (f" ({p.note})" if p.note else "")
        default = "on" if p.default else "off"
        table.add_row(p.name, p.section, default, "yes" if p.mandatory else "", p.opset_range, desc)
    out.print(table)


from opfuse.advisor.cli import advise, profile  # noqa: E402  (the advisor's commands)

app.add_command(profile)
app.add_command(advise)

from opfuse.batching.cli import batch  # noqa: E402  (opfuse batch)

app.add_command(batch)


def main() -> None:
    """Console entry point: one-line errors and exit statuses instead of tracebacks."""
    try:
        app.main(standalone_mode=False)
    except OpfuseError as exc:
        if DEBUG["on"]:
            raise
        err.print(f"opfuse: error: {exc}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err.print("opfuse: aborted")
        sys.exit(130)
    except click.ClickException as exc:
        err.print(f"opfuse: error: {exc.format_message()}", soft_wrap=True, markup=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug of ours: still one line; --debug shows the trace
        if DEBUG["on"] or os.environ.get("OPFUSE_DEBUG"):
            raise
        err.print(
            f"opfuse: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
            soft_wrap=True,
            markup=False,
        )
        sys.exit(3)


if __name__ == "__main__":
    main()
