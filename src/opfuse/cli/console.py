"""The command line's consoles (results on stdout, everything else on stderr), the
``--debug`` switch and the progress spinner every command shows on a terminal.

Widths: ``COLUMNS`` when it is set, on a terminal or not (``COLUMNS=100 opfuse ... > out.txt``
draws 100 columns); else the terminal's width; else (a pipe, a file) ``DEFAULT_WIDTH``.
Read when a console draws, not when it is made, so a changed ``COLUMNS`` counts."""

from __future__ import annotations

import inspect
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, ConsoleDimensions

from opfuse.pipeline.phases import Phases

DEFAULT_WIDTH = 100  # off a terminal, without COLUMNS


def env_columns() -> int | None:
    """``COLUMNS`` as a positive number of columns, or None when unset or not a number."""
    value = os.environ.get("COLUMNS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


class WidthConsole(Console):
    """A rich Console whose width follows the rule above (a ``width`` given is kept)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._fixed = kwargs.get("width")
        super().__init__(*args, **kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._fixed is not None:
            return dims
        columns = env_columns()
        if columns is not None:
            return ConsoleDimensions(columns, dims.height)
        if self.is_terminal:
            return dims
        return ConsoleDimensions(DEFAULT_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._fixed = new_size[0]
        inspect.getattr_static(Console, "size").fset(self, new_size)  # rich's own setter


def console(**kwargs: Any) -> Console:
    """A console on stdout (``stderr=True``: stderr) with the widths above."""
    kwargs.setdefault("highlight", False)
    return WidthConsole(**kwargs)


def text_width() -> int:
    """The width for text written to a file (``-o``): COLUMNS, else ``DEFAULT_WIDTH``."""
    return env_columns() or DEFAULT_WIDTH


def recorder() -> Console:
    """A console that records plain text for a file (``-o``), ``text_width()`` wide."""
    return console(record=True, width=text_width(), file=io.StringIO(), color_system=None)


out = console()
err = console(stderr=True)
DEBUG = {"on": False}


@contextmanager
def progress() -> Iterator[Phases]:
    """Phase timing; on a terminal also a spinner on stderr naming the phase under way."""
    if not err.is_terminal:
        yield Phases()
        return
    with err.status("starting") as status:
        yield Phases(lambda text: status.update(f"{text} ..."))


def deprecated(old: str, new: str) -> None:
    """An old option name still works, with this warning."""
    err.print(f"opfuse: warning: {old} is deprecated; use {new}", markup=False)


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def print_wrapped(target: Console, line: str, hang: int = 4) -> None:
    """``line`` as plain text, broken between words at ``target``'s width (its leading
    spaces kept, the lines after the first indented ``hang`` more)."""
    import textwrap

    lead = " " * (len(line) - len(line.lstrip()))
    for part in textwrap.wrap(
        line.strip(), target.width, initial_indent=lead, subsequent_indent=lead + " " * hang
    ) or [""]:
        target.print(part, markup=False, soft_wrap=True)
