"""The order effects a paired, interleaved latency measurement has to survive, measured on
one model with onnxruntime (CPU, one thread, ORT_ENABLE_ALL), and what opfuse's measurement
makes of a file identical to the original (issue 41):

1. **after itself**: one session run right after its own run against right after another
   session's run of the same file (its weights and buffers still in the caches, or not);
2. **sessions**: several sessions of the same file created one after another, then run in
   a cyclic order: each session's paired ratio to the first created, and each slot's median;
3. **identical file**: ``opfuse.tuning.measure`` of the model against itself, ``--repeat``
   times: the ratio, the noise it prints, and whether the ratio is within it.

    python -m bench.order_effects MODEL --shape x:1,3,48,192 [--sessions 4] [--rounds 600]

Figures are for the machine it runs on; run it on a quiet one (``uptime`` first)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from bench.measure import session


def after_itself(model: str, feeds: dict[str, np.ndarray], rounds: int) -> tuple[float, float]:
    """(median ms after another session's run, paired ratio after another / after itself)."""
    a, b = session(model, "all"), session(model, "all")
    for s in (a, b):
        for _ in range(3):
            s.run(None, feeds)
    other, itself = [], []
    for _ in range(rounds):
        b.run(None, feeds)
        start = time.perf_counter()
        a.run(None, feeds)
        other.append(time.perf_counter() - start)
        start = time.perf_counter()
        a.run(None, feeds)
        itself.append(time.perf_counter() - start)
    ratio = statistics.median(o / s for o, s in zip(other, itself, strict=True))
    return statistics.median(other) * 1000, ratio


def sessions(
    model: str, feeds: dict[str, np.ndarray], n: int, rounds: int
) -> tuple[list[float], list[float]]:
    """(each session's paired ratio to the first created, each slot's median ms) over
    ``rounds`` cyclic rounds (round r starts with session r mod n)."""
    made = [session(model, "all") for _ in range(n)]
    for s in made:
        for _ in range(3):
            s.run(None, feeds)
    times: list[list[float]] = [[] for _ in range(n)]
    slots: list[list[float]] = [[] for _ in range(n)]
    for r in range(rounds):
        for slot in range(n):
            i = (r + slot) % n
            start = time.perf_counter()
            made[i].run(None, feeds)
            took = time.perf_counter() - start
            times[i].append(took)
            slots[slot].append(took)
    ratios = [statistics.median(a / b for a, b in zip(t, times[0], strict=True)) for t in times]
    return ratios, [statistics.median(s) * 1000 for s in slots]


def identical(model: str, feeds: dict[str, np.ndarray], seconds: float) -> tuple[float, float]:
    """opfuse's measurement of ``model`` against itself: (ratio, noise)."""
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import measure

    found = measure(model, {"copy": model}, get_runtime(threads=1), seconds=seconds, feeds=feeds)
    return found.ratio("copy"), found.noise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.order_effects", description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--shape", action="append", default=[], help="NAME:D0,D1,... (float32)")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=3.0, help="per identical-file run")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in args.shape:
        name, dims = spec.split(":")
        shape = [int(d) for d in dims.split(",")]
        feeds[name] = rng.standard_normal(shape).astype(np.float32)
    ms, ratio = after_itself(args.model, feeds, args.rounds)
    print(f"after itself: {ms:.3f} ms after another session; after another / after itself "
          f"{ratio:.3f}")  # fmt: skip
    ratios, slots = sessions(args.model, feeds, args.sessions, args.rounds)
    print("sessions, by creation order, paired ratio to the first: "
          + " ".join(f"{r:.3f}" for r in ratios))  # fmt: skip
    print("slots of the cyclic rounds, median ms: " + " ".join(f"{s:.3f}" for s in slots))
    for k in range(args.repeat):
        r, noise = identical(args.model, feeds, args.seconds)
        within = "within" if abs(r - 1) <= noise else "OUTSIDE"
        print(f"identical file {k + 1}: {r:.3f}x, noise +-{noise:.1%}: {within} the noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
