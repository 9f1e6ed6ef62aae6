"""Op times in: run onnxruntime with profiling, read its profile JSON, or read an Ascend
msprof ``op_summary_*.csv``. All three give per-node records in execution order with the
median time per inference run over the kept runs (warm-up runs dropped): one run slowed
down by another process on a shared machine does not move a node's figure."""

from __future__ import annotations

import bisect
import csv
import json
import os
import re
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opfuse.errors import OpfuseError

if TYPE_CHECKING:
    from opfuse.verification.compare import FedInputs

KERNEL_SUFFIX = "_kernel_time"
GRAPH_OPT_LEVELS = ("disable", "basic", "extended", "all")


def iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


@dataclass
class OpRecord:
    name: str
    op_type: str
    duration_us: float  # median over the kept inference runs of the node's time per run
    calls: int = 1  # calls per run
    input_shapes: list[list[int]] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)  # mac, vec, mte2, mte3 (msprof)
    provider: str = ""  # execution provider (onnxruntime) or Task Type (msprof)
    shapes_text: str = ""  # msprof's Input Shapes column as printed
    runs_us: list[float] = field(default_factory=list)  # its time in each kept run

    @property
    def iqr_us(self) -> float:
        """The spread of its per-run times (interquartile range; 0 for fewer than 2 runs)."""
        return iqr(self.runs_us)


@dataclass(frozen=True)
class InputShape:
    name: str
    shape: list[int]
    declared: list[int | str]  # a fixed dim, or the dim's name ("?" where unnamed)

    @property
    def dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.declared)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shape": self.shape,
            "declared": self.declared,
            "dynamic": self.dynamic,
        }


def declared_dim(d: object) -> int | str:
    """A declared dim as onnxruntime or onnx gives it: a fixed size, else its name ("?"
    where unnamed; -1, the old "dynamic", is dynamic)."""
    if isinstance(d, int) and not isinstance(d, bool) and d >= 0:
        return d
    return str(d) if isinstance(d, str) and d else "?"


@dataclass
class Profile:
    source: str  # onnxruntime | onnxruntime-json | op_summary
    records: list[OpRecord]
    runs: int
    warmup: int = 0
    provider: str = ""
    graph_opt: str = ""
    path: str = ""
    missing_columns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ort_optimized_model: str | None = None  # graph onnxruntime ran (for name mapping)
    # the model inputs profiled: name, shape fed, declared dims (a name or "?" where dynamic)
    inputs: list[InputShape] = field(default_factory=list)
    # what opfuse fed them (generated or the user's .npz); None: a profile read, not run here
    fed: FedInputs | None = None
    sized: tuple[str, ...] = ()  # the inputs whose dims the user gave (--input-shape)

    def input_shape_hint(self) -> str | None:
        """What to give instead of the sizes opfuse chose for the dynamic dims of generated
        inputs: ``--inputs samples.npz``, or ``--input-shape`` with each dim the model
        leaves free named (``x:N,3,H,W``, ``D2`` where unnamed); None when the inputs were
        given or read from a profile, or no dim was opfuse's choice."""
        if self.fed is None or not self.fed.generated:
            return None
        dynamic = [i for i in self.inputs if i.dynamic and i.name not in self.sized]
        if not dynamic:
            return None
        shapes = " ".join(
            f"--input-shape {i.name}:"
            + ",".join(
                str(d) if isinstance(d, int) else (d if d != "?" else f"D{k}")
                for k, d in enumerate(i.declared)
            )
            for i in dynamic
        )
        return f"--inputs samples.npz, or {shapes} with your sizes"

    @property
    def total_us(self) -> float:
        return sum(r.duration_us for r in self.records)

    def run_totals_us(self) -> list[float]:
        """The sum of the nodes' times in each kept run (empty where runs are not known)."""
        counts = {len(r.runs_us) for r in self.records}
        if len(counts) != 1 or 0 in counts:
            return []
        return [sum(vals) for vals in zip(*(r.runs_us for r in self.records), strict=True)]


def _shapes(entries: object) -> list[list[int]]:
    out: list[list[int]] = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            for dims in entry.values():
                out.append([int(d) for d in dims] if isinstance(dims, list) else [])
    return out


def _number(event: dict, key: str) -> float:
    """A timing field of a profile event (0 when absent); anything else is bad input."""
    value = event.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpfuseError(
            f"not an onnxruntime profile: event {str(event.get('name', '?'))[:80]!r} has "
            f"{key} {str(value)[:40]!r}, not a number"
        )
    return float(value)


