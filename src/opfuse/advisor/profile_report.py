"""``opfuse profile`` as a function: profile a model with onnxruntime and put each slow
kernel's time on the model's nodes it runs. The command renders what it returns."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from opfuse.advisor.attribution import Resolver, attribute, original_nodes
from opfuse.advisor.graph import from_model
from opfuse.advisor.profile_readers import (
    OpRecord,
    OpStat,
    Profile,
    op_statistic,
    run_onnxruntime,
    top_nodes,
)
from opfuse.advisor.report import (
    CAPTION,
    ORIGINAL,
    inputs_line,
    nodes_text,
    op_statistic_table,
    plain_text,
)
from opfuse.advisor.settings import ProfileSettings
from opfuse.model.io import check_output_path, load_model, read_model, read_proto

Step = Callable[..., None]  # step(what) shows a phase; step(what, done, total) a count
# the level opfuse profile profiles at unless told: the graph onnxruntime deploys
PROFILE_GRAPH_OPT = "all"


@dataclass(frozen=True)
class ProfileReport:
    """A model's profile: the op statistic per op type and the slowest nodes, each with
    the model's nodes its time belongs to (``originals``, by the profiled name)."""

    nodes: int  # the model's nodes (Constant nodes not counted, as advise counts them)
    graph_opt: str
    profile: Profile
    op_statistic: list[OpStat]
    slow: list[OpRecord]
    originals: dict[str, list[str]]

    def summary(self, model: str = "model") -> str:
        """The text ``opfuse profile`` prints (``model``: the name its first line gives),
        plain."""
        provider = self.profile.provider or "CPUExecutionProvider"
        return plain_text(lambda console: render_profile(self, console, model, provider))

    def to_json(self) -> dict[str, object]:
        p = self.profile
        total = p.total_us or 1.0
        return {
            "nodes": self.nodes,
            "graph_opt": self.graph_opt,
            "runs": p.runs,
            "warmup": p.warmup,
            "total_us": p.total_us,
            "inputs": [i.to_json() for i in p.inputs],
            "inputs_fed": None if p.fed is None else p.fed.to_json(),
            "op_statistic": [
                {
                    "op_type": s.op_type,
                    "count": s.count,
                    "total_us": s.total_us,
                    "mean_us": s.mean_us,
                    "share": s.share,
                }
                for s in self.op_statistic
            ],
            "top_nodes": [
                {
                    "name": r.name,
                    "op_type": r.op_type,
                    "count": r.calls,
                    "total_us": r.duration_us,
                    "mean_us": r.duration_us / r.calls,
                    "share": r.duration_us / total,
                    "provider": r.provider,
                    "nodes": self.originals[r.name],
                }
                for r in self.slow
            ],
        }


def profile(
    model: str | os.PathLike[str],
    settings: ProfileSettings | None = None,
    *,
    top: int = 20,
    profile_out: str | os.PathLike[str] | None = None,
    step: Step | None = None,
) -> ProfileReport:
    """Profile ``model`` with onnxruntime (``settings.runs`` after ``settings.warmup``;
    graph optimization level ``settings.graph_opt``, default ``all``: the graph
    onnxruntime deploys), writing onnxruntime's profile JSON to ``profile_out`` when given
    (never over the model); ``top``: the slow nodes listed."""
    settings = settings or ProfileSettings()
    graph_opt = settings.graph_opt or PROFILE_GRAPH_OPT
    step = step or (lambda what, done=0, total=None: None)
    read_proto(model)
    if profile_out is not None:  # before the runs: never over the model, a folder that exists
        check_output_path(profile_out, [model])
    with tempfile.TemporaryDirectory(prefix="opfuse-profile-") as tmp:
        step("onnxruntime: session and warm-up runs")
        prof = run_onnxruntime(
            model,
            runs=settings.runs,
            warmup=settings.warmup,
            threads=settings.threads,
            provider=settings.provider,
            graph_opt=graph_opt,
            input_shapes=settings.input_shapes,
            inputs_npz=settings.inputs,
            profile_out=profile_out,
            optimized_out=Path(tmp) / "ort_optimized.onnx",
            progress=lambda done, total: step("profiling", done, total),
        )
        # map onnxruntime's fused kernel names back to the model's nodes
        step("mapping onnxruntime's kernels to the model's nodes")
        graph = from_model(load_model(model))
        if prof.ort_optimized_model:  # kernels are placed on the graph onnxruntime ran
            runtime = from_model(read_model(prof.ort_optimized_model))
            resolver = Resolver(graph, runtime=runtime)
            placed = attribute(prof.records, Resolver(runtime))
        else:
            resolver = Resolver(graph)
            placed = attribute(prof.records, resolver)
    slow = top_nodes(prof.records, top)
    return ProfileReport(
        nodes=len(graph.nodes),
        graph_opt=graph_opt,
        profile=prof,
        op_statistic=op_statistic(prof.records),
        slow=slow,
        originals={r.name: original_nodes(r.name, resolver, placed) for r in slow},
    )


