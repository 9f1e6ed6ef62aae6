"""The ``opfuse`` command line: optimize, verify, passes.

Errors are one line on stderr with exit status 2 (1 for a failed verification), never a
traceback unless ``--debug`` is given. Logs, warnings and progress go to stderr; stdout
holds only the result (a table, or JSON with ``--format json``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from opfuse import __version__
from opfuse.advisor.cli import advise, profile
from opfuse.batching.cli import batch
from opfuse.cli_options import graph_options
from opfuse.errors import EXIT_STATUSES, OpfuseError
from opfuse.phases import Phases
from opfuse.tune_cli import (
    benchmark_lines,
    opset_hints,
    refuse_without_benchmark,
    runtime_options,
    settings_from,
    tune,
)

# piped output keeps whole names (rich would cut tables at 80 columns)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 240)
DEBUG = {"on": False}
LOG_LEVELS = ("error", "warning", "info", "debug")
PathArg = click.Path(path_type=Path)


@contextmanager
def progress() -> Iterator[Phases]:
    """Phase timing; on a terminal also a spinner on stderr naming the phase under way."""
    if not err.is_terminal:
        yield Phases()
        return
    with err.status("starting") as status:
        yield Phases(lambda text: status.update(f"{text} ..."))


def _deprecated(old: str, new: str) -> None:
    """An old option name still works, with this warning."""
    err.print(f"opfuse: warning: {old} is deprecated; use {new}", markup=False)


def _names(values: tuple[str, ...]) -> list[str]:
    """Accept repeated options and comma-separated lists alike."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_STATUSES)
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
                "--input-shape",
                multiple=True,
                help="Dims for dynamic inputs: NAME:1,3,224,224 (repeatable). "
                "[default: 1 for the first dynamic axis, 32 for the others]",
            ),
            click.option(
                "--verify-inputs",
                type=PathArg,
                help=".npz of input arrays for the verifier (instead of random inputs).",
            ),
            click.option("--seed", default=0, show_default=True, help="Seed of the random inputs."),
            click.option(
                "--save-failing-inputs",
                type=PathArg,
                help="On a failed verification, write its inputs to this .npz "
                "(replay them with --verify-inputs).",
            ),
        ]
    ):
        f = option(f)
    return f


@app.command(epilog=EXIT_STATUSES)
@click.argument("model", type=PathArg)
@click.option("-o", "--output", type=PathArg, required=True, help="Where to write the result.")
@click.option(
    "--fusion-switch-file", type=PathArg, help="CANN-format JSON file turning passes on/off."
)
@click.option(
    "--enable", multiple=True, help="Turn a pass on (overrides the switch file; repeatable)."
)
@click.option(
    "--disable", multiple=True, help="Turn a pass off (overrides the switch file; repeatable)."
)
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
@click.option("--inputs", "old_inputs", multiple=True, hidden=True)
@click.option("--outputs", "old_outputs", multiple=True, hidden=True)
@click.option("--fusion-result", type=PathArg, help="Write CANN's fusion_result.json here.")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="warning",
    show_default=True,
    help="info prints the effect log, debug also why patterns did not fire (on stderr).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Summary on stdout: a table, or JSON (counts, passes, verification, timings).",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare outputs with the input model before writing.",
)
@verifier_options
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
    fusion_switch_file: Path | None,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
    keep_inputs: tuple[str, ...],
    keep_outputs: tuple[str, ...],
    old_inputs: tuple[str, ...],
    old_outputs: tuple[str, ...],
    fusion_result: Path | None,
    log_level: str,
    fmt: str,
    verify: bool,
    rtol: float,
    atol: float,
    input_shape: tuple[str, ...],
    verify_inputs: Path | None,
    seed: int,
    save_failing_inputs: Path | None,
    bisect: bool,
    fold_size_limit: int,
    target_opset: int | None,
    layout: str,
    target: str | None,
    static_shapes: bool,
    benchmark: bool,
    **runtime: object,
) -> None:
    """Fuse and simplify MODEL, verify it, and write it to OUTPUT."""
    from opfuse.api import optimize_file
    from opfuse.public import make_options
    from opfuse.verify import parse_input_shapes

    for old, new, values in (
        ("--inputs", "--keep-inputs", old_inputs),
        ("--outputs", "--keep-outputs", old_outputs),
    ):
        if values:
            _deprecated(old, new)
    if static_shapes and not verify:
        raise OpfuseError("--static-shapes changes the model's inputs: drop --no-verify")
    _check_verifier_options(verify, verify_inputs, "--verify-inputs", input_shape)
    refuse_without_benchmark(benchmark)
    settings = settings_from(runtime)
    if benchmark:
        settings.make()  # a bad --runtime/--provider fails before the work
    options = make_options(
        fold_size_limit=fold_size_limit,
        target_opset=target_opset,
        layout=layout,
        target=target,
        keep_inputs=_names(keep_inputs + old_inputs),
        keep_outputs=_names(keep_outputs + old_outputs),
    )
    with progress() as phases:
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
            seed=seed,
            fusion_result=fusion_result,
            save_failing_inputs=save_failing_inputs,
            bisect=bisect,
            phases=phases,
            static_shapes=static_shapes,
        )
    if log_level != "error":
        for warning in result.warnings:
            err.print(f"opfuse: warning: {warning}", markup=False)
    if log_level in ("info", "debug"):
        for line in result.skipped:
            err.print(f"[INFO] OPFUSE {line}", soft_wrap=True, markup=False)
        for line in result.log.lines():
            err.print(f"[INFO] OPFUSE {line}", soft_wrap=True, markup=False)
    if log_level == "debug":
        for r in result.log.reasons():
            nodes = ", ".join(r["nodes"])  # type: ignore[arg-type]
            err.print(
                f"[DEBUG] OPFUSE {r['pass']}: pattern={r['pattern']} not applied "
                f"{r['count']}x: {r['reason']} ({nodes})",
                soft_wrap=True,
                markup=False,
            )
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        _print_summary(result, model, output)
        for line in opset_hints(result.model):
            out.print(f"note: {line}", markup=False)
    if benchmark:
        lines, warnings = benchmark_lines(
            model, output, settings, parse_input_shapes(list(input_shape)), verify_inputs
        )
        for line in lines:  # on stderr under --format json, which owns stdout
            (err if fmt == "json" else out).print(line, markup=False, soft_wrap=True)
        for warning in warnings:
            err.print(f"opfuse: warning: {warning}", markup=False, soft_wrap=True)


