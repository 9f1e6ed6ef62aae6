"""The advisor's report as typed sections (schema ``opfuse.advise/2``, docs/ADVISOR.md).

sections.py builds them from the ``Analysis``; render.py's table gives each section one
text and one HTML renderer; ``to_json()`` of each is the section's JSON, key for key as
the schema lists it (``AdviceReport.to_json()`` is the whole report). ``AdviceReport`` is
also a read-only mapping of that JSON (``report["profile"]["runs"]``), as ``advise()``'s
dict was."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from opfuse.advisor.l2 import RATIO_KEYS
from opfuse.advisor.pass_verdict import Verdict
from opfuse.advisor.profile_readers import InputShape
from opfuse.runtime.targets import Target
from opfuse.verification.compare import FedInputs

# a Next steps command whose output has the model's nodes (its ``effect``): not measured,
# never recommended
NO_CHANGE = "no node changed"

Json = dict[str, object]


@dataclass(frozen=True)
class TargetInfo:
    """The target the estimates use, and whether its peaks were measured here."""

    target: Target
    peaks: str  # "measured" or "file"
    peaks_measured_on: str | None

    @property
    def name(self) -> str:
        return self.target.name

    def to_json(self) -> Json:
        return {
            **self.target.to_json(),
            "peaks": self.peaks,
            "peaks_measured_on": self.peaks_measured_on,
        }


@dataclass(frozen=True)
class GraphInfo:
    analysed: str
    nodes_original: int | None
    nodes_analysed: int
    constant_nodes_counted: bool
    subgraphs: int
    quantized: bool

    def to_json(self) -> Json:
        return {
            "analysed": self.analysed,
            "nodes_original": self.nodes_original,
            "nodes_analysed": self.nodes_analysed,
            "constant_nodes_counted": self.constant_nodes_counted,
            "subgraphs": self.subgraphs,
            "quantized": self.quantized,
        }


@dataclass(frozen=True)
class ProfileInfo:
    source: str
    path: str | None
    runs: int
    warmup: int
    provider: str | None
    graph_opt: str | None
    total_us: float
    run_total_median_us: float | None
    total_iqr_us: float
    variance_warning: str | None
    unmapped_us: float
    unmapped_nodes: list[str]
    inputs: list[InputShape]
    input_shape_hint: str | None
    missing_columns: list[str]
    notes: list[str]
    inputs_fed: FedInputs | None = None  # what opfuse fed (None: a profile read)

    def to_json(self) -> Json:
        return {
            "source": self.source,
            "path": self.path,
            "runs": self.runs,
            "warmup": self.warmup,
            "provider": self.provider,
            "graph_opt": self.graph_opt,
            "total_us": self.total_us,
            "run_total_median_us": self.run_total_median_us,
            "total_iqr_us": self.total_iqr_us,
            "variance_warning": self.variance_warning,
            "unmapped_us": self.unmapped_us,
            "unmapped_nodes": list(self.unmapped_nodes),
            "inputs": [i.to_json() for i in self.inputs],
            "input_shape_hint": self.input_shape_hint,
            "missing_columns": list(self.missing_columns),
            "notes": list(self.notes),
            "inputs_fed": None if self.inputs_fed is None else self.inputs_fed.to_json(),
        }


@dataclass(frozen=True)
class Finding:
    """A finding on a quantized (QDQ) model: what, why it costs, what to do."""

    kind: str
    finding: str
    why: str
    what_to_do: str
    nodes: list[str]  # the first few (``count`` in all)
    count: int
    cost_us: float

    def to_json(self) -> Json:
        return {
            "kind": self.kind,
            "finding": self.finding,
            "why": self.why,
            "what_to_do": self.what_to_do,
            "nodes": list(self.nodes),
            "count": self.count,
            "cost_us": self.cost_us,
        }


@dataclass
class StepCommand:
    """One Next steps command, built, verified and measured against the model."""

    command: str
    flags: list[str]
    why: str
    ratio: float | None = None
    noise: float | None = None
    runs: int = 0
    effect: str | None = None
    helps: bool = False
    error: str | None = None

    @property
    def unchanged(self) -> bool:
        """The command's output has the model's nodes: not measured, never recommended."""
        return self.effect == NO_CHANGE and not self.error

    def to_json(self) -> Json:
        return {
            "command": self.command,
            "flags": list(self.flags),
            "why": self.why,
            "ratio": self.ratio,
            "noise": self.noise,
            "runs": self.runs,
            "effect": self.effect,
            "helps": self.helps,
            "error": self.error,
        }


@dataclass(frozen=True)
class Dominant:
    """An op type with much of the time, and the tuning guide's suggestion for it."""

    op_type: str
    share: float
    suggestion: str

    def to_json(self) -> Json:
        return {"op_type": self.op_type, "share": self.share, "suggestion": self.suggestion}


