"""Throughput and overhead of ``opfuse batch`` (docs/BATCH.md quotes these figures).

    python -m bench.batch throughput ZOO_DIR [--reps 2] [--work DIR]
        the whole folder with 1 and 2 local workers and on a local Ray cluster of 2 CPUs,
        the runs interleaved (rep 1: l1, l2, ray; rep 2: ...), models per minute each
    python -m bench.batch overhead [--tasks 200]
        the cost of isolation (a fork-server child per model, empty task) and of Ray's
        scheduling (empty tasks on a local 2-CPU cluster, submitted all at once and one at
        a time)

Real timings on a shared machine: run when it is quiet, read the spread across reps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {"local, 1 worker": ["--workers", "1"], "local, 2 workers": ["--workers", "2"]}
MODES["ray, 2 CPUs"] = ["--ray", "--workers", "2"]


def throughput(zoo: Path, reps: int, work: Path) -> None:
    rows: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    peaks: dict[str, tuple[int, int]] = {}
    for rep in range(reps):
        for mode, args in MODES.items():
            out = work / f"{mode.replace(' ', '').replace(',', '_')}-{rep}"
            cmd = [sys.executable, "-m", "opfuse", "batch", str(zoo), "-o", str(out), *args]
            start = time.perf_counter()
            done = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True)
            wall = time.perf_counter() - start
            data = json.loads(done.stdout)
            summary = data["summary"]
            rows[mode].append((wall, summary["seconds"]))
            bad = {r["relpath"]: r["status"] for r in data["records"] if r["status"] != "ok"}
            print(f"rep {rep + 1} {mode}: {summary['ran']} models, wall {wall:.1f} s "
                  f"(engine {summary['seconds']:.1f} s)" + (f", not ok: {bad}" if bad else ""),
                  flush=True)  # fmt: skip
            for r in data["records"]:
                size = Path(r["model"]).stat().st_size
                peaks[r["relpath"]] = (size, r["peak_memory"] or 0)
    n = len(peaks)
    print(f"\n{n} models; models/minute over the command's wall time (median of {reps}):")
    for mode, runs in rows.items():
        walls = [w for w, _ in runs]
        print(f"  {mode:18} {60 * n / statistics.median(walls):6.1f} models/min  "
              f"(walls {', '.join(f'{w:.0f}' for w in walls)} s)")  # fmt: skip
    print("\npeak resident memory of each model's worker (last run):")
    for name, (size, peak) in sorted(peaks.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:32} file {size / 2**20:7.1f} MiB  peak {peak / 2**20:7.1f} MiB")


def _empty(job: object, outdir: str, conn: object) -> None:
    conn.send({"status": "ok"})  # type: ignore[attr-defined]


def overhead(tasks: int) -> None:
    import ray

    from opfuse.batching.isolate import context, run_isolated
    from opfuse.batching.jobs import Job, TaskOptions

    context()
    job = Job(__file__, "x", TaskOptions())
    run_isolated(job, "", task=_empty)  # the fork server's start-up, once
    times = []
    for _ in range(20):
        start = time.perf_counter()
        run_isolated(job, "", task=_empty)
        times.append(time.perf_counter() - start)
    print(f"isolation: an empty task in a fork-server child: median "
          f"{1000 * statistics.median(times):.1f} ms (20 runs)")  # fmt: skip

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray.init of a local 2-CPU cluster: {time.perf_counter() - start:.1f} s")
    noop = ray.remote(num_cpus=1)(lambda: None)
    ray.get([noop.remote() for _ in range(4)])  # the workers' start-up
    start = time.perf_counter()
    ray.get([noop.remote() for _ in range(tasks)])
    batch = (time.perf_counter() - start) / tasks
    serial = []
    for _ in range(50):
        t0 = time.perf_counter()
        ray.get(noop.remote())
        serial.append(time.perf_counter() - t0)
    print(f"ray: {tasks} empty tasks at once: {1000 * batch:.2f} ms per task (2 CPUs)")
    print(f"ray: one empty task's round trip: median {1000 * statistics.median(serial):.2f} ms")
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch")
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("zoo", type=Path)
    t.add_argument("--reps", type=int, default=2)
    t.add_argument("--work", type=Path)
    o = sub.add_parser("overhead")
    o.add_argument("--tasks", type=int, default=200)
    args = parser.parse_args()
    if args.what == "throughput":
        work = args.work or Path(tempfile.mkdtemp(prefix="opfuse-batch-bench-"))
        throughput(args.zoo, args.reps, work)
    else:
        overhead(args.tasks)


if __name__ == "__main__":
    main()
