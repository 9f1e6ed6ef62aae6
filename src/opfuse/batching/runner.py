"""A batch run: collect the models, skip those done before, run the rest on an engine,
append each record as it arrives, and write the summary page."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opfuse.batching import results
from opfuse.batching.engines import make_engine
from opfuse.batching.jobs import Job, TaskOptions, check_outdir, collect_jobs
from opfuse.batching.summary import write_summary_html
from opfuse.batching.task import sha256_file
from opfuse.errors import OpfuseError
from opfuse.pipeline.settings import OptimizeSettings
from opfuse.verification.settings import VerifySettings


class BatchProgress:
    """What the runner reports while it works (the CLI draws a bar from it)."""

    def planned(self, total: int, skipped: int) -> None: ...
    def started(self, job: Job) -> None: ...
    def finished(self, job: Job, record: dict[str, Any]) -> None: ...


@dataclass
class BatchRun:
    """The outcome: this run's records (in job order, skipped ones as recorded before)."""

    outdir: Path
    engine: str
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def ran(self) -> list[dict[str, Any]]:
        skipped = {id(r) for r in self.skipped}
        return [r for r in self.records if id(r) not in skipped]

    def totals(self) -> dict[str, Any]:
        """The counts (the ``summary`` of ``opfuse batch --format json``)."""
        ran = self.ran
        return {
            "outdir": str(self.outdir),
            "engine": self.engine,
            "models": self.total,
            "ran": len(ran),
            "skipped": len(self.skipped),
            "not_run": self.total - len(self.records),
            "interrupted": self.interrupted,
            "status": results.counts(self.records),  # every model's current record
            "ran_status": results.counts(ran),
            "seconds": round(self.seconds, 3),
            "models_per_minute": round(60 * len(ran) / self.seconds, 2) if self.seconds else None,
        }

    def to_json(self) -> dict[str, Any]:
        """What ``opfuse batch --format json`` prints: the totals and every record."""
        return {"summary": self.totals(), "records": self.records}

    def summary(self) -> str:
        """The totals as the lines ``opfuse batch`` prints below its table."""
        s = self.totals()
        ran = ", ".join(f"{n} {status}" for status, n in s["ran_status"].items() if n)
        now = ", ".join(f"{n} {status}" for status, n in s["status"].items() if n)
        lines = [
            f"{s['ran']} run ({ran or 'none'}) and {s['skipped']} skipped in {s['seconds']:.1f} s; "
            f"all {s['models']} models: {now or 'none'}",
            f"results in {self.outdir / 'results.jsonl'}, summary in {self.outdir / 'summary.html'}",
        ]
        if s["interrupted"]:
            lines.append(
                f"interrupted: {s['not_run']} models not run; run the same command to resume"
            )
        return "\n".join(lines)


@contextlib.contextmanager
def _ctrl_c_sets(stop: threading.Event) -> Iterator[None]:
    """While the engine runs, Ctrl-C sets ``stop`` instead of raising KeyboardInterrupt
    (which could land inside the pool's locks and deadlock its shutdown)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _hash_jobs(jobs: list[Job]) -> dict[str, str | None]:
    digests: dict[str, str | None] = {}
    for job in jobs:
        try:
            digests[job.model] = sha256_file(job.model)
        except OSError as exc:
            raise OpfuseError(f"{job.model}: cannot read: {exc.strerror or exc}") from None
    return digests


def run_batch(
    inputs: Iterable[str | os.PathLike[str]],
    outdir: str | os.PathLike[str],
    options: TaskOptions,
    *,
    engine: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    force: bool = False,
    progress: BatchProgress | None = None,
) -> BatchRun:
    """Run every model of INPUTS into OUTDIR; Ctrl-C returns what finished (interrupted)."""
    progress = progress or BatchProgress()
    out = Path(outdir)
    options.check()
    jobs = collect_jobs(inputs, options)
    check_outdir(out, jobs)
    runner = make_engine(engine, workers, ray_address)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    digests = _hash_jobs(jobs)
    before = {} if force else results.last_records(results.read(out))
    by_model: dict[str, dict[str, Any]] = {}
    todo = []
    for job in jobs:
        prior = before.get(results.resume_key(digests[job.model], job.options.key(), job.relpath))
        if prior is None or not results.reusable(prior, job.options.limits(), out):
            todo.append(job)
        else:
            by_model[job.model] = prior
    run = BatchRun(out, runner.name, total=len(jobs))
    run.skipped = list(by_model.values())
    progress.planned(len(jobs), len(run.skipped))
    start = time.perf_counter()
    jobs_by_model = {job.model: job for job in todo}
    stop = threading.Event()
    stream = runner.run(todo, str(out), progress.started, stop) if todo else iter(())
    try:
        with _ctrl_c_sets(stop):
            for record in stream:
                results.append(out, record)
                by_model[record["model"]] = record
                progress.finished(jobs_by_model[record["model"]], record)
    except KeyboardInterrupt:  # a ^C outside the main thread's handler
        stop.set()
    finally:
        close: Callable[[], None] | None = getattr(stream, "close", None)
        if close is not None:
            close()  # stops the engine: kills running children, drops the queue
    run.interrupted = stop.is_set()
    run.seconds = time.perf_counter() - start
    run.records = [by_model[job.model] for job in jobs if job.model in by_model]
    write_summary_html(out, run.records, run.totals())
    return run


class BatchRecords(list[dict[str, Any]]):
    """What ``opfuse.batch`` returns: one record per model, in input order (a list), and
    the run they came from (``run``: its summary, the folder, whether it was interrupted)."""

    def __init__(self, run: BatchRun) -> None:
        super().__init__(run.records)
        self.run = run


class BatchInterrupted(KeyboardInterrupt):
    """``opfuse.batch`` was interrupted (Ctrl-C): ``records`` holds what finished."""

    def __init__(self, records: BatchRecords) -> None:
        super().__init__()
        self.records = records


def batch(
    inputs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    outdir: str | os.PathLike[str],
    *,
    engine: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    force: bool = False,
    optimize_settings: OptimizeSettings | None = None,
    verify_settings: VerifySettings | None = None,
    progress: BatchProgress | None = None,
    **options: Any,
) -> BatchRecords:
    """Optimize (verify, and with ``advise=True`` advise) every model of ``inputs`` into
    ``outdir``, each in its own worker process; return one record per model (a list,
    ``BatchRecords``, whose ``run`` holds the summary).

    ``inputs``: model files, folders or manifests. ``engine``: "local" (``workers``
    processes) or "ray" (``ray_address``: an existing cluster; None starts a local one).
    ``options``: the fields of ``TaskOptions`` (``timeout``, ``max_memory``, ``rtol``...);
    ``optimize_settings`` (``OptimizeSettings``) and ``verify_settings``
    (``VerifySettings``) may give the optimizer's and the verifier's instead.
    Models done before with the same bytes and options are not redone unless ``force``.
    ``progress`` hears of each model as it starts and ends. Ctrl-C raises
    ``BatchInterrupted`` (a ``KeyboardInterrupt``) holding the records of what finished.
    """
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    known = set(TaskOptions.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise OpfuseError(f"batch() got unknown options {unknown} (known: {sorted(known)})")
    for key in ("enable", "disable"):
        if key in options:
            options[key] = tuple(options[key])
    run = run_batch(
        inputs,
        outdir,
        TaskOptions.of(optimize_settings, verify_settings, **options),
        engine=engine,
        workers=workers,
        ray_address=ray_address,
        force=force,
        progress=progress,
    )
    records = BatchRecords(run)
    if run.interrupted:
        raise BatchInterrupted(records)
    return records
