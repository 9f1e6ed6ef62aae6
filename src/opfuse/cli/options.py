"""The command line's options, declared once for every command that takes them: the
graph-shaping options (optimize, batch), the verifier's (optimize, verify), the runtime's
(optimize --benchmark, tune, quantize); ``settings_from``, which parses a command's options
into the API's settings objects (``OptimizeSettings``, ``VerifySettings``,
``RuntimeSettings``); ``flag_error``, which says an API ``SettingsError`` with the
command's flags; and the checks that refuse options a run would ignore."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar, overload

import click

from opfuse.advisor.profile_readers import GRAPH_OPT_LEVELS as PROFILE_GRAPH_OPT_LEVELS
from opfuse.advisor.settings import ProfileSettings
from opfuse.errors import OpfuseError, SettingsError
from opfuse.quantization.names import FALLBACK_TRIES, KEYS_HELP, RECIPE_HELP
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT
from opfuse.runtime import GRAPH_OPT_LEVELS, RUNTIMES
from opfuse.runtime.settings import RuntimeSettings
from opfuse.runtime.targets import builtin_targets

F = TypeVar("F", bound=Callable[..., object])
PathArg = click.Path(path_type=Path)
S = TypeVar("S")


def names(values: tuple[str, ...]) -> list[str]:
    """Accept repeated options and comma-separated lists alike."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def _input_shapes(specs: tuple[str, ...]) -> dict[str, list[int]]:
    from opfuse.verification.compare import parse_input_shapes

    return parse_input_shapes(list(specs))


# how an option's text becomes its setting's value (the others are taken as click gives them)
PARSERS: dict[str, Callable[[Any], object]] = {
    "input_shape": _input_shapes,
    "enable": names,
    "disable": names,
    "keep_inputs": names,
    "keep_outputs": names,
}


def format_option(text: str, *formats: str) -> Callable[[F], F]:
    """--format (into ``fmt``) with the help ``text``: ``formats``, the first the default
    [table, json]."""
    formats = formats or ("table", "json")
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(list(formats)),
        default=formats[0],
        show_default=True,
        help=text,
    )


class Group:
    """Options declared once, by parameter name (the field of the settings object they
    parse into; the flag is the name with dashes): ``@GROUP`` adds them all to a command,
    ``@GROUP.only(*names, **helps)`` some of them, with the command's own help texts."""

    def __init__(self, **options: dict[str, Any]) -> None:
        self.options = options

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.options)

    def __call__(self, f: F) -> F:
        return self.only(*self.options)(f)

    def only(self, *names: str, **helps: str) -> Callable[[F], F]:
        def add(f: F) -> F:
            for name in reversed(names):
                attrs = {**self.options[name], **({"help": helps[name]} if name in helps else {})}
                decls = attrs.pop("param_decls", ["--" + name.replace("_", "-")])
                f = click.option(*decls, **attrs)(f)
            return f

        return add