@dataclass(frozen=True)
class NextSteps:
    trial: str | None  # how the commands were measured (None: not measured)
    skipped: str | None  # why there was no trial
    commands: list[StepCommand]
    helps: bool
    dominant: list[Dominant]
    inputs: FedInputs | None = None  # what the trial timed on (None: no trial)

    def to_json(self) -> Json:
        return {
            "trial": self.trial,
            "skipped": self.skipped,
            "commands": [c.to_json() for c in self.commands],
            "helps": self.helps,
            "dominant": [d.to_json() for d in self.dominant],
            "inputs": None if self.inputs is None else self.inputs.to_json(),
        }


@dataclass(frozen=True)
class OpTime:
    """One op type's time per run (msadvisor's Op Statistic)."""

    op_type: str
    count: int
    total_us: float
    mean_us: float
    share: float

    def to_json(self) -> Json:
        return {
            "op_type": self.op_type,
            "count": self.count,
            "total_us": self.total_us,
            "mean_us": self.mean_us,
            "share": self.share,
        }


@dataclass(frozen=True)
class PeakShare:
    flops: float
    bandwidth: float

    def to_json(self) -> Json:
        return {"flops": self.flops, "bandwidth": self.bandwidth}


@dataclass(frozen=True)
class TopNode:
    """A profiled node (or kernel), slowest first."""

    name: str
    op_type: str
    duration_us: float
    iqr_us: float
    share: float
    provider: str | None
    nodes: list[str]  # the model's nodes behind the name
    of_peak: PeakShare | None

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "duration_us": self.duration_us,
            "iqr_us": self.iqr_us,
            "share": self.share,
            "provider": self.provider,
            "nodes": list(self.nodes),
            "of_peak": self.of_peak.to_json() if self.of_peak is not None else None,
        }


@dataclass(frozen=True)
class Activation:
    name: str
    nodes: list[str]

    def to_json(self) -> Json:
        return {"name": self.name, "nodes": list(self.nodes)}


@dataclass(frozen=True)
class OrtFusion:
    """Whether onnxruntime runs a group as one kernel ("yes", "partly", "no")."""

    fuses: str
    kernels: list[str]
    absorbed: list[str]

    def to_json(self) -> Json:
        return {"fuses": self.fuses, "kernels": list(self.kernels), "absorbed": list(self.absorbed)}


@dataclass(frozen=True)
class NextStepLabel:
    """The measured Next steps command that fuses a group."""

    command: str
    ratio: float | None
    helps: bool

    def to_json(self) -> Json:
        return {"command": self.command, "ratio": self.ratio, "helps": self.helps}


@dataclass
class UBGroup:
    """A group of operators a backend could fuse (msadvisor's UBModel)."""

    subgraph: int
    fusion_type: str
    kind: str
    nodes: list[str]
    op_types: list[str]
    model_nodes: list[list[str]]
    activations: list[Activation]
    edges: list[list[int]]
    duration_us: float
    share: float
    opfuse_removes_us: float | None
    opfuse: Verdict
    onnxruntime: OrtFusion | None
    next_step: NextStepLabel | None = None  # set once Next steps are measured

    @property
    def runtime_fuses(self) -> bool:
        """Whether onnxruntime already runs the group as one kernel."""
        return self.onnxruntime is not None and self.onnxruntime.fuses == "yes"

    def to_json(self) -> Json:
        return {
            "subgraph": self.subgraph,
            "fusion_type": self.fusion_type,
            "kind": self.kind,
            "nodes": list(self.nodes),
            "op_types": list(self.op_types),
            "model_nodes": [list(n) for n in self.model_nodes],
            "activations": [a.to_json() for a in self.activations],
            "edges": [list(e) for e in self.edges],
            "duration_us": self.duration_us,
            "share": self.share,
            "opfuse_removes_us": self.opfuse_removes_us,
            "opfuse": self.opfuse.to_json(),
            "onnxruntime": self.onnxruntime.to_json() if self.onnxruntime is not None else None,
            "next_step": self.next_step.to_json() if self.next_step is not None else None,
        }


