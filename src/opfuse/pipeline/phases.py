"""Wall time per phase of a run (load, optimize, verify, write), and a hook that shows
each phase as it starts (the CLI's spinner on a terminal; nothing otherwise)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Phases:
    """Accumulates seconds per phase name; ``show`` hears what is being done now."""

    def __init__(self, show: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._show = show

    def tell(self, text: str) -> None:
        if self._show is not None:
            self._show(text)

    @contextmanager
    def __call__(self, name: str, detail: str | None = None) -> Iterator[None]:
        self.tell(detail or name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
