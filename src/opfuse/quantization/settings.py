"""What ``opfuse quantize`` does (``QuantizeSettings``): one frozen object that checks
itself in the API's terms (``samples=0: must be 1 or more``; the command line says the
same with its flags, ``cli.options.flag_error``), parses its texts once (the gate, the
recipe, the preprocessing, the switch file) and writes itself back as the command line
that makes the same model (``command_line``: the "write it anyway" command)."""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from opfuse.errors import SettingsError
from opfuse.quantization import flow
from opfuse.quantization.gate import Gate
from opfuse.quantization.names import FALLBACK_TRIES
from opfuse.quantization.preprocess import Preprocess
from opfuse.quantization.steps import parse_recipe, recipe_name

if TYPE_CHECKING:
    from opfuse.pipeline.switch import SwitchTable

# a path, "random", or arrays in memory (a mapping of name -> N samples, or feeds)
Data = str | os.PathLike[str] | Mapping[str, Any] | Iterable[Mapping[str, Any]]
RANDOM = "random"

# the command line's flag of each setting that changes the model written, in the order the
# command names them (the others, and the defaults, are left out of it)
COMMAND_FLAGS = (
    ("eval", "--eval"),
    ("samples", "--samples"),
    ("preprocess", "--preprocess"),
    ("calibrate_method", "--calibrate-method"),
    ("activation_type", "--activation-type"),
    ("fusion_switch_file", "--fusion-switch-file"),
    ("target_opset", "--target-opset"),
)