def parse_ort_events(events: list[dict], warmup: int, source: str = "onnxruntime") -> Profile:
    """Node events of an onnxruntime profile, the first ``warmup`` model runs dropped."""
    if not isinstance(events, list):
        raise OpfuseError("not an onnxruntime profile: expected a JSON list of events")
    runs = sorted(
        (_number(e, "ts"), _number(e, "ts") + _number(e, "dur"))
        for e in events
        if isinstance(e, dict) and e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    starts = [r[0] for r in runs]
    notes: list[str] = []
    if runs and warmup >= len(runs):
        notes.append(f"only {len(runs)} runs in the profile: kept the last one (warm-up {warmup})")
        warmup = len(runs) - 1
    kept = max(1, len(runs) - warmup) if runs else 1
    records: dict[str, OpRecord] = {}
    calls: Counter[str] = Counter()
    per_run: dict[str, list[float]] = {}  # node -> its time in each kept run
    for e in events:
        if not isinstance(e, dict) or e.get("cat") != "Node":
            continue
        name = str(e.get("name", ""))
        if not name.endswith(KERNEL_SUFFIX):
            continue
        run = bisect.bisect_right(starts, _number(e, "ts")) - 1
        if runs and run < warmup:
            continue
        name = name[: -len(KERNEL_SUFFIX)]
        args = e.get("args", {}) or {}
        rec = records.get(name)
        if rec is None:
            rec = records[name] = OpRecord(
                name,
                str(args.get("op_name", "")),
                0.0,
                0,
                _shapes(args.get("input_type_shape")),
                _shapes(args.get("output_type_shape")),
                provider=str(args.get("provider", "")),
            )
        times = per_run.setdefault(name, [0.0] * kept)
        times[max(0, run - warmup) if runs else 0] += _number(e, "dur")
        calls[name] += 1
    for name, rec in records.items():
        rec.duration_us = statistics.median(per_run[name])
        rec.runs_us = per_run[name]
        rec.calls = max(1, round(calls[name] / kept))
    if not records:
        raise OpfuseError("the onnxruntime profile has no node events (was it a profile JSON?)")
    return Profile(source, list(records.values()), kept, warmup, notes=notes)


def read_ort_profile(path: str | os.PathLike[str], warmup: int = 1) -> Profile:
    try:
        events = json.loads(Path(path).read_text("utf-8"))
    except OSError as exc:
        raise OpfuseError(f"{path}: cannot read the profile: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise OpfuseError(f"{path}: not JSON ({exc}); expected an onnxruntime profile") from None
    except UnicodeDecodeError as exc:
        raise OpfuseError(
            f"{path}: not JSON (byte {exc.start} is not UTF-8); expected an onnxruntime profile"
        ) from None
    try:
        profile = parse_ort_events(events, warmup, "onnxruntime-json")
    except OpfuseError as exc:
        raise OpfuseError(f"{path}: {exc}") from None
    profile.path = str(path)
    return profile


def run_onnxruntime(
    model_path: str | os.PathLike[str],
    *,
    runs: int = 10,
    warmup: int = 2,
    threads: int = 0,
    provider: str = "CPUExecutionProvider",
    graph_opt: str = "disable",
    input_shapes: Mapping[str, list[int]] | None = None,
    profile_out: str | os.PathLike[str] | None = None,
    optimized_out: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    shown_as: str | os.PathLike[str] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
) -> Profile:
    """Profile ``runs`` inferences after ``warmup`` ones on the arrays of ``inputs_npz``,
    else on seeded random inputs (the sizes opfuse chose grown where onnxruntime refuses
    them, as the verifier's). A model they cannot run is ``optimize``'s one-line error
    naming ``shown_as`` (the user's model when ``model_path`` is a working copy) with the
    ``--inputs``/``--input-shape`` hint."""
    import onnxruntime as ort

    from opfuse.model.io import check_output_path, write_text
    from opfuse.model.sessions import open_session
    from opfuse.verification.compare import (
        FedInputs,
        make_inputs_and_plan,
        run_model,
        runnable_inputs,
        session,
    )

    if profile_out is not None:  # before the runs
        check_output_path(profile_out, [model_path])
    if runs < 1 or warmup < 0:
        raise OpfuseError("--runs must be at least 1 and --warmup at least 0")
    if provider not in ort.get_available_providers():
        raise OpfuseError(
            f"--provider {provider}: not available here "
            f"({', '.join(ort.get_available_providers())})"
        )
    shown = shown_as or model_path
    hint = "" if inputs_npz is not None else GENERATED_HINT
    with tempfile.TemporaryDirectory(prefix="opfuse-profile-") as tmp:

        def profiling() -> ort.InferenceSession:
            return open_session(
                model_path,
                provider=provider,
                cpu_fallback=True,
                threads=threads,
                graph_opt=graph_opt,
                profile_prefix=os.path.join(tmp, "ort"),
                optimized_path=optimized_out if graph_opt != "disable" else None,
                name=shown,
            )

        sess = profiling()
        feeds, plan = make_inputs_and_plan(sess, input_shapes, inputs_npz, model=model_path)
        try:
            run_model(sess, feeds, shown, hint)
        except OpfuseError:
            if plan is None or not plan.free:
                raise
            # sizes onnxruntime refuses grow (or the refusal is raised); a fresh profile
            feeds, plan, _ = runnable_inputs(
                session(model_path), input_shapes, None, 0, model_path, shown, hint
            )
            sess.end_profiling()
            sess = profiling()
            run_model(sess, feeds, shown, hint)
        total = warmup + runs
        for i in range(total):
            if i:  # the first ran above
                run_model(sess, feeds, shown, hint)
            if progress:
                progress(i + 1, total)
        raw = sess.end_profiling()
        events = json.loads(Path(raw).read_text("utf-8"))
        if profile_out is not None:
            write_text(
                profile_out, json.dumps(events) + "\n", inputs=[model_path], what="the profile"
            )
    profile = parse_ort_events(events, warmup)
    profile.provider, profile.graph_opt = provider, graph_opt
    profile.inputs = [
        InputShape(
            i.name, [int(d) for d in feeds[i.name].shape], [declared_dim(d) for d in i.shape]
        )
        for i in sess.get_inputs()
        if i.name in feeds and hasattr(feeds[i.name], "shape")
    ]
    if optimized_out is not None and graph_opt != "disable":
        profile.ort_optimized_model = str(optimized_out)
    profile.fed = FedInputs.of(feeds, plan, inputs_npz, 0)
    profile.sized = tuple(input_shapes or ())
    return profile


# the inputs are generated (seeded random values, the sizes --input-shape gives or opfuse's)
GENERATED_HINT = (
    " (the inputs were generated; give the inputs you run the model on, --inputs "
    "samples.npz, or their sizes, --input-shape NAME:D0,D1,...)"
)


# --- Ascend msprof op_summary CSV ------------------------------------------------------------

# canonical field -> accepted column names (normalized: lower case, no spaces, _ or units)
CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "op_name": ("opname", "name"),
    "op_type": ("optype", "type"),
    "duration": ("taskduration", "duration", "taskdurationus", "aicoretime"),
    "task_type": ("tasktype",),
    "input_shapes": ("inputshapes", "inputshape"),
    "mac_ratio": ("aicmacratio", "macratio", "aiccubefp16ratio", "cubefp16ratio"),
    "vec_ratio": ("aicvecratio", "vecratio", "aivvecratio", "vecfp16ratio"),
    "mte2_ratio": ("aicmte2ratio", "mte2ratio", "aivmte2ratio"),
    "mte3_ratio": ("aicmte3ratio", "aivmte3ratio", "mte3ratio"),
    "start": ("taskstarttime", "taskstarttimeus", "starttime"),
    "infer_id": ("inferid", "iterationid"),
}
UNREPORTED = ("start", "infer_id")  # used when present, never reported missing
# the column each field is reported as (msprof's own spelling)
CSV_TITLES = {
    "op_name": "Op Name",
    "op_type": "OP Type",
    "duration": "Task Duration(us)",
    "task_type": "Task Type",
    "input_shapes": "Input Shapes",
    "mac_ratio": "aic_mac_ratio",
    "vec_ratio": "aic_vec_ratio",
    "mte2_ratio": "aic_mte2_ratio",
    "mte3_ratio": "aic_mte3_ratio",
}
REQUIRED = ("op_name", "op_type", "duration")
RATIO_FIELDS = ("mac_ratio", "vec_ratio", "mte2_ratio", "mte3_ratio")


def _norm(column: str) -> str:
    column = re.sub(r"\((us|μs|ns|ms)\)", "", column.strip().lower())
    return re.sub(r"[\s_()\-]", "", column)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _csv_shapes(text: str) -> list[list[int]]:
    shapes = []
    for part in text.strip().strip('"').split(";"):
        dims = [int(d) for d in re.findall(r"-?\d+", part)]
        shapes.append(dims)
    return shapes


def _per_run(rows: list[float], runs: int) -> list[float]:
    """A node's time in each of ``runs`` runs, its rows taken in execution order as equal
    consecutive shares (a node called k times per run has k * runs rows); the mean of each
    run where its rows do not split evenly into the runs."""
    if len(rows) % runs:
        return [sum(rows) / runs] * runs
    k = len(rows) // runs
    return [sum(rows[i : i + k]) for i in range(0, len(rows), k)]


def read_op_summary(path: str | os.PathLike[str]) -> Profile:
    """msprof's op_summary CSV; column names drift between CANN versions, so each field
    accepts several spellings, and the missing optional ones are reported."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise OpfuseError(f"{path}: cannot read the op summary: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise OpfuseError(
            f"{path}: not a text CSV (byte {exc.start} is not UTF-8); "
            "expected msprof's op_summary_*.csv"
        ) from None
    except csv.Error as exc:
        raise OpfuseError(f"{path}: not a CSV op summary ({exc})") from None
    if not rows:
        raise OpfuseError(f"{path}: empty op summary")
    header = [_norm(c) for c in rows[0]]
    column: dict[str, int] = {}
    for key, aliases in CSV_COLUMNS.items():
        for alias in aliases:
            if alias in header:
                column[key] = header.index(alias)
                break
    missing_required = [k for k in REQUIRED if k not in column]
    if missing_required:
        raise OpfuseError(
            f"{path}: op summary lacks the column(s) "
            f"{', '.join(CSV_TITLES[k] for k in missing_required)} (header: {', '.join(rows[0])})"
        )
    missing = [CSV_TITLES[k] for k in CSV_COLUMNS if k not in column and k not in UNREPORTED]
    data = [r for r in rows[1:] if len(r) > column["duration"] and any(c.strip() for c in r)]
    if "start" in column:
        data.sort(key=lambda r: _float(r[column["start"]]) or 0.0)

    def cell(row: list[str], key: str) -> str:
        i = column.get(key)
        return row[i].strip() if i is not None and i < len(row) else ""

    records: dict[str, OpRecord] = {}
    sums: dict[str, dict[str, list[float]]] = {}
    calls: Counter[str] = Counter()
    durations: dict[str, list[float]] = {}  # node -> its rows' durations, in order
    by_run: dict[str, dict[str, float]] = {}  # node -> its time per Infer ID
    for row in data:
        name = cell(row, "op_name")
        dur = _float(cell(row, "duration"))
        if not name or dur is None:
            continue
        rec = records.get(name)
        if rec is None:
            shapes_text = cell(row, "input_shapes")
            rec = records[name] = OpRecord(
                name,
                cell(row, "op_type"),
                0.0,
                input_shapes=_csv_shapes(shapes_text) if shapes_text else [],
                provider=cell(row, "task_type"),
                shapes_text=shapes_text.strip('"'),
            )
        durations.setdefault(name, []).append(dur)
        per_id = by_run.setdefault(name, {})
        per_id[cell(row, "infer_id")] = per_id.get(cell(row, "infer_id"), 0.0) + dur
        calls[name] += 1
        for key in RATIO_FIELDS:
            value = _float(cell(row, key))
            if value is not None:
                sums.setdefault(name, {}).setdefault(key, []).append(value)
    if not records:
        raise OpfuseError(f"{path}: no operator rows with a duration")
    run_ids = sorted({i for times in by_run.values() for i in times})
    if "infer_id" in column and "" not in run_ids:  # msprof numbers the inference runs
        runs = len(run_ids)
    else:  # the number of times most operators ran
        runs = Counter(calls.values()).most_common(1)[0][0]
    for name, rec in records.items():
        rec.calls = max(1, round(calls[name] / runs))
        if "infer_id" in column and "" not in run_ids:
            rec.runs_us = [by_run[name].get(i, 0.0) for i in run_ids]
        else:
            rec.runs_us = _per_run(durations[name], runs)
        rec.duration_us = statistics.median(rec.runs_us)

        rec.ratios = {k: sum(v) / len(v) for k, v in sums.get(name, {}).items()}
    notes = []
    if missing:
        notes.append(f"op summary columns missing: {', '.join(missing)}")
    return Profile(
        "op_summary",
        list(records.values()),
        runs,
        path=str(path),
        missing_columns=missing,
        notes=notes,
    )


# --- statistics ("Op Statistic") ----------------------------------------------------------------


@dataclass
class OpStat:
    op_type: str
    count: int
    total_us: float
    mean_us: float
    share: float


def op_statistic(records: list[OpRecord]) -> list[OpStat]:
    """Per op type: node calls per run, total and mean time, share of the total."""
    total = sum(r.duration_us for r in records) or 1.0
    count: Counter[str] = Counter()
    time: dict[str, float] = {}
    for r in records:
        count[r.op_type] += r.calls
        time[r.op_type] = time.get(r.op_type, 0.0) + r.duration_us
    stats = [
        OpStat(op, count[op], time[op], time[op] / max(count[op], 1), time[op] / total)
        for op in time
    ]
    return sorted(stats, key=lambda s: -s.total_us)


def top_nodes(records: list[OpRecord], n: int) -> list[OpRecord]:
    return sorted(records, key=lambda r: -r.duration_us)[:n]