# the columns ``opfuse profile`` right-aligns
NUMERIC = ("Count", "Total Time(us)", "Avg Time(us)", "Ratio(%)")


def fit_columns(
    columns: Sequence[str], rows: Sequence[Sequence[str]], width: int, keep: Sequence[str] = ()
) -> tuple[list[str], list[list[str]], str]:
    """On a terminal too narrow for the whole table, drop (except ``keep``) the columns
    whose value is the same in every row, said once instead (``Count 1, Provider
    CPUExecutionProvider``), and those equal to an earlier column in every row (the
    average when every count is 1). Returns the columns, the rows and the note."""
    natural = sum(max([len(c), *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns))
    if natural <= width or len(rows) < 2:
        return list(columns), [list(r) for r in rows], ""
    constant = [
        i
        for i, c in enumerate(columns)
        if c not in keep and len({r[i] for r in rows}) == 1 and rows[0][i]
    ]
    kept: list[int] = []
    for i, c in enumerate(columns):
        repeats = any(all(r[i] == r[j] for r in rows) for j in kept)
        if i not in constant and (c in keep or not repeats):
            kept.append(i)
    same = ", ".join(f"{columns[i]} {rows[0][i]}" for i in constant)
    return [columns[i] for i in kept], [[r[i] for i in kept] for r in rows], same


def render_profile(report: ProfileReport, console: Console, model: str, provider: str) -> None:
    """``opfuse profile``'s text: the op statistic (as advise prints it) and the slow nodes."""
    prof = report.profile
    total = prof.total_us or 1.0
    console.print(
        f"{model}: {report.nodes} nodes (Constant nodes not counted, as advise counts "
        f"them); {prof.runs} runs after {prof.warmup} warm-up, {prof.total_us:.1f} us per run "
        f"({provider}, onnxruntime graph optimization level {report.graph_opt})",
        markup=False,
    )
    if prof.inputs:
        console.print(inputs_line(prof.inputs, prof.input_shape_hint(), prof.fed), markup=False)
    # per run, as advise prints it: counts per run, each node's median time over the runs
    console.print(op_statistic_table(report.op_statistic))
    columns = (
        "Op Name",
        "OP Type",
        "Count",
        "Total Time(us)",
        "Avg Time(us)",
        "Ratio(%)",
        "Provider",
        ORIGINAL,
    )
    rows = [
        (
            r.name,
            r.op_type,
            str(r.calls),
            f"{r.duration_us:.3f}",
            f"{r.duration_us / r.calls:.3f}",
            f"{100 * r.duration_us / total:.2f}",
            r.provider,
            nodes_text(r.name, report.originals[r.name]),
        )
        for r in report.slow
    ]
    shown, cells, same = fit_columns(
        columns, rows, console.width, keep=("Op Name", "Total Time(us)")
    )
    table = Table(
        title=f"Top {len(report.slow)} slow nodes (per run)" + (f"; {same}" if same else ""),
        title_justify="left",
        caption=CAPTION,
    )
    for col in shown:
        table.add_column(col, justify="right" if col in NUMERIC else "left", overflow="fold")
    for row in cells:
        table.add_row(*row)
    console.print(table)
