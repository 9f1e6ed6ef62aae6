"""The command line's consoles (results on stdout, everything else on stderr), the
``--debug`` switch and the progress spinner every command shows on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from opfuse.pipeline.phases import Phases

# piped output keeps whole names (rich would cut tables at 80 columns)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 240)
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
