"""Errors the CLI turns into a one-line message and an exit status."""

from __future__ import annotations

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
    (``cli.options.flag_error``) while the API's message names the keyword."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        super().__init__(f"{field}={shown}: {problem}")