@dataclass(frozen=True)
class QuantizeSettings:
    """The settings of ``opfuse.quantize`` (its keywords, ``opfuse quantize``'s options)
    but the model, the calibration data, the output paths and the runtime measured on.

    ``eval``: the samples accuracy is judged on (default: every 4th calibration sample,
    held back); ``samples``: the first N calibration samples; ``exclude``: op types, node
    names or ``leading=SHARE`` kept in float; ``max_drop``: the gate (``Gate.parse``);
    ``recipe``: ``auto`` or steps (``steps.parse_recipe``); ``fallback_tries``: how many
    mixed-precision tries the fallback may make (0: none; a count, not seconds, so that
    the model written does not depend on the machine's load); ``write_slower``: write the
    int8 model even where it is not faster than the float optimized model beyond the
    noise (by default that is exit 1, naming the faster model and its command)."""

    eval: Data | None = None
    samples: int | None = None
    preprocess: str | Preprocess | None = None  # the text, or parsed
    exclude: Sequence[str] = ()
    max_drop: str = "auto"
    recipe: str = "auto"
    fallback_tries: int = FALLBACK_TRIES
    target_opset: int | None = None
    min_speedup: float | None = None
    benchmark: bool = True
    write_slower: bool = False  # write int8 even where the float optimized model is faster
    calibrate_method: str = "minmax"
    per_channel: bool = True
    activation_type: str = "uint8"
    fusion_switch_file: str | os.PathLike[str] | None = None
    enable: Sequence[str] = ()
    disable: Sequence[str] = ()
    # the task's own measure on the eval samples (the Python API): a function of one
    # model's outputs (per sample, name -> array) to a number, higher is better
    metric: Callable[[list[dict[str, Any]]], float] | None = None

    def __post_init__(self) -> None:
        for name in ("exclude", "enable", "disable"):
            object.__setattr__(self, name, _names(name, getattr(self, name)))
        _check_count("samples", self.samples, 1)
        _check_count("target_opset", self.target_opset, 1)
        _check_count("fallback_tries", self.fallback_tries, 0)
        for name in ("max_drop", "recipe", "calibrate_method", "activation_type"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise SettingsError(name, type(value).__name__, "expected a string")
        if self.activation_type not in flow.ACTIVATION_TYPES:
            raise SettingsError("activation_type", self.activation_type, "expected uint8 or int8")
        if self.calibrate_method not in flow.CALIBRATE_METHODS:
            methods = ", ".join(flow.CALIBRATE_METHODS)
            raise SettingsError("calibrate_method", self.calibrate_method, f"one of {methods}")
        if self.min_speedup is not None:
            if not self.min_speedup > 0:
                raise SettingsError("min_speedup", float(self.min_speedup), "must be more than 0")
            if not self.benchmark:
                raise SettingsError(
                    "min_speedup",
                    float(self.min_speedup),
                    sentence="{min_speedup} needs the speed measured, which {benchmark} "
                    "turns off: drop one of them",
                )
        if self.metric is not None and not callable(self.metric):
            raise SettingsError("metric", type(self.metric).__name__, "expected a function")
        # the texts parsed now: a bad one is refused before any work
        _ = (self.gate, self.forced, self.preprocessing)

    @cached_property
    def gate(self) -> Gate:
        return Gate.parse(self.max_drop)

    @cached_property
    def forced(self) -> tuple[str, ...] | None:
        """The recipe's steps, or None for ``auto`` (the search)."""
        return parse_recipe(self.recipe)

    @cached_property
    def preprocessing(self) -> Preprocess | None:
        if isinstance(self.preprocess, Preprocess) or self.preprocess is None:
            return self.preprocess
        if not isinstance(self.preprocess, str):
            raise SettingsError("preprocess", self.preprocess, "expected a string")
        return Preprocess.parse(self.preprocess) if self.preprocess else None

    @property
    def options(self) -> flow.QuantOptions:
        """What onnxruntime's quantizer is told."""
        return flow.QuantOptions(self.per_channel, self.activation_type, self.calibrate_method)

    def switch_table(self) -> SwitchTable | None:
        from opfuse.pipeline.switch import parse_switch_file

        if self.fusion_switch_file is None:
            return None
        return parse_switch_file(self.fusion_switch_file)

    def replace(self, **changes: Any) -> QuantizeSettings:
        return dataclasses.replace(self, **changes)

    def command_line(
        self,
        model: str | os.PathLike[str] | None,
        output: str | os.PathLike[str] | None,
        calibration: Data,
        runtime: str = "onnxruntime",
    ) -> str:
        """The ``opfuse quantize`` command that makes the model these settings make: the
        options that change the model written (defaults left out), ``--runtime`` (the
        form written), then ``--recipe``, ``--max-drop`` and ``--exclude`` where they are
        not the defaults. Calibration or eval data in memory cannot be said on a command
        line, nor a model in memory (``model`` None): then the ``opfuse.quantize`` call
        with the keywords that rebuild it."""
        in_memory = not _on_disk(calibration) or (self.eval is not None and not _on_disk(self.eval))
        if model is None or in_memory or self.metric is not None:
            return self._python_call()
        words = ["opfuse", "quantize", str(model), "-o", str(output), "--calibration"]
        words.append(str(calibration))
        default = QuantizeSettings()
        for name, flag in COMMAND_FLAGS:
            value = getattr(self, name)
            if value is not None and value != getattr(default, name):
                words += [flag, str(value)]
        words += ["--runtime", runtime] if runtime != "onnxruntime" else []
        words += ["--per-tensor"] if not self.per_channel else []
        words += [w for name in self.enable for w in ("--enable", name)]
        words += [w for name in self.disable for w in ("--disable", name)]
        words += ["--recipe", self.recipe] if self.recipe != default.recipe else []
        words += ["--max-drop", self.max_drop] if self.max_drop != default.max_drop else []
        words += [w for item in self.exclude for w in ("--exclude", item)]
        return shlex.join(words)

    def optimize_command(
        self, model: str | os.PathLike[str] | None, output: str | os.PathLike[str] | None
    ) -> str:
        """The ``opfuse optimize`` command that writes the float optimized model these
        settings fuse (the switch file, the passes turned on or off, the opset)."""
        if model is None:
            return "opfuse.optimize(...) (the same enable, disable and target_opset)"
        words = ["opfuse", "optimize", str(model), "-o", str(output)]
        if self.fusion_switch_file is not None:
            words += ["--fusion-switch-file", str(self.fusion_switch_file)]
        words += [w for name in self.enable for w in ("--enable", name)]
        words += [w for name in self.disable for w in ("--disable", name)]
        if self.target_opset is not None:
            words += ["--target-opset", str(self.target_opset)]
        return shlex.join(words)

    def _python_call(self) -> str:
        return (
            f"opfuse.quantize(..., recipe={self.recipe!r}, "
            f"exclude={list(self.exclude)!r}, max_drop={self.max_drop!r})"
        )

    def written_anyway(self, recipe: tuple[str, ...], exclude: Sequence[str]) -> QuantizeSettings:
        """These settings with the gate off, ``recipe`` and ``exclude``: what rebuilds the
        best model a missed gate reached."""
        return self.replace(recipe=recipe_name(recipe), exclude=tuple(exclude), max_drop="off")


def _on_disk(data: object) -> bool:
    return isinstance(data, str | os.PathLike)


def _names(name: str, values: object) -> tuple[str, ...]:
    """A sequence of names as a tuple (one string is one name, not its letters)."""
    if isinstance(values, str):
        values = (values,)
    if not isinstance(values, Iterable) or not all(isinstance(v, str) for v in values):
        raise SettingsError(name, values, "expected a list of op types or node names")
    return tuple(values)


def _check_count(name: str, value: object, least: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(name, value, "expected an int")
    if value < least:
        raise SettingsError(name, value, f"a count of at least {least}")


__all__ = ["RANDOM", "Data", "QuantizeSettings"]