# the passes: a switch file, --enable, --disable (optimize, batch)
switch_options = Group(
    fusion_switch_file={"type": PathArg, "help": "CANN-format JSON file turning passes on/off."},
    enable={"multiple": True, "help": "Turn a pass on (overrides the switch file; repeatable)."},
    disable={"multiple": True, "help": "Turn a pass off (overrides the switch file; repeatable)."},
)
# --fold-size-limit, --target-opset, --layout, --target (optimize, batch)
graph_options = Group(
    fold_size_limit={
        "default": DEFAULT_FOLD_SIZE_LIMIT,
        "show_default": True,
        "help": "Largest constant (bytes) a fold may create, unless it frees as much; "
        "a fold also grows the model by at most 4 KiB.",
    },
    target_opset={
        "type": int,
        "help": "Convert to this opset first (enables newer fusions). [default: keep the model's]",
    },
    layout={
        "type": click.Choice(["keep", "nchw", "nhwc"]),
        "default": "keep",
        "show_default": True,
        "help": "Layout of image inputs/outputs; nchw changes the model's interface.",
    },
    target={
        "type": click.Choice(builtin_targets()),
        "help": "Runtime whose UBFusion passes may run. [default: none]",
    },
)
# --rtol, --atol, --input-shape, --inputs, --verify-inputs, --seed, --save-failing-inputs
# (optimize, verify; tune and batch some of them)
verifier_options = Group(
    rtol={"default": 1e-4, "show_default": True, "help": "Relative tolerance."},
    atol={
        "default": 1e-5,
        "show_default": True,
        "help": "Absolute tolerance, scaled by the output's magnitude.",
    },
    input_shape={
        "multiple": True,
        "help": "Dims for dynamic inputs: NAME:1,3,224,224 (repeatable). "
        "[default: 1 for the first dynamic axis, 32 for the others]",
    },
    inputs={
        "type": PathArg,
        "help": ".npz of arrays named after the model's inputs, run instead of generated "
        "inputs. [default: generated]",
    },
    verify_inputs={"type": PathArg, "help": "The older name of --inputs."},
    seed={"default": 0, "show_default": True, "help": "Seed of the random inputs."},
    save_failing_inputs={
        "type": PathArg,
        "help": "On a failed verification, write its inputs to this .npz "
        "(replay them with --inputs).",
    },
)
# --runtime, --provider, --threads, --graph-opt, --bench-seconds (optimize --benchmark,
# tune, quantize)
runtime_options = Group(
    runtime={
        "type": click.Choice(RUNTIMES),
        "default": "onnxruntime",
        "show_default": True,
        "help": "Runtime to measure on (openvino: pip install 'opfuse[openvino]').",
    },
    provider={"help": "onnxruntime execution provider [default: CPUExecutionProvider]."},
    threads={"default": 1, "show_default": True, "help": "Intra-op threads (0: the runtime's)."},
    graph_opt={
        "type": click.Choice(GRAPH_OPT_LEVELS),
        "default": "all",
        "show_default": True,
        "help": "onnxruntime's graph optimization level while measuring (all: what users run).",
    },
    bench_seconds={
        "default": 5.0,
        "show_default": True,
        "help": "Measuring time per comparison, after the warm-up.",
    },
)

# the settings of opfuse quantize (``QuantizeSettings``), in the order --help lists them;
# the switch options (--fusion-switch-file, --enable, --disable) are switch_options'
quantize_options = Group(
    eval={
        "type": PathArg,
        "help": "Samples to measure accuracy on [default: every 4th calibration sample, "
        "held back].",
    },
    samples={
        "type": int,
        "help": "Use the first N calibration samples (exit 2 when the data holds fewer).",
    },
    preprocess={
        "help": "Images: size=224,layout=NCHW,order=RGB,scale=1/255,mean=0.485:0.456:0.406,std=...",
    },
    exclude={
        "multiple": True,
        "help": "An op type or node name kept in float, or leading=SHARE: the leading layers up "
        "to that share of the multiply-adds (e.g. leading=25%) (repeatable).",
    },
    max_drop={
        "default": "auto",
        "show_default": True,
        "help": f"Accuracy gate on the held-back samples, {KEYS_HELP}.",
    },
    recipe={"default": "auto", "show_default": True, "help": f"Accuracy recovery: {RECIPE_HELP}."},
    fallback_tries={
        "type": int,
        "default": FALLBACK_TRIES,
        "show_default": True,
        "help": "Tries the fallback may make keeping sensitive parts in float (0: none); a "
        "count, so the same model on a busy machine.",
    },
    target_opset={
        "type": int,
        "help": "Convert to this opset before fusing (e.g. 14: a decomposed HardSwish becomes "
        "one op).",
    },
    min_speedup={"type": float, "help": "Exit 1, nothing written, below this speed-up."},
    benchmark={
        "param_decls": ["--no-benchmark", "benchmark"],
        "is_flag": True,
        "flag_value": False,
        "default": True,
        "help": "Do not measure the speed.",
    },
    write_slower={
        "is_flag": True,
        "help": "Write the int8 model even where it is not faster than the float optimized "
        "model beyond the noise [default: exit 1, naming the faster model].",
    },
    calibrate_method={
        "type": click.Choice(("minmax", "entropy", "percentile")),
        "default": "minmax",
        "show_default": True,
        "help": "How the calibration picks each activation's range.",
    },
    per_channel={
        "param_decls": ["--per-tensor", "per_channel"],
        "is_flag": True,
        "flag_value": False,
        "default": True,
        "help": "Per-tensor weights [default: per channel].",
    },
    activation_type={
        "type": click.Choice(("uint8", "int8")),
        "default": "uint8",
        "show_default": True,
        "help": "The activations' integer type (the weights are int8).",
    },
)