def _check_verifier_options(
    verify: bool, npz: Path | None, npz_option: str, input_shape: tuple[str, ...]
) -> None:
    """Refuse verifier options that would be ignored: with --no-verify any of them, and
    --input-shape next to an .npz (its arrays give the shapes)."""
    ctx = click.get_current_context()
    if not verify:
        given = [
            f"--{name.replace('_', '-')}"
            for name in (
                "verify_inputs",
                "input_shape",
                "rtol",
                "atol",
                "seed",
                "save_failing_inputs",
            )
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
    from opfuse.api import timings_text
    from opfuse.verdict import inputs_text

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
    if not result.changed:
        out.print("no pass changed the model (it was written unchanged)")
    report = result.verify
    if report is None:
        out.print("verification: off")
    else:
        out.print(f"verification: ok on inputs {inputs_text(report)}", markup=False)
        _print_outputs(report, indent="  ")
        if report.inputs:
            out.print("generated inputs: " + "; ".join(report.inputs), markup=False)
    out.print(f"{result.rounds} rounds; time: {timings_text(result.timings)}")
    for note in result.notes:
        out.print(f"note: {note}", markup=False)


def _print_outputs(report, indent: str = "") -> None:  # type: ignore[no-untyped-def]
    """One line per output: its error, the bound applied, the share the worst element used."""
    from opfuse.verdict import output_line

    for o in report.outputs:
        out.print(indent + output_line(o, report.rtol), markup=False, soft_wrap=True)


@app.command(epilog=EXIT_STATUSES)
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
    from opfuse.api import save_inputs
    from opfuse.io import check_output_path, read_proto
    from opfuse.verdict import bound_text, failure_message, inputs_text, share
    from opfuse.verify import compare_files, parse_input_shapes

    if old_inputs is not None:
        if verify_inputs is not None:
            raise OpfuseError("--inputs is the old name of --verify-inputs; give only one")
        _deprecated("--inputs", "--verify-inputs")
        verify_inputs = old_inputs
    _check_verifier_options(True, verify_inputs, "--verify-inputs", input_shape)
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


@app.command(epilog=EXIT_STATUSES)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "markdown"]),
    default="table",
    show_default=True,
    help="A table, JSON, or the markdown of docs/PASSES.md.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Every column (section, mandatory, opset, patterns) and the whole description.",
)
def passes(fmt: str, verbose: bool) -> None:
    """List every pass in execution order: switch name, default, what it does."""
    from opfuse.passes import all_passes
    from opfuse.registry import markdown_table

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
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table()
    table.add_column("pass", no_wrap=True, min_width=max(len(p.name) for p in infos))
    table.add_column("default", no_wrap=True, min_width=3 if verbose else len("on (mandatory)"))
    if verbose:
        for col in ("section", "mandatory", "opset", "patterns"):
            table.add_column(col)
        table.add_column("description", ratio=1)
    else:
        table.add_column("summary", no_wrap=True, overflow="ellipsis")
    for p in infos:
        if verbose:
            desc = p.description + (f" ({p.note})" if p.note else "")
            patterns = ", ".join(r.name for r in p.rules) or "(graph pass)"
            table.add_row(
                p.name,
                "on" if p.default else "off",
                p.section,
                "yes" if p.mandatory else "",
                p.opset_range,
                patterns,
                desc,
            )
        else:
            mandatory = " (mandatory)" if p.mandatory else ""
            table.add_row(p.name, ("on" if p.default else "off") + mandatory, p.summary)
    out.print(table)
    if not verbose:
        out.print("opfuse passes --verbose: every column and the whole description")


app.add_command(profile)
app.add_command(advise)
app.add_command(tune)
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
