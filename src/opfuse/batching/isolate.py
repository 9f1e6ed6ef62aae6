"""Run one task in its own child process, with a timeout and a memory limit.

The child comes from a fork server that has imported opfuse and onnxruntime once, so a
task starts in milliseconds, not the seconds a fresh interpreter takes to import them. The
memory limit is RLIMIT_DATA (the heap and private writable mappings: what a model's tensors
take; memory-mapped weights are not counted): an allocation beyond it fails inside the
child, which records "oom". A child that outlives the timeout is killed ("timeout"); one
that dies without a record (a segfault, an abort) is "crashed". SIGALRM at the timeout plus
a grace period ends a child whose parent died (a cancelled Ray task), since a hang must not
outlive its batch.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from opfuse.batching.jobs import Job
from opfuse.batching.task import base_record, run_task
from opfuse.runtime.memory import vmhwm_bytes

POLL_S = 0.1
GRACE_S = 5  # the child's own alarm fires this long after the parent's timeout
PRELOAD = ["opfuse.api", "opfuse.batching.task", "onnxruntime"]
_lock = threading.Lock()
_context: list[Any] = []


class Interrupted(Exception):
    """The batch was stopped (Ctrl-C) while this task ran; its child is gone."""


def context() -> Any:
    """The fork-server context, created once per process (the server starts lazily)."""
    with _lock:
        if not _context:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _context.append(ctx)
        return _context[0]


def _child(job: Job, outdir: str, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the batch, not a ^C
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(int(job.options.timeout) + GRACE_S)
    limit = job.options.max_memory
    if limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    record = run_task(job, outdir)
    record["peak_memory"] = vmhwm_bytes()
    conn.send(record)
    conn.close()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def run_isolated(
    job: Job, outdir: str, stop: threading.Event | None = None, task: Any = None
) -> dict[str, Any]:
    """The task's record, or one saying how its child failed. ``stop`` set: the child is
    killed and Interrupted raised. ``task`` replaces ``_child`` (tests' hook)."""
    ctx = context()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=task or _child, args=(job, outdir, sender), daemon=True)
    proc.start()  # returns once forked: a fork server's first start-up is not the model's time
    start = time.perf_counter()
    sender.close()
    peak = 0
    record: dict[str, Any] | None = None
    failure = ""
    try:
        while True:
            if receiver.poll(POLL_S):
                with contextlib.suppress(EOFError, OSError):
                    record = receiver.recv()
                break
            peak = max(peak, vmhwm_bytes(proc.pid))
            if stop is not None and stop.is_set():
                raise Interrupted(job.model)
            if time.perf_counter() - start > job.options.timeout:
                failure = "timeout"
                break
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        receiver.close()
    if record is not None:
        return record
    record = base_record(job)
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["peak_memory"] = peak or None
    if failure == "timeout":
        record["status"] = "timeout"
        record["error"] = f"still running after the {job.options.timeout:g} s timeout; killed"
    else:
        code = proc.exitcode or 0
        record["status"] = "crashed"
        record["error"] = (
            f"the worker process died ({_signal_name(code)})"
            if code < 0
            else f"the worker process exited with status {code} and no result"
        )
    return record
