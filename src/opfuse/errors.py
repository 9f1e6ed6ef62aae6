"""Errors the CLI turns into a one-line message and an exit status."""

from __future__ import annotations


class OpfuseError(Exception):
    """Bad input or a refused operation: one line for the user, exit status 2."""

    exit_code = 2


class VerificationError(OpfuseError):
    """The optimized model's outputs differ from the original's: exit status 1."""

    exit_code = 1


class EngineError(OpfuseError):
    """The rewrite engine could not reach a fixpoint (rules that undo each other)."""

    exit_code = 2