@dataclass(frozen=True)
class AippChain:
    """Input conversion and normalization before the first Conv (AippFusionModel)."""

    nodes: list[str]
    op_types: list[str]
    normalization: list[str]
    first_conv: str
    duration_us: float
    opfuse: Verdict

    def to_json(self) -> Json:
        return {
            "nodes": list(self.nodes),
            "op_types": list(self.op_types),
            "normalization": list(self.normalization),
            "first_conv": self.first_conv,
            "duration_us": self.duration_us,
            "opfuse": self.opfuse.to_json(),
        }


@dataclass(frozen=True)
class L2Op:
    """One operator of an L2 chain with msprof's busy ratios (or estimates)."""

    name: str
    op_type: str
    input_shapes: str
    ratios: dict[str, float | None]  # RATIO_KEYS -> ratio (None: unknown)
    duration_us: float

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "input_shapes": self.input_shapes,
            **{k: self.ratios.get(k) for k in RATIO_KEYS},
            "duration_us": self.duration_us,
        }


@dataclass(frozen=True)
class BatchSplit:
    batch: int
    split_to: int
    runs: int

    def to_json(self) -> Json:
        return {"batch": self.batch, "split_to": self.split_to, "runs": self.runs}


@dataclass(frozen=True)
class L2Chain:
    """Operators whose intermediates could stay in L2 (msadvisor's L2Model)."""

    nodes: list[str]
    duration_us: float
    batch: int
    max_intermediate_bytes: int
    batch_split: BatchSplit | None
    ratios_source: str
    ops: list[L2Op]
    opfuse: Verdict

    def to_json(self) -> Json:
        return {
            "nodes": list(self.nodes),
            "duration_us": self.duration_us,
            "batch": self.batch,
            "max_intermediate_bytes": self.max_intermediate_bytes,
            "batch_split": self.batch_split.to_json() if self.batch_split is not None else None,
            "ratios_source": self.ratios_source,
            "ops": [op.to_json() for op in self.ops],
            "opfuse": self.opfuse.to_json(),
        }


@dataclass(frozen=True)
class HintRow:
    """An operator constraint hint (alignment, replaceable op, Resize, fallback)."""

    kind: str
    node: str
    op_type: str
    message: str
    duration_us: float
    gain_us: float | None
    opfuse: Verdict

    def to_json(self) -> Json:
        return {
            "kind": self.kind,
            "node": self.node,
            "op_type": self.op_type,
            "message": self.message,
            "duration_us": self.duration_us,
            "gain_us": self.gain_us,
            "opfuse": self.opfuse.to_json(),
        }


@dataclass(frozen=True)
class PassReason:
    pattern: str
    reason: str
    count: int
    nodes: list[str]

    def to_json(self) -> Json:
        return {
            "pattern": self.pattern,
            "reason": self.reason,
            "count": self.count,
            "nodes": list(self.nodes),
        }


@dataclass(frozen=True)
class PassRow:
    """An opfuse pass that matched anything in the trial run (CANN's GraphFusion)."""

    pass_name: str
    section: str
    matched: int
    effected: int
    reasons: list[PassReason] = field(default_factory=list)

    def to_json(self) -> Json:
        return {
            "pass": self.pass_name,
            "section": self.section,
            "matched": self.matched,
            "effected": self.effected,
            "reasons": [r.to_json() for r in self.reasons],
        }


