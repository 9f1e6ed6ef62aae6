"""One model's task: a plain function of (job, OUTDIR) -> result record.

It never raises for a model's own failure: bad input, a failed verification or a memory
error become the record's status. It runs inside an isolated child process
(``opfuse.batching.isolate``), which adds what only the parent can see (timeout, a crash).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opfuse.batching.jobs import Job
from opfuse.errors import OpfuseError, VerificationError

SCHEMA = "opfuse.batch/1"
# the record's statuses, in the order the summary lists them
STATUSES = ("ok", "verify_failed", "refused", "crashed", "timeout", "oom")
# fields that are measurements of this run, not results: they differ between engines/runs
TIMING_FIELDS = ("started", "seconds", "optimize_seconds", "peak_memory", "latency_ratio", "tune")
OOM_MARKERS = ("Failed to allocate memory", "bad_alloc", "Cannot allocate memory")
BENCH_SECONDS = 3.0  # --benchmark's measuring time per model


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import onnx
    import onnxruntime

    return {
        "opfuse": version("opfuse"),
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "python": platform.python_version(),
    }


def base_record(job: Job) -> dict[str, Any]:
    """The fields every record has, whatever happened to the model."""
    try:
        digest: str | None = sha256_file(job.model)
    except OSError:
        digest = None
    return {
        "schema": SCHEMA,
        "model": job.model,
        "relpath": job.relpath,
        "sha256": digest,
        "options_key": job.options.key(),
        "limits": job.options.limits(),
        "status": "crashed",
        "error": None,
        "nodes_before": None,
        "nodes_after": None,
        "passes": {},
        "verification": None,
        "latency_ratio": None,
        "latency_inputs": None,
        "tune": None,
        "output": None,
        "reports": {},
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": None,
        "optimize_seconds": None,
        "peak_memory": None,
        "versions": versions(),
    }


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def status_of(exc: BaseException) -> str:
    """The record status a task's exception means."""
    if isinstance(exc, MemoryError) or any(m in str(exc) for m in OOM_MARKERS):
        return "oom"
    if isinstance(exc, VerificationError):
        return "verify_failed"
    if isinstance(exc, OpfuseError):
        return "refused"
    return "crashed"


def optimize_model_file(job: Job, output: Path) -> Any:
    """The one adapter between batch and the optimizer: optimize, verify, write (the
    pipeline function ``opfuse.optimize`` calls, with the same settings objects)."""
    from opfuse.pipeline.conductor import optimize_file

    o = job.options
    return optimize_file(
        job.model,
        output,
        settings=o.optimize_settings(),
        verifier=o.verify_settings(),
        verify=o.verify,
        fusion_result=output.with_suffix(".fusion_result.json"),
    )


def run_task(job: Job, outdir: str) -> dict[str, Any]:
    """Optimize (and optionally advise and benchmark) one model into OUTDIR."""
    start = time.perf_counter()
    record = base_record(job)
    output = job.output(outdir)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        result = optimize_model_file(job, output)
        record["nodes_before"] = sum(result.before.values())
        record["nodes_after"] = sum(result.after.values())
        record["passes"] = {name: count for name, count in _effected(result.log).items() if count}
        if result.verify is not None:
            record["verification"] = result.verify.to_json()
        if result.left_alone:
            record["left_alone"] = result.left_alone
        record["optimize_seconds"] = round(result.seconds, 3)
        # paths relative to OUTDIR: records stay true when OUTDIR moves, and equal across engines
        record["output"] = job.relpath
        record["reports"]["fusion_result"] = _sibling(job.relpath, ".fusion_result.json")
        if job.options.advise:
            _advise(job, output)
            record["reports"]["advise_json"] = _sibling(job.relpath, ".advise.json")
            record["reports"]["advise_html"] = _sibling(job.relpath, ".advise.html")
        if job.options.benchmark:
            record["latency_ratio"], record["latency_inputs"] = latency(job, output)
        if job.options.tune:
            record["tune"] = _tune(job, output)
            record["reports"]["tune"] = _sibling(job.relpath, ".tune.json")
        record["status"] = "ok"
    except Exception as exc:  # a model's failure is its record, never the batch's
        record["status"] = status_of(exc)
        record["error"] = one_line(exc)
        if record["status"] == "crashed":
            record["error"] = f"{type(exc).__name__}: {record['error']}"
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def _effected(log: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for stats in log:
        counts[stats.pass_name] = counts.get(stats.pass_name, 0) + stats.effected
    return counts


def _sibling(relpath: str, suffix: str) -> str:
    return Path(relpath).with_suffix(suffix).as_posix()


def _advise(job: Job, output: Path) -> None:
    """The advisor's JSON and HTML reports of the input model beside its output."""
    from opfuse.advisor.conductor import AdviseOptions, advise
    from opfuse.advisor.render import render_html
    from opfuse.model.io import write_text

    o = job.options
    report = advise(
        job.model, options=AdviseOptions(input_shapes=o.input_shape, inputs=o.verify_inputs)
    )
    text = json.dumps(report.to_json(), indent=2) + "\n"
    write_text(output.with_suffix(".advise.json"), text, inputs=[job.model])
    write_text(output.with_suffix(".advise.html"), render_html(report), inputs=[job.model])


def _tune(job: Job, output: Path) -> dict[str, Any]:
    """``opfuse tune`` within the model's budget: the fastest verified settings on
    onnxruntime (one thread), written beside the output as NAME.tuned.onnx with its switch
    file and report; the default optimization stays the output."""
    from opfuse.runtime import get_runtime
    from opfuse.tuning import search as tuning

    o = job.options
    settings = tuning.SearchSettings(
        budget_s=o.tune or 0.0,
        input_shapes=o.input_shape,
        inputs_npz=o.verify_inputs,
        rtol=o.rtol,
        atol=o.atol,
    )
    tuned, switch_file, report = (
        output.with_suffix(s) for s in (".tuned.onnx", ".fusion_switch.cfg", ".tune.json")
    )

    def keep(found: Any, built: Any) -> None:
        tuning.write_outputs(found, built, job.model, tuned, switch_file, report, o.input_shape)

    runtime = get_runtime("onnxruntime", threads=1)
    result = tuning.tune(job.model, runtime, settings, workdir=output.parent, keep=keep)
    return {
        "best": result.best.label,
        "beat_original": result.beat_original,
        "latency_ratio": result.ratio,
        "model": _sibling(job.relpath, ".tuned.onnx"),
        "switch_file": _sibling(job.relpath, ".fusion_switch.cfg"),
    }


def latency(
    job: Job, output: Path, seconds: float = BENCH_SECONDS
) -> tuple[float, dict[str, object] | None]:
    """The optimized model's latency over the original's under onnxruntime (default
    optimizations, one thread), measured paired and interleaved by opfuse.tuning.measure,
    and the inputs it was timed on (the model's ``inputs`` .npz, else generated: said)."""
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import measure

    found = measure(
        job.model,
        {"opfuse": output},
        get_runtime("onnxruntime", threads=1),
        seconds=seconds,
        input_shapes=job.options.input_shape,
        inputs_npz=job.options.verify_inputs,
    )
    return round(found.ratio("opfuse"), 4), found.inputs.to_json() if found.inputs else None
