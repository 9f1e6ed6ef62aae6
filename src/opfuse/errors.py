"""Errors the CLI turns into a one-line message and an exit status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EXIT_STATUSES = (
    "Exit status: 0 done; 1 verification failed (nothing written); 2 bad input or a "
    "refused option (one line on stderr, nothing written); 3 internal error; 130 interrupted."
)


def first_line(exc: BaseException) -> str:
    """An exception's first non-empty line, or its type's name when it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class OpfuseError(Exception):
    """Bad input or a refused operation: one line for the user, exit status 2."""

    exit_code = 2


class VerificationError(OpfuseError):
    """The optimized model's outputs differ from the original's: exit status 1.

    ``report``: the verifier's ``VerifyReport`` (None when the optimized model could not
    run); ``culprit``: the first pass whose output differs, when a bisection found one."""

    exit_code = 1

    def __init__(self, message: str, *, report: Any = None, culprit: str | None = None) -> None:
        super().__init__(message)
        self.report = report
        self.culprit = culprit


class EngineError(OpfuseError):
    """The rewrite engine could not reach a fixpoint (rules that undo each other)."""

    exit_code = 2


class GateError(OpfuseError):
    """opfuse quantize: the int8 model misses the accuracy gate (``--max-drop``) even with
    layers kept in float, or does not pay (``--min-speedup``): exit status 1, nothing
    written. ``report``: the figures."""

    exit_code = 1

    def __init__(self, message: str, *, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class SettingsError(OpfuseError):
    """A setting the API refuses. ``field`` is the API's name for it (a keyword of
    ``opfuse.optimize`` or an attribute of a settings object), ``value`` what was given and
    ``problem`` what is wrong, so that the command line can say it with its own flag
    (``cli.options.flag_error``) while the API's message names the keyword:
    ``bench_seconds=0: must be more than 0`` here, ``--bench-seconds 0: must be more than
    0`` on the command line.

    ``problem`` may name other settings as ``{name}``. A check between two settings gives
    the whole ``sentence`` instead (its settings as ``{name}``, the value as ``{value}``):
    ``{static_shapes} needs {input_shape} ...``."""

    def __init__(
        self, field: str, value: object, problem: str = "", *, sentence: str | None = None
    ) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        self.sentence = sentence
        super().__init__(self.text(lambda name: name, "="))

    def text(self, name: Callable[[str], str], joiner: str) -> str:
        """The message with each setting called ``name(setting)``; ``joiner`` goes between
        the setting and its value (``=`` in the API, a space on the command line)."""
        value = self.value
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        shown = str(value) if not isinstance(value, str | float) else shown
        names = _Names(name, shown)
        if self.sentence is not None:
            return self.sentence.format_map(names)
        return f"{name(self.field)}{joiner}{shown}: {self.problem.format_map(names)}"


class _Names(dict[str, str]):
    """``{setting}`` in a message: the setting's name as the caller says it."""

    def __init__(self, name: Callable[[str], str], value: str) -> None:
        super().__init__(value=value)
        self.name = name

    def __missing__(self, key: str) -> str:
        return self.name(key)
