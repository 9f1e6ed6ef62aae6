"""``opfuse profile`` as a function: profile a model with onnxruntime and put each slow
kernel's time on the model's nodes it runs. The command renders what it returns."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

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
from opfuse.model.io import check_output_path, load_model, read_model, read_proto

Step = Callable[..., None]  # step(what) shows a phase; step(what, done, total) a count


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

    def to_json(self) -> dict[str, object]:
        p = self.profile
        total = p.total_us or 1.0
        return {
            "nodes": self.nodes,
            "graph_opt": self.graph_opt,
            "runs": p.runs,
            "warmup": p.warmup,
            "total_us": p.total_us,
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
    *,
    runs: int = 10,
    warmup: int = 2,
    threads: int = 0,
    provider: str = "CPUExecutionProvider",
    graph_opt: str = "all",
    input_shapes: Mapping[str, list[int]] | None = None,
    top: int = 20,
    profile_out: str | os.PathLike[str] | None = None,
    step: Step | None = None,
) -> ProfileReport:
    """Profile ``model`` with onnxruntime (``runs`` after ``warmup``), writing
    onnxruntime's profile JSON to ``profile_out`` when given (never over the model)."""
    step = step or (lambda what, done=0, total=None: None)
    read_proto(model)
    if profile_out is not None:  # before the runs: never over the model, a folder that exists
        check_output_path(profile_out, [model])
    with tempfile.TemporaryDirectory(prefix="opfuse-profile-") as tmp:
        step("onnxruntime: session and warm-up runs")
        prof = run_onnxruntime(
            model,
            runs=runs,
            warmup=warmup,
            threads=threads,
            provider=provider,
            graph_opt=graph_opt,
            input_shapes=input_shapes,
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