def refuse_without_verify(verify: bool, benchmark: bool = False) -> None:
    """Verifier options with --no-verify would be ignored: refuse them (but the inputs and
    their shapes with --benchmark, which times on them)."""
    timing = () if benchmark else ("inputs", "verify_inputs", "input_shape")
    _refuse_ignored(
        (*timing, "rtol", "atol", "seed", "save_failing_inputs"),
        not verify,
        "{flags} {has} no effect with --no-verify (no verification runs); drop {it} or --no-verify",
    )


def _refuse_ignored(names: tuple[str, ...], ignored: bool, message: str) -> None:
    """Refuse the flags of ``names`` given on the command line when a run ``ignored``
    them; ``message`` says why (``{flags}``, ``{has}``, ``{applies}``, ``{it}`` agree
    with how many there are)."""
    given = _given(names) if ignored else []
    if given:
        one = len(given) == 1
        raise OpfuseError(
            message.format(
                flags=", ".join(given),
                has="has" if one else "have",
                applies="applies" if one else "apply",
                it="it" if one else "them",
            )
        )


def _given(names: tuple[str, ...]) -> list[str]:
    """The flags of ``names`` given on the command line (not left at their default)."""
    ctx = click.get_current_context()
    return [
        f"--{name.replace('_', '-')}"
        for name in names
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]


@overload
def settings_from(params: dict[str, Any]) -> RuntimeSettings: ...
@overload
def settings_from(params: dict[str, Any], kind: type[S]) -> S: ...
def settings_from(params: dict[str, Any], kind: type[Any] = RuntimeSettings) -> Any:
    """Pop the options that are fields of ``kind`` (a settings type) out of a command's
    keyword arguments, parsed (``--input-shape`` text, comma-separated pass names), into
    one: the API checks them (``flag_error`` says a refusal with the flag)."""
    picked = {f.name: params.pop(f.name) for f in fields(kind) if f.name in params}
    for name, parse in PARSERS.items():
        if name in picked:
            picked[name] = parse(picked[name])
    return kind(**picked)


# a setting whose option's parameter has another name (ProfileSettings' input_shapes)
ALIASES = {"input_shapes": "input_shape"}


def flag_error(exc: SettingsError) -> OpfuseError:
    """The API's ``SettingsError`` (``bench_seconds=0: must be more than 0``) said with
    the running command's flags (``--bench-seconds 0: must be more than 0``): each setting
    named as the option whose parameter has its name."""
    ctx = click.get_current_context(silent=True)
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}

    def flag(name: str) -> str:
        param = params.get(name) or params.get(ALIASES.get(name, ""))
        if not isinstance(param, click.Option):
            return name
        return next((o for o in param.opts if o.startswith("--")), param.opts[0])

    return OpfuseError(exc.text(flag, " "))


def speaks_flags(command: click.Command) -> click.Command:
    """``command`` with the API's refusals (``SettingsError``) said in its flags."""
    callback = command.callback
    assert callback is not None

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except SettingsError as exc:
            raise flag_error(exc) from None

    command.callback = run
    return command


def refuse_without_benchmark(benchmark: bool) -> None:
    """Runtime options without --benchmark would be ignored: refuse them."""
    _refuse_ignored(
        runtime_options.names,
        not benchmark,
        "{flags} only {applies} with --benchmark; add it or drop {it}",
    )


# -- the profiling options of opfuse profile and opfuse advise

PROFILE_OPTIONS = ("runs", "warmup", "threads", "provider", "graph_opt", "input_shape", "inputs")


def profile_options(graph_opt_default: str | None, graph_opt_help: str) -> Callable[[F], F]:
    """--runs, --warmup, --threads, --provider, --graph-opt, --input-shape, --inputs: the
    profiling options of ``profile`` and ``advise``, declared once with ``ProfileSettings``'s
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
        click.option(
            "--inputs",
            type=PathArg,
            help=".npz of arrays named after the model's inputs, profiled (and timed) instead "
            "of generated inputs. [default: generated]",
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
    return ProfileSettings(**given, input_shapes=shapes)  # refused: speaks_flags says it