@dataclass(frozen=True)
class AdviceReport(Mapping[str, object]):
    """The whole report. Also a read-only mapping of its JSON (the dict ``advise()``
    returned before it was typed): ``report["ub_fusion"][0]["nodes"]`` still reads."""

    schema: str
    model: str | None
    target: TargetInfo
    ascend_sections: bool
    quantized: list[Finding]
    next_steps: NextSteps
    graph: GraphInfo
    profile: ProfileInfo
    op_statistic: list[OpTime]
    top_nodes: list[TopNode]
    ub_fusion: list[UBGroup]
    aipp_fusion: list[AippChain]
    l2_fusion: list[L2Chain]
    hints: list[HintRow]
    graph_fusion: list[PassRow]

    def summary(self, top: int = 3) -> str:
        """A few lines: the model and its profile, the ``top`` slowest op types, what the
        report found, the next step measured to help. The whole text report is
        ``opfuse.advisor.render.render_text`` (what ``opfuse advise`` prints)."""
        p = self.profile
        lines = [
            f"{self.model or self.graph.analysed}: {self.graph.nodes_analysed} nodes; "
            f"{p.total_us:.1f} us per run ({p.source}, {p.runs} runs); target {self.target.name}"
        ]
        slow = ", ".join(f"{s.op_type} {s.share:.0%}" for s in self.op_statistic[:top])
        lines.append(f"slowest op types: {slow or 'none'}")
        if self.ascend_sections:
            lines.append(
                f"{len(self.ub_fusion)} UB fusion groups, {len(self.aipp_fusion)} AIPP chains, "
                f"{len(self.l2_fusion)} L2 chains, {len(self.hints)} operator hints"
            )
        helps = [c for c in self.next_steps.commands if c.helps]
        if helps:
            lines.append(f"next step: {helps[0].command}")
        return "\n".join(lines)

    def to_json(self) -> Json:
        return {
            "schema": self.schema,
            "model": self.model,
            "target": self.target.to_json(),
            "ascend_sections": self.ascend_sections,
            "quantized": [f.to_json() for f in self.quantized],
            "next_steps": self.next_steps.to_json(),
            "graph": self.graph.to_json(),
            "profile": self.profile.to_json(),
            "op_statistic": [s.to_json() for s in self.op_statistic],
            "top_nodes": [n.to_json() for n in self.top_nodes],
            "ub_fusion": [g.to_json() for g in self.ub_fusion],
            "aipp_fusion": [a.to_json() for a in self.aipp_fusion],
            "l2_fusion": [c.to_json() for c in self.l2_fusion],
            "hints": [h.to_json() for h in self.hints],
            "graph_fusion": [r.to_json() for r in self.graph_fusion],
        }

    # the read-only mapping of the JSON
    def __getitem__(self, key: str) -> object:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())

    def unfused_and_fused(self) -> tuple[list[UBGroup], list[UBGroup]]:
        """Groups onnxruntime does not fuse (report order), and those it already runs as one."""
        fused = [g for g in self.ub_fusion if g.runtime_fuses]
        return [g for g in self.ub_fusion if not g.runtime_fuses], fused


# the sections opfuse's own modules still produce as JSON rows (quantized.py's findings,
# nextsteps.py's commands and suggestions, the trial's pass summary), read once here


def _str_list(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def _opt_str(value: object) -> str | None:
    return str(value) if value is not None else None


def finding_of(row: Mapping[str, object]) -> Finding:
    return Finding(
        kind=str(row["kind"]),
        finding=str(row["finding"]),
        why=str(row["why"]),
        what_to_do=str(row["what_to_do"]),
        nodes=_str_list(row["nodes"]),
        count=_int(row["count"]),
        cost_us=_float(row["cost_us"]) or 0.0,
    )


def step_command_of(row: Mapping[str, object]) -> StepCommand:
    return StepCommand(
        command=str(row["command"]),
        flags=_str_list(row["flags"]),
        why=str(row["why"]),
        ratio=_float(row["ratio"]),
        noise=_float(row["noise"]),
        runs=_int(row["runs"]),
        effect=_opt_str(row["effect"]),
        helps=bool(row["helps"]),
        error=_opt_str(row["error"]),
    )


def dominant_of(row: Mapping[str, object]) -> Dominant:
    return Dominant(str(row["op_type"]), _float(row["share"]) or 0.0, str(row["suggestion"]))


def pass_row_of(row: Mapping[str, object]) -> PassRow:
    reasons = row["reasons"]
    return PassRow(
        pass_name=str(row["pass"]),
        section=str(row["section"]),
        matched=_int(row["matched"]),
        effected=_int(row["effected"]),
        reasons=[
            PassReason(str(r["pattern"]), str(r["reason"]), _int(r["count"]), _str_list(r["nodes"]))
            for r in (reasons if isinstance(reasons, list) else [])
        ],
    )
