"""The advisor's analysis: the value its sections read. The profile's times placed on the
graph that ran (the model after opfuse's default passes, the kernels of a given profile,
or an op summary's operators), with opfuse's trial run and onnxruntime's own fusions."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import onnx_ir as ir

from opfuse.advisor.attribution import Attribution, Resolver
from opfuse.advisor.executed_graph import RanGraph
from opfuse.advisor.graph import OpGraph
from opfuse.advisor.machine_peaks import Measure, Peaks
from opfuse.advisor.nextsteps import TRIAL_SECONDS
from opfuse.advisor.profile_readers import OpRecord, Profile
from opfuse.advisor.report_types import OrtFusion
from opfuse.advisor.settings import ProfileSettings
from opfuse.advisor.trial import Refusal, Trial
from opfuse.runtime import Runtime
from opfuse.runtime.targets import Target

Step = Callable[[str, int, int], None]


@dataclass(frozen=True)
class AdviseOptions(ProfileSettings):
    """What ``opfuse.advise`` takes: the profiling settings ``opfuse.profile`` takes too
    (``ProfileSettings``: runs, warmup, threads, provider, graph_opt, input_shapes; checked
    on construction) and the advisor's own."""

    target: str | None = None
    top: int = 10
    compare_onnxruntime: bool = True
    calibrate: bool = True  # cpu/cuda: this machine's peaks instead of the file's
    measure_peaks: Measure | None = None  # calibrate.measure_onnxruntime unless given
    next_steps: bool = True  # the short trial of opfuse's commands
    runtime: Runtime | None = None  # the trial's runtime: onnxruntime at ORT_ENABLE_ALL
    trial_seconds: float = TRIAL_SECONDS

    @classmethod
    def of(cls, profiling: ProfileSettings, **advisor: Any) -> AdviseOptions:
        """The advisor's options over profiling settings made already (the CLI's group)."""
        return cls(
            **{f.name: getattr(profiling, f.name) for f in fields(ProfileSettings)}, **advisor
        )


def ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


@dataclass(frozen=True)
class Analysis:
    """What the sections read; made once by ``advise.analyse``, never changed after."""

    opts: AdviseOptions
    step: Step
    model_path: str | os.PathLike[str] | None
    target: Target
    peaks: Peaks | None  # this machine's, measured (None: the target file's)
    profile: Profile
    # the model (None with an op summary alone): shapes inferred, and opfuse's trial on it
    original: ir.Model | None
    original_graph: OpGraph | None
    original_types: dict[str, str]
    trial: Trial | None
    # the graph the groups are grown on, and the profile's times placed on it
    graph: OpGraph
    times: Attribution
    resolver: Resolver
    ran: RanGraph | None  # the graph that ran, when it is not the analysed model
    ran_kernels_fused: bool  # the profile's kernels are onnxruntime's fused graph
    quantized: bool  # the model has QuantizeLinear/DequantizeLinear (a QDQ model)
    node_of: dict[str, int]  # model node name -> the analysed node that holds its time
    runtime_kernels: dict[int, list[str]] | None  # onnxruntime's kernels per analysed node

    def removed_us(self, members: list[int]) -> float | None:
        """The measured time of the operators whose model nodes opfuse's default passes all
        remove (Casts, Transposes, BatchNorm small ops); None where the profile is of the
        graph after those passes."""
        if self.ran is None or self.trial is None or self.profile.source == "onnxruntime":
            return None
        kept = self.trial.node_types
        return sum(self.time(m) for m in members if not any(n in kept for n in self.ran.runs[m]))

    def record(self, index: int) -> OpRecord | None:
        return self.times.record.get(index)

    def time(self, index: int) -> float:
        return self.times.time_us.get(index, 0.0)

    def out_bytes(self, index: int) -> int | None:
        node = self.graph.nodes[index]
        rec = self.record(index)
        itemsize = self.graph.itemsize.get(node.outputs[0], self.target.dtype_bytes)
        if rec is not None and rec.output_shapes and rec.output_shapes[0]:
            return int(_prod(rec.output_shapes[0])) * itemsize
        if self.graph.chain:  # the next op's first input shape, as msprof printed it
            for c in self.graph.consumers.get(node.outputs[0], []):
                nrec = self.record(c)
                if nrec is not None and nrec.input_shapes and nrec.input_shapes[0]:
                    return int(_prod(nrec.input_shapes[0])) * self.target.dtype_bytes
            return None
        return self.graph.tensor_bytes(node.outputs[0], itemsize)

    def in_shapes(self, index: int) -> list[list[int]]:
        rec = self.record(index)
        if rec is not None and rec.input_shapes:
            return rec.input_shapes
        node = self.graph.nodes[index]
        shapes = []
        for t in (*node.inputs, *node.const_inputs):
            s = self.graph.shapes.get(t)
            if s is None or any(d is None for d in s):
                return []
            shapes.append([d for d in s if d is not None])  # all known: checked above
        return shapes

    def batch(self, index: int) -> int:
        shapes = self.in_shapes(index)
        return int(shapes[0][0]) if shapes and shapes[0] else 1

    # --- sections ----------------------------------------------------------------------------

    def refusals(self) -> dict[str, list[Refusal]]:
        """Node name -> the refused matches (of opfuse's trial run) that cover it."""
        refused: dict[str, list[Refusal]] = {}
        if self.trial is None:
            return refused
        for r in self.trial.refusals():
            for name in r.nodes:
                refused.setdefault(name, []).append(r)
        return refused

    def other_unit(self) -> set[int]:
        """Nodes msprof ran on the AI CPU: no UB fusion with AI Core operators."""
        if self.profile.source != "op_summary":
            return set()
        return {
            i
            for i, rec in self.times.record.items()
            if rec.provider.upper().replace(" ", "_") == "AI_CPU"
        }

    def edges(self, members: list[int]) -> list[list[int]]:
        """Edges between a group's members, as positions in its node list."""
        pos = {m: i for i, m in enumerate(members)}
        edges = []
        for m in members:
            for t in self.graph.nodes[m].inputs:
                src = self.graph.producer.get(t)
                if src in pos:
                    edges.append([pos[src], pos[m]])
        return edges

    def ort_fuses(self, members: list[int]) -> OrtFusion | None:
        if self.runtime_kernels is None:
            return None
        kernels = [k for m in members for k in self.runtime_kernels.get(m, [])]
        absorbed = [self.graph.nodes[m].name for m in members if m not in self.runtime_kernels]
        fuses = "yes" if len(kernels) <= 1 else "partly" if len(kernels) < len(members) else "no"
        return OrtFusion(fuses, kernels, absorbed)

    def ascend_sections(self) -> bool:
        """L2 fusion (and its AOE advice) is Ascend's: shown for the ascend targets, or when
        the profile has msprof's counters."""
        counters = any(r.ratios for r in self.profile.records)
        return self.target.name.startswith("ascend") or counters


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
