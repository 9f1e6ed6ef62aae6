"""The command line's options, declared once for every command that takes them: the
graph-shaping options (optimize, batch), the verifier's (optimize, verify), the runtime's
(optimize --benchmark, tune), and the checks that refuse options a run would ignore."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from opfuse.advisor.profile_readers import GRAPH_OPT_LEVELS as PROFILE_GRAPH_OPT_LEVELS
from opfuse.advisor.settings import ProfileSettings
from opfuse.errors import OpfuseError, SettingsError
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT
from opfuse.runtime import GRAPH_OPT_LEVELS, RUNTIMES
from opfuse.runtime.settings import RuntimeSettings
from opfuse.runtime.targets import builtin_targets

F = TypeVar("F", bound=Callable[..., object])
PathArg = click.Path(path_type=Path)
RUNTIME_OPTIONS = ("runtime", "provider", "threads", "graph_opt", "bench_seconds")


def names(values: tuple[str, ...]) -> list[str]:
    """Accept repeated options and comma-separated lists alike."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def graph_options(f: F) -> F:
    """--fold-size-limit, --target-opset, --layout, --target."""
    for option in reversed(
        [
            click.option(
                "--fold-size-limit",
                default=DEFAULT_FOLD_SIZE_LIMIT,
                show_default=True,
                help="Largest constant (bytes) a fold may create, unless it frees as much; "
                "a fold also grows the model by at most 4 KiB.",
            ),
            click.option(
                "--target-opset",
                type=int,
                help="Convert to this opset first (enables newer fusions). "
                "[default: keep the model's]",
            ),
            click.option(
                "--layout",
                type=click.Choice(["keep", "nchw", "nhwc"]),
                default="keep",
                show_default=True,
                help="Layout of image inputs/outputs; nchw changes the model's interface.",
            ),
            click.option(
                "--target",
                type=click.Choice(builtin_targets()),
                help="Runtime whose UBFusion passes may run. [default: none]",
            ),
        ]
    ):
        f = option(f)
    return f


def verifier_options(f: F) -> F:
    """--rtol, --atol, --input-shape, --verify-inputs, --seed, --save-failing-inputs."""
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


def check_verifier_options(
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


def runtime_options(f: Callable) -> Callable:
    """--runtime, --provider, --threads, --graph-opt, --bench-seconds (into ``runtime``)."""
    options = [
        click.option(
            "--runtime",
            type=click.Choice(RUNTIMES),
            default="onnxruntime",
            show_default=True,
            help="Runtime to measure on (openvino: pip install 'opfuse[openvino]').",
        ),
        click.option(
            "--provider", help="onnxruntime execution provider [default: CPUExecutionProvider]."
        ),
        click.option(
            "--threads", default=1, show_default=True, help="Intra-op threads (0: the runtime's)."
        ),
        click.option(
            "--graph-opt",
            type=click.Choice(GRAPH_OPT_LEVELS),
            default="all",
            show_default=True,
            help="onnxruntime's graph optimization level while measuring (all: what users run).",
        ),
        click.option(
            "--bench-seconds",
            default=5.0,
            show_default=True,
            help="Measuring time per comparison, after the warm-up.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def settings_from(kwargs: dict[str, object]) -> RuntimeSettings:
    """Pop the runtime options out of a command's keyword arguments."""
    return RuntimeSettings(**{k: kwargs.pop(k) for k in RUNTIME_OPTIONS})  # type: ignore[arg-type]


def refuse_without_benchmark(benchmark: bool) -> None:
    """Runtime options without --benchmark would be ignored: refuse them."""
    if benchmark:
        return
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in RUNTIME_OPTIONS
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        one = len(given) == 1
        raise OpfuseError(
            f"{', '.join(given)} only appl{'ies' if one else 'y'} with --benchmark; "
            f"add it or drop {'it' if one else 'them'}"
        )


# -- the profiling options of opfuse profile and opfuse advise, and settings errors as flags

PROFILE_OPTIONS = ("runs", "warmup", "threads", "provider", "graph_opt", "input_shape")


def profile_options(graph_opt_default: str | None, graph_opt_help: str) -> Callable[[F], F]:
    """--runs, --warmup, --threads, --provider, --graph-opt, --input-shape: the profiling
    options of ``profile`` and ``advise``, declared once with ``ProfileSettings``'s
    defaults (``profile_settings`` makes the object). Only --graph-opt's default is the
    command's own: profile shows the graph onnxruntime deploys (all), advise a time per
    node (disable, all for a QDQ model)."""
    d = ProfileSettings()
    options = [
        click.option("--runs", default=d.runs, show_default=True, help="Profiled inference runs."),
        click.option(
            "--warmup", default=d.warmup, show_default=True, help="Runs dropped before profiling."
        ),
        click.option(
            "--threads", default=d.threads, show_default=True, help="Intra-op threads (0: default)."
        ),
        click.option(
            "--provider",
            default=d.provider,
            show_default=True,
            help="onnxruntime execution provider.",
        ),
        click.option(
            "--graph-opt",
            type=click.Choice(PROFILE_GRAPH_OPT_LEVELS),
            default=graph_opt_default,
            show_default=graph_opt_default is not None,
            help=graph_opt_help,
        ),
        click.option(
            "--input-shape", multiple=True, help="Dims for dynamic inputs: NAME:1,3,224,224."
        ),
    ]

    def decorate(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def profile_settings(kwargs: dict[str, object]) -> ProfileSettings:
    """Pop the profiling options out of a command's keyword arguments, into the settings
    (a bad value: its flag's one-line error)."""
    from opfuse.verification.compare import parse_input_shapes

    given: dict[str, Any] = {k: kwargs.pop(k) for k in PROFILE_OPTIONS}
    shapes = parse_input_shapes(list(given.pop("input_shape")))
    try:
        return ProfileSettings(**given, input_shapes=shapes)
    except SettingsError as exc:
        flag_error(click.get_current_context(), exc)


def flag_error(ctx: click.Context, err: SettingsError) -> NoReturn:
    """A settings object's ``SettingsError`` said with the command's flags: ``--budget 0:
    must be more than 0`` for ``budget=0: must be more than 0`` (a flag without its value:
    ``--static-shapes needs --input-shape ...``); the other settings the problem names are
    flags too. An error of a setting the command has no option for is raised as it is."""
    flags = {
        p.name: max(p.opts, key=len)
        for p in ctx.command.params
        if isinstance(p, click.Option) and p.name
    }
    option = next(
        (p for p in ctx.command.params if isinstance(p, click.Option) and p.name == err.field),
        None,
    )
    if option is None:
        raise err
    problem = re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: flags.get(m[0], m[0]), err.problem)
    value = f"{err.value:g}" if isinstance(err.value, float) else str(err.value)
    said = (
        f"{flags[err.field]} {problem}"
        if option.is_flag
        else f"{flags[err.field]} {value}: {problem}"
    )
    raise OpfuseError(said) from None
