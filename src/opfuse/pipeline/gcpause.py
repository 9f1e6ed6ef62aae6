"""Python's cyclic garbage collector paused while the engine builds and rewrites a graph.

onnx-ir's nodes and values point at each other, so a loaded model is hundreds of thousands
of tracked objects; every full collection walks all of them while nothing they hold is
garbage yet. On a 40,000-node model the collector took 15% of ``optimize`` and pausing it
raised peak memory by 3% (``bench/scale.py``'s model). One collection runs when the pause
ends, so the cycles the rewrites left are freed then, unless the process optimizes one
model and exits (``opfuse optimize``): that final collection walked every object once
more (0.35 s on the same model) to free memory the exit frees anyway, so there the
objects are frozen instead (never scanned again)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_ONE_SHOT = {"on": False}


def one_model_per_process() -> None:
    """Declare that this process exits after one model (a CLI command): pauses then end
    by freezing what is alive instead of collecting it."""
    _ONE_SHOT["on"] = True


@contextmanager
def paused_gc() -> Iterator[None]:
    """No automatic collection inside; nested pauses and a collector the caller had
    already disabled are left as they are."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if _ONE_SHOT["on"]:
            gc.freeze()  # later collections skip these objects; the exit frees them
        else:
            gc.collect()
        gc.enable()
