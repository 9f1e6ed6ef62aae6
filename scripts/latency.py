"""Median onnxruntime latency of models relative to the first one.

    .venv/bin/python scripts/latency.py ORIGINAL OPTIMIZED [MORE ...] [--runs 30] [--threads 1]

One CPU session per model, all of onnxruntime's optimizations on (ORT_ENABLE_ALL),
``--threads`` intra-op threads. Runs are interleaved (model 1, model 2, ..., repeated) so
load changes on the machine hit every model alike; the median of ``--runs`` is reported.
Inputs are random with dynamic dims set to 1; a model re-declared by ``--layout`` gets its
input transposed by the permutation recorded in its metadata.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort

from opfuse.model.sessions import open_session
from opfuse.verification.compare import input_permutations, make_inputs


def session(path: str, threads: int) -> ort.InferenceSession:
    return open_session(path, threads=threads, inter_threads=1, graph_opt="all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sessions = [session(m, args.threads) for m in args.models]
    base = make_inputs(sessions[0], None, None, 0)
    feeds = []
    for path in args.models:
        perms = input_permutations(path)
        feeds.append(
            {
                k: np.ascontiguousarray(v.transpose(perms[k])) if k in perms else v
                for k, v in base.items()
            }
        )
    times: list[list[float]] = [[] for _ in sessions]
    for i in range(args.warmup + args.runs):
        for j, (sess, feed) in enumerate(zip(sessions, feeds, strict=True)):
            start = time.perf_counter()
            sess.run(None, feed)
            if i >= args.warmup:
                times[j].append(time.perf_counter() - start)
    first = statistics.median(times[0])
    for path, t in zip(args.models, times, strict=True):
        median = statistics.median(t)
        print(f"{median * 1000:9.2f} ms  {median / first:5.3f}x  {path}")


if __name__ == "__main__":
    main()
