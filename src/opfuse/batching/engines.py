"""Where tasks run: one interface, a local pool of worker processes and Ray.

An engine takes the jobs and yields each one's record as it finishes, in any order. Both
run the same function, ``isolate.run_isolated`` (one child process per model, with the
timeout and memory limit), so a model gets the same record from either.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from opfuse.batching.isolate import Interrupted, run_isolated
from opfuse.batching.jobs import Job
from opfuse.batching.task import base_record, one_line
from opfuse.errors import OpfuseError

OnStart = Callable[[Job], None]


class Engine(Protocol):
    name: str

    def run(
        self, jobs: Sequence[Job], outdir: str, on_start: OnStart, stop: threading.Event
    ) -> Iterator[dict[str, Any]]:
        """Yield each job's record as it finishes. ``stop`` set, or the iterator closed:
        the running tasks are killed, the queued ones dropped."""
        ...


class LocalEngine:
    """``workers`` threads, each running one model at a time in its own child process."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)

    def run(
        self, jobs: Sequence[Job], outdir: str, on_start: OnStart, stop: threading.Event
    ) -> Iterator[dict[str, Any]]:
        halt = threading.Event()  # set on the way out: running children are killed

        def task(job: Job) -> dict[str, Any]:
            if halt.is_set():
                raise Interrupted(job.model)
            on_start(job)
            return run_isolated(job, outdir, halt)

        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="opfuse-batch")
        pending: set[Future[dict[str, Any]]] = {pool.submit(task, job) for job in jobs}
        try:
            while pending and not stop.is_set():
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:  # finished, Ctrl-C or the caller closed us: kill what still runs
            halt.set()
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True)


def _ray_task(job: Job, outdir: str) -> dict[str, Any]:
    return run_isolated(job, outdir)


def _missing_on_node(paths: list[str], outdir: str) -> tuple[str, list[str]]:
    """Run on one Ray node: the paths it cannot see (OUTDIR must be a folder there)."""
    import platform

    missing = [p for p in paths if not os.path.exists(p)]
    if not os.path.isdir(outdir):
        missing.append(outdir)
    return platform.node(), missing


class RayEngine:
    """Each model a Ray task declaring one CPU and its memory limit, so Ray packs them.

    ``address`` None starts a local cluster of ``workers`` CPUs (all cores by default);
    otherwise it joins that cluster (``auto``: the one ``ray start`` runs here). Models and
    OUTDIR are read and written by path: every node must see them at the same paths.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self.address = address
        self.workers = workers

    def _init(self) -> tuple[Any, bool]:
        try:
            import ray
        except ImportError:
            raise OpfuseError(
                "--ray needs Ray: pip install 'opfuse[ray]' (or pip install ray)"
            ) from None
        if ray.is_initialized():
            return ray, False
        if self.address:
            _check_reachable(self.address)
        try:
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.address or "a local cluster"
            hint = (
                "" if self.address is None else " (a cluster with token auth: RAY_AUTH_MODE=token)"
            )
            raise OpfuseError(
                f"cannot start or join Ray at {where}: {one_line(exc)}{hint}"
            ) from None
        return ray, True

    def check_paths(self, ray: Any, jobs: Sequence[Job], outdir: str) -> None:
        """Every live node must see every model and OUTDIR (shared storage)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        check = ray.remote(num_cpus=0)(_missing_on_node)
        paths = sorted({job.model for job in jobs})
        refs = [
            check.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(paths, outdir)
            for node in ray.nodes()
            if node.get("Alive")
        ]
        for host, missing in ray.get(refs):
            if missing:
                more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
                raise OpfuseError(
                    f"Ray node {host} cannot see {missing[0]}{more}: models and the output "
                    "folder must be on storage every node mounts at the same path"
                )

    def run(
        self, jobs: Sequence[Job], outdir: str, on_start: OnStart, stop: threading.Event
    ) -> Iterator[dict[str, Any]]:
        ray, started = self._init()
        try:
            self.check_paths(ray, jobs, outdir)
            remote = ray.remote(max_retries=0)(_ray_task)
            refs = {
                remote.options(num_cpus=1, memory=job.options.max_memory or None).remote(
                    job, outdir
                ): job
                for job in jobs
            }
            # Ray does not tell the driver when a task starts: name the ones it can run now
            slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
            queue = list(jobs)
            for job in queue[:slots]:
                on_start(job)
            del queue[:slots]
            pending = list(refs)
            try:
                while pending and not stop.is_set():
                    done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                    for ref in done:
                        yield self._record(ray, ref, refs[ref])
                        if queue:
                            on_start(queue.pop(0))
            finally:
                for ref in pending:
                    ray.cancel(ref, force=True)
        finally:
            if started:
                ray.shutdown()

    @staticmethod
    def _record(ray: Any, ref: Any, job: Job) -> dict[str, Any]:
        try:
            record: dict[str, Any] = ray.get(ref)
            return record
        except Exception as exc:  # the Ray worker itself died or the task was cancelled
            record = base_record(job)
            record["error"] = f"Ray task failed: {type(exc).__name__}: {one_line(exc)}"[:500]
            return record


def _check_reachable(address: str) -> None:
    """A HOST:PORT with nothing listening is one error now (ray.init retries for minutes)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto", ray:// client addresses: Ray's own checks
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise OpfuseError(
            f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc}); "
            "start one (ray start --head) or give the address it printed"
        ) from None


def make_engine(engine: str, workers: int | None, ray_address: str | None) -> Engine:
    if engine == "local":
        return LocalEngine(workers)
    if engine == "ray":
        return RayEngine(ray_address, workers)
    raise OpfuseError(f"unknown engine {engine!r} (local or ray)")
