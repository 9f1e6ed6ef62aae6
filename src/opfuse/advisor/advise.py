"""The advisor's pipeline: profile (or read a profile), map times onto the graph that ran (a
given profile's operators or kernels; when opfuse profiles, the graph opfuse would deploy),
grow and rank fusion groups, check constraints, ask opfuse's passes and onnxruntime whether
each recommendation is already applied, and measure the next steps. Returns the JSON report
(schema ``opfuse.advise/2``, see docs/ADVISOR.md); report.py and html.py render it."""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import onnx_ir as ir

from opfuse import io
from opfuse.advisor import constraints
from opfuse.advisor.activations import find_activations
from opfuse.advisor.aipp import NORMALIZATION, aipp_chains
from opfuse.advisor.attribution import Resolver, attribute, original_nodes, runtime_kernels
from opfuse.advisor.calibrate import Measure, Peaks, machine_peaks
from opfuse.advisor.graph import OpGraph, from_chain, from_model
from opfuse.advisor.groups import Group, grow_groups, rank_groups
from opfuse.advisor.l2 import RATIO_KEYS, estimate_ratios, l2_chains
from opfuse.advisor.nextsteps import TRIAL_SECONDS, dominant, trial
from opfuse.advisor.profile import (
    OpRecord,
    Profile,
    iqr,
    op_statistic,
    read_op_summary,
    read_ort_profile,
    run_onnxruntime,
    top_nodes,
)
from opfuse.advisor.ran import RanGraph, ran_graph
from opfuse.advisor.target import load_target
from opfuse.advisor.trial import AIPP_PASS, Refusal, Trial, registered
from opfuse.advisor.verdict import Verdict
from opfuse.errors import OpfuseError, first_line
from opfuse.passes import all_passes
from opfuse.runtime import Runtime, get_runtime
from opfuse.shapes import infer_shapes

SCHEMA = "opfuse.advise/2"
# built-in targets whose peaks are measured on this machine (their files' are approximate)
CALIBRATED = frozenset({"builtin:cpu", "builtin:cuda"})
VARIANCE_NODE = 0.25  # a node's IQR over its median above which runs are called unsteady
VARIANCE_TOTAL = 0.10  # the same for the sum of all nodes per run
VARIANCE_MIN_SHARE = 0.01  # nodes below this share of the time are not worth a warning
Step = Callable[[str, int, int], None]


@dataclass
class AdviseOptions:
    target: str | None = None
    runs: int = 10
    warmup: int = 2
    threads: int = 0
    provider: str = "CPUExecutionProvider"
    graph_opt: str = "disable"
    input_shapes: Mapping[str, list[int]] | None = None
    top: int = 10
    compare_onnxruntime: bool = True
    calibrate: bool = True  # cpu/cuda: this machine's peaks instead of the file's
    measure_peaks: Measure | None = None  # calibrate.measure_onnxruntime unless given
    next_steps: bool = True  # the short trial of opfuse's commands
    runtime: Runtime | None = None  # the trial's runtime: onnxruntime at ORT_ENABLE_ALL
    trial_seconds: float = TRIAL_SECONDS


def ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def default_target(provider: str, op_summary: bool) -> str:
    if op_summary:
        return "ascend310"
    return "cuda" if provider.startswith("CUDA") else "cpu"


def _name_nodes(model: ir.Model) -> None:
    """Give every node a unique name (onnxruntime's profile names nodes by them)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def _ort_graph(path: str | os.PathLike[str], level: str, provider: str, tmp: str) -> OpGraph:
    """The graph onnxruntime runs after its own optimizations at ``level``."""
    import onnxruntime as ort

    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    out = os.path.join(tmp, f"ort_{level}_{Path(path).stem}.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = levels.get(level, levels["all"])
    opts.optimized_model_filepath = out
    opts.log_severity_level = 3
    providers = [provider] + (
        ["CPUExecutionProvider"] if provider != "CPUExecutionProvider" else []
    )
    try:
        ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as exc:
        first = first_line(exc)
        raise OpfuseError(f"{path}: onnxruntime cannot load the model: {first}") from None
    return from_model(ir.load(out))


class Advisor:
    def __init__(self, options: AdviseOptions, step: Step | None = None) -> None:
        self.opts = options
        self.step = step or (lambda what, done, total: None)

    # --- the pipeline ---------------------------------------------------------------------

    def run(
        self,
        model_path: str | os.PathLike[str] | None,
        profile_path: str | os.PathLike[str] | None = None,
        op_summary: str | os.PathLike[str] | None = None,
    ) -> dict[str, object]:
        if model_path is None and op_summary is None:
            raise OpfuseError("give a MODEL, or --op-summary CSV to advise from msprof alone")
        if profile_path is not None and op_summary is not None:
            raise OpfuseError("give --profile or --op-summary, not both")
        if profile_path is not None and model_path is None:
            raise OpfuseError("--profile needs the MODEL that produced it")
        o = self.opts
        self.target = load_target(o.target or default_target(o.provider, op_summary is not None))
        self.peaks: Peaks | None = None
        if o.calibrate and self.target.source in CALIBRATED and o.provider in ort_providers():
            self.step("measuring this machine's peaks", 0, 1)
            self.peaks = machine_peaks(o.provider, o.threads, o.measure_peaks)
            self.target = replace(
                self.target,
                peak_flops=self.peaks.flops,
                vector_flops=self.peaks.flops,
                bandwidth_bytes_per_s=self.peaks.bandwidth,
            )
            self.step("measuring this machine's peaks", 1, 1)
        with tempfile.TemporaryDirectory(prefix="opfuse-advise-") as tmp:
            self.tmp = tmp
            if model_path is not None:
                self._load(model_path)
            else:
                self.original = None
                self.trial = None
            self.profile = self._profile(model_path, profile_path, op_summary)
            self._place(model_path, profile_path, op_summary)
            self.node_of = self._node_index()
            if self.times.aligned:
                self.profile.notes.append(
                    f"{len(self.times.aligned)} kernels onnxruntime named itself (inlined "
                    f"function bodies such as {self.times.aligned[0]}) attributed by execution "
                    "order to the node without a time of its own that follows"
                )
            self.runtime_kernels: dict[int, list[str]] | None = None
            compare: str | os.PathLike[str] | None = None  # the model onnxruntime would fuse
            if model_path is not None and op_summary is None and not self.ran_kernels_fused:
                compare = self.analysed_path if self.ran is None else model_path
            if compare is not None and o.compare_onnxruntime:
                self.step("onnxruntime graph at ORT_ENABLE_ALL", 0, 1)
                runtime = _ort_graph(compare, "all", o.provider, tmp)
                self.runtime_kernels = runtime_kernels(Resolver(self.graph, runtime=runtime))
                self.step("onnxruntime graph at ORT_ENABLE_ALL", 1, 1)
            return self._report(model_path)

    def _load(self, model_path: str | os.PathLike[str]) -> None:
        self.step("opfuse trial optimization", 0, 1)
        original = io.load_model(model_path)
        _name_nodes(original)
        shaped = ir.from_proto(ir.to_proto(original))
        infer_shapes(shaped)
        self.original = shaped
        self.original_graph = from_model(shaped)
        self.original_types = {n.name: n.op_type for n in shaped.graph}
        self.trial = Trial.run(original)
        analysed = self.trial.result.model
        _name_nodes(analysed)
        self.analysed_path = os.path.join(self.tmp, "analysed.onnx")
        ir.save(analysed, self.analysed_path)
        self.graph = from_model(analysed)
        self.resolver = Resolver(self.graph, self.original_graph)
        self.step("opfuse trial optimization", 1, 1)

    def _profile(
        self,
        model_path: str | os.PathLike[str] | None,
        profile_path: str | os.PathLike[str] | None,
        op_summary: str | os.PathLike[str] | None,
    ) -> Profile:
        o = self.opts
        if op_summary is not None:
            return read_op_summary(op_summary)
        if profile_path is not None:
            profile = read_ort_profile(profile_path, o.warmup)
            profile.provider = o.provider
            return profile
        profile = run_onnxruntime(
            self.analysed_path,
            runs=o.runs,
            warmup=o.warmup,
            threads=o.threads,
            provider=o.provider,
            graph_opt=o.graph_opt,
            input_shapes=o.input_shapes,
            optimized_out=os.path.join(self.tmp, "profiled_ort.onnx"),
            progress=lambda done, total: self.step("profiling with onnxruntime", done, total),
        )
        if profile.ort_optimized_model:
            runtime = from_model(ir.load(profile.ort_optimized_model))
            self.resolver = Resolver(self.graph, None, runtime)
        return profile

    def _place(
        self,
        model_path: str | os.PathLike[str] | None,
        profile_path: str | os.PathLike[str] | None,
        op_summary: str | os.PathLike[str] | None,
    ) -> None:
        """Choose the graph the groups are grown on and put the profile's times on it."""
        self.ran: RanGraph | None = None
        self.ran_kernels_fused = False
        records = self.profile.records
        if model_path is None:  # msprof alone: the operators in execution order
            self.graph = from_chain([r.name for r in records], [r.op_type for r in records])
            self.resolver = Resolver(self.graph)
        elif op_summary is not None:  # the operators that ran, by their names
            self.ran = ran_graph(self.original_graph, records)
        elif profile_path is not None:  # the kernels that ran
            self.ran = self._ran_kernels(model_path)
        if self.ran is not None:
            self.graph, self.times = self.ran.graph, self.ran.times
            self.resolver = Resolver(self.graph)
        else:
            self.times = attribute(records, self.resolver)

    def _ran_kernels(self, model_path: str | os.PathLike[str]) -> RanGraph:
        """The graph an onnxruntime profile ran: the model's own nodes where every name is
        one of them (a profile at ORT_DISABLE_ALL), else the graph onnxruntime builds at
        ``--graph-opt`` (``all`` by default) whose kernels the names are, each kernel
        mapped to the model's nodes it runs."""
        g = self.original_graph
        self.ran_kernels_fused = False
        own = Resolver(g)
        records = self.profile.records
        as_model = RanGraph(g, {n.index: [n.name] for n in g.nodes}, attribute(records, own))
        unknown = [r.name for r in records if r.name not in g.by_name]
        if not unknown:
            return as_model
        level = self.opts.graph_opt if self.opts.graph_opt != "disable" else "all"
        self.step("onnxruntime graph of the profiled model", 0, 1)
        runtime = _ort_graph(model_path, level, self.opts.provider, self.tmp)
        self.step("onnxruntime graph of the profiled model", 1, 1)
        if not any(name in runtime.by_name for name in unknown):
            return as_model  # names of neither graph stay unmapped
        self.ran_kernels_fused = True
        self.profile.graph_opt = self.profile.graph_opt or level
        mapper = Resolver(g, runtime=runtime)
        runs = {n.index: mapper.kernel_nodes(n.name) or [n.name] for n in runtime.nodes}
        self.profile.notes.append(
            f"the profiled names are onnxruntime's kernels at ORT_ENABLE_{level.upper()}: "
            "groups are grown on that graph, each kernel mapped to the model's nodes it runs"
        )
        return RanGraph(runtime, runs, attribute(records, Resolver(runtime)))

    # --- helpers over the analysed graph -------------------------------------------------

    def _node_index(self) -> dict[str, int]:
        """The model's node names -> the analysed node that holds their time (the operator
        that ran them with an op summary)."""
        if self.ran is not None:
            return self.ran.owner()
        return dict(self.graph.by_name)

    def _removed_us(self, members: list[int]) -> float | None:
        """The measured time of the operators whose model nodes opfuse's default passes all
        remove (Casts, Transposes, BatchNorm small ops); None where the profile is of the
        graph after those passes."""
        if self.ran is None or self.trial is None:
            return None
        kept = self.trial.node_types
        return sum(self._time(m) for m in members if not any(n in kept for n in self.ran.runs[m]))

    def _record(self, index: int) -> OpRecord | None:
        return self.times.record.get(index)

    def _time(self, index: int) -> float:
        return self.times.time_us.get(index, 0.0)

    def _out_bytes(self, index: int) -> int | None:
        node = self.graph.nodes[index]
        rec = self._record(index)
        itemsize = self.graph.itemsize.get(node.outputs[0], self.target.dtype_bytes)
        if rec is not None and rec.output_shapes and rec.output_shapes[0]:
            return int(_prod(rec.output_shapes[0])) * itemsize
        if self.graph.chain:  # the next op's first input shape, as msprof printed it
            for c in self.graph.consumers.get(node.outputs[0], []):
                nrec = self._record(c)
                if nrec is not None and nrec.input_shapes and nrec.input_shapes[0]:
                    return int(_prod(nrec.input_shapes[0])) * self.target.dtype_bytes
            return None
        return self.graph.tensor_bytes(node.outputs[0], itemsize)

    def _in_shapes(self, index: int) -> list[list[int]]:
        rec = self._record(index)
        if rec is not None and rec.input_shapes:
            return rec.input_shapes
        node = self.graph.nodes[index]
        shapes = []
        for t in (*node.inputs, *node.const_inputs):
            s = self.graph.shapes.get(t)
            if s is None or any(d is None for d in s):
                return []
            shapes.append([int(d) for d in s])  # type: ignore[arg-type]
        return shapes

    def _batch(self, index: int) -> int:
        shapes = self._in_shapes(index)
        return int(shapes[0][0]) if shapes and shapes[0] else 1

    # --- sections ----------------------------------------------------------------------------

    def _ub(self) -> tuple[list[Group], list[dict[str, object]]]:
        acts = find_activations(self.graph)
        groups = grow_groups(self.graph, self.target.ub_limits, self._other_unit(), acts)
        for grp in groups:
            grp.duration_us = sum(self._time(m) for m in grp.members)
        groups = rank_groups(groups)
        ub_passes = [p.name for p in all_passes() if p.section == "UBFusion"]
        refused = self._refusals()
        total = self.profile.total_us or 1.0
        rows = []
        for grp in groups:
            opfuse = Verdict(
                None,
                available=bool(ub_passes),
                reason="a UB fusion is the backend's: opfuse keeps the graph in standard "
                "ONNX ops" + (f" (UBFusion passes: {', '.join(ub_passes)})" if ub_passes else ""),
            )
            hit = self._refusal_about(grp.names, refused, self.graph)
            if hit is not None:  # a pass matched the group (not just one node) and gave up
                opfuse = Verdict(hit.pass_name, available=True, fires=False, reason=hit.reason)
            removed = self._removed_us(grp.members)
            row: dict[str, object] = {
                "subgraph": 0,
                "fusion_type": grp.fusion_type,
                "kind": grp.kind_name,
                "nodes": grp.names,
                "op_types": grp.op_types,
                "model_nodes": [
                    self.ran.runs[m] if self.ran is not None else [self.graph.nodes[m].name]
                    for m in grp.members
                ],
                "activations": [
                    {"name": a.name, "nodes": [self.graph.nodes[i].name for i in a.nodes]}
                    for a in grp.activations
                ],
                "edges": self._edges(grp.members),
                "duration_us": round(grp.duration_us, 3),
                "share": round(grp.duration_us / total, 6),
                "opfuse_removes_us": round(removed, 3) if removed is not None else None,
                "opfuse": opfuse.to_json(),
                "onnxruntime": self._ort_fuses(grp.members),
            }
            rows.append(row)
        # groups the runtime does not fuse first (in rank order), those it fuses last
        rows.sort(key=lambda r: runtime_fuses(r))
        return groups, rows

    def _graph_info(self) -> dict[str, object]:
        if self.original is None:
            return {
                "analysed": "op summary in execution order (each op assumed to feed the next)",
                "nodes_original": None,
                "nodes_analysed": len(self.graph.nodes),
                "constant_nodes_counted": False,
                "subgraphs": 0,
            }
        if self.ran is not None and self.profile.source == "op_summary":
            analysed = "the operators of the op summary, on the model's edges (the graph that ran)"
        elif self.ran is not None and self.ran_kernels_fused:
            analysed = (
                "the kernels of the profile: onnxruntime's graph of the model at "
                f"'{self.profile.graph_opt}' (the graph that ran)"
            )
        elif self.ran is not None:
            analysed = "the model's nodes, as profiled (the graph that ran)"
        elif self.profile.source == "onnxruntime":
            analysed = (
                "the model after opfuse's default passes, profiled at onnxruntime graph "
                f"optimization '{self.profile.graph_opt}'"
            )
        else:
            analysed = "the model after opfuse's default passes, times mapped from the profile"
        return {
            "analysed": analysed,
            "nodes_original": len(self.original_graph.nodes),
            "nodes_analysed": len(self.graph.nodes),
            "constant_nodes_counted": False,
            "subgraphs": sum(1 for _ in self.original.graph.subgraphs()),
        }

    def _refusals(self) -> dict[str, list[Refusal]]:
        """Node name -> the refused matches (of opfuse's trial run) that cover it."""
        refused: dict[str, list[Refusal]] = {}
        if self.trial is None:
            return refused
        for r in self.trial.refusals():
            for name in r.nodes:
                refused.setdefault(name, []).append(r)
        return refused

    @staticmethod
    def _refusal_about(
        names: list[str], refused: dict[str, list[Refusal]], g: OpGraph
    ) -> Refusal | None:
        """The first refusal whose pattern is about fusing this group: a UBFusion pass's on
        a member, or a match that covers two or more members. A refusal on one member by
        an unrelated pattern (a Pad before the group's Conv) says nothing about the group;
        nor does a fold across a value read outside the match (HardSwish's ``x + 3`` into
        the Conv's bias: ``x`` is read again), which is never valid."""
        members = set(names)
        for name in names:
            for r in refused.get(name, []):
                if r.section == "UBFusion" or (
                    len(r.nodes & members) >= 2 and not read_outside(g, r.nodes)
                ):
                    return r
        return None

    def _other_unit(self) -> set[int]:
        """Nodes msprof ran on the AI CPU: no UB fusion with AI Core operators."""
        if self.profile.source != "op_summary":
            return set()
        return {
            i
            for i, rec in self.times.record.items()
            if rec.provider.upper().replace(" ", "_") == "AI_CPU"
        }

    def _edges(self, members: list[int]) -> list[list[int]]:
        """Edges between a group's members, as positions in its node list."""
        pos = {m: i for i, m in enumerate(members)}
        edges = []
        for m in members:
            for t in self.graph.nodes[m].inputs:
                src = self.graph.producer.get(t)
                if src in pos:
                    edges.append([pos[src], pos[m]])
        return edges

    def _ort_fuses(self, members: list[int]) -> dict[str, object] | None:
        if self.runtime_kernels is None:
            return None
        kernels = [k for m in members for k in self.runtime_kernels.get(m, [])]
        absorbed = [self.graph.nodes[m].name for m in members if m not in self.runtime_kernels]
        fuses = "yes" if len(kernels) <= 1 else "partly" if len(kernels) < len(members) else "no"
        return {"fuses": fuses, "kernels": kernels, "absorbed": absorbed}

    def _aipp(self) -> list[dict[str, object]]:
        g = self.original_graph if self.original is not None else self.graph
        chains = aipp_chains(g)
        if not chains:
            return []
        trial = self._aipp_trial()
        rows = []
        for chain, conv in chains:
            names = [g.nodes[i].name for i in chain]
            types = [g.nodes[i].op_type for i in chain]
            if self.original is not None:
                dur = sum(
                    self._time(i) for i in {self.node_of[n] for n in names if n in self.node_of}
                )
                verdict = (
                    Verdict.from_json(
                        trial.verdict(AIPP_PASS, [*names, conv.name], self.original_types)
                    )
                    if trial is not None
                    else Verdict(
                        AIPP_PASS,
                        available=False,
                        reason=f"{AIPP_PASS} is not registered in this opfuse yet",
                    )
                )
            else:
                dur = sum(self._time(i) for i in chain)
                verdict = Verdict(
                    AIPP_PASS,
                    available=AIPP_PASS in registered(),
                    reason="no model given: not tried",
                )
            rows.append(
                {
                    "nodes": names,
                    "op_types": types,
                    "normalization": [
                        n for n, t in zip(names, types, strict=True) if t in NORMALIZATION
                    ],
                    "first_conv": conv.name,
                    "duration_us": round(dur, 3),
                    "opfuse": verdict.to_json(),
                }
            )
        return rows

    def _aipp_trial(self) -> Trial | None:
        if self.original is None or self.trial is None:
            return None
        known = registered()
        if AIPP_PASS not in known:
            return None
        if AIPP_PASS in self.trial.result.passes:
            return self.trial
        self.step(f"opfuse trial with {AIPP_PASS}", 0, 1)
        trial = Trial.run(self.original, enable=[AIPP_PASS], target=self.target.name)
        self.step(f"opfuse trial with {AIPP_PASS}", 1, 1)
        return trial

    def _l2(self, groups: list[Group]) -> list[dict[str, object]]:
        chains = l2_chains(self.graph, groups, self._out_bytes, self._batch, self.target)
        for ch in chains:
            ch.duration_us = sum(self._time(m) for m in ch.members)
        chains.sort(key=lambda ch: -ch.duration_us)
        rows = []
        for ch in chains:
            ops = []
            sources = set()
            for m in ch.members:
                node = self.graph.nodes[m]
                rec = self._record(m)
                shapes_text = (
                    rec.shapes_text
                    if rec is not None and rec.shapes_text
                    else ";".join(",".join(str(d) for d in s) for s in self._in_shapes(m))
                )
                ratios: dict[str, float] | None = None
                if rec is not None and rec.ratios:
                    ratios, source = rec.ratios, "op_summary"
                else:
                    outs = rec.output_shapes if rec is not None else []
                    if not outs and node.outputs:
                        s = self.graph.shapes.get(node.outputs[0])
                        outs = [[int(d) for d in s]] if s and None not in s else []  # type: ignore[arg-type]
                    ratios = estimate_ratios(
                        node.op_type,
                        self._in_shapes(m),
                        outs,
                        self._time(m),
                        self.target,
                        self.graph.itemsize.get(node.outputs[0], 4) if node.outputs else 4,
                    )
                    source = "estimate"
                sources.add(source if ratios else "none")
                ops.append(
                    {
                        "name": node.name,
                        "op_type": node.op_type,
                        "input_shapes": shapes_text,
                        **{
                            k: (round(ratios[k], 6) if ratios and k in ratios else None)
                            for k in RATIO_KEYS
                        },
                        "duration_us": round(self._time(m), 3),
                    }
                )
            split = None
            if ch.batch > 1 and ch.split_to < ch.batch:
                split = {
                    "batch": ch.batch,
                    "split_to": ch.split_to,
                    "runs": ch.batch // ch.split_to,
                }
            rows.append(
                {
                    "nodes": [self.graph.nodes[m].name for m in ch.members],
                    "duration_us": round(ch.duration_us, 3),
                    "batch": ch.batch,
                    "max_intermediate_bytes": ch.max_bytes,
                    "batch_split": split,
                    "ratios_source": "+".join(sorted(sources)),
                    "ops": ops,
                    "opfuse": Verdict(
                        None, available=False, reason="L2 fusion and batch split are the runtime's"
                    ).to_json(),
                }
            )
        return rows

    def _next_steps(
        self, model_path: str | os.PathLike[str] | None, stats: list[dict[str, object]]
    ) -> dict[str, object]:
        o = self.opts
        skipped = None
        if model_path is None or self.original is None:
            skipped = "no model given"
        elif self.profile.source == "op_summary":
            skipped = "the profile is from Ascend: a trial on this machine would not measure it"
        elif not o.next_steps:
            skipped = "turned off (--no-trial)"
        elif o.runtime is None and o.provider not in ort_providers():
            skipped = f"{o.provider} is not available on this machine"
        commands: list[dict[str, object]] = []
        runtime: Runtime | None = None
        if skipped is None:
            assert model_path is not None and self.original is not None
            runtime = o.runtime or get_runtime(provider=o.provider, threads=o.threads or 1)
            commands = trial(model_path, self.original, runtime, o.trial_seconds, self.step)
            commands.sort(key=lambda c: c["ratio"] if isinstance(c["ratio"], float) else 9e9)
        helps = any(c["helps"] for c in commands)
        return {
            "trial": (
                f"each command's output (verified) against the model, interleaved rounds of "
                f"about {o.trial_seconds:g} s in all on {runtime.describe()} (ratio: median "
                "time optimized / original; noise: the difference between two copies of the "
                "original)"
            )
            if skipped is None
            else None,
            "skipped": skipped,
            "commands": commands,
            "helps": helps,
            "dominant": dominant(stats),
        }

    def _ascend_sections(self) -> bool:
        """L2 fusion (and its AOE advice) is Ascend's: shown for the ascend targets, or when
        the profile has msprof's counters."""
        counters = any(r.ratios for r in self.profile.records)
        return self.target.name.startswith("ascend") or counters

    def _variance(self) -> str | None:
        """A warning when the runs disagree: the sum per run, or a node that matters."""
        p = self.profile
        totals = p.run_totals_us()
        if totals and p.total_us and iqr(totals) > VARIANCE_TOTAL * statistics.median(totals):
            return (
                f"runs vary: the time per run spreads {iqr(totals):.1f} us (IQR) around "
                f"{statistics.median(totals):.1f} us; another process may share the machine "
                "(rerun with more --runs, or on a quiet machine)"
            )
        total = p.total_us or 1.0
        noisy = [
            r
            for r in p.records
            if r.duration_us >= VARIANCE_MIN_SHARE * total
            and r.iqr_us > VARIANCE_NODE * r.duration_us
        ]
        if noisy:
            worst = max(noisy, key=lambda r: r.iqr_us / max(r.duration_us, 1e-9))
            return (
                f"runs vary: {len(noisy)} node(s) with at least {VARIANCE_MIN_SHARE:.0%} of "
                f"the time spread more than {VARIANCE_NODE:.0%} of their median over the runs "
                f"({worst.name}: {worst.duration_us:.1f} us, IQR {worst.iqr_us:.1f} us); "
                "rerun with more --runs, or on a quiet machine"
            )
        return None

    def _top_node(self, r: OpRecord, total: float) -> dict[str, object]:
        if self.ran is not None:
            op = self.graph.by_name.get(self.times.placed.get(r.name, r.name))
            nodes = self.ran.runs[op] if op is not None else []
        else:
            nodes = original_nodes(r.name, self.resolver, self.times)
        est = (
            estimate_ratios(
                r.op_type,
                r.input_shapes,
                r.output_shapes,
                r.duration_us / max(r.calls, 1),
                self.target,
                self.target.dtype_bytes,
            )
            if r.input_shapes and r.output_shapes
            else None
        )
        return {
            "name": r.name,
            "op_type": r.op_type,
            "duration_us": round(r.duration_us, 3),
            "iqr_us": round(r.iqr_us, 3),
            "share": round(r.duration_us / total, 6),
            "provider": r.provider or None,
            "nodes": nodes,
            "of_peak": {
                "flops": round(est["mac_ratio"], 6),
                "bandwidth": round(est["mte2_ratio"] + est["mte3_ratio"], 6),
            }
            if est is not None and not r.ratios
            else None,
        }

    def _hints(self) -> list[dict[str, object]]:
        times = self.times.time_us
        if self.ran is not None:  # weights and shapes are the model's: an operator's time
            g = self.original_graph  # goes to each model node it ran
            times = {
                n.index: self._time(self.node_of[n.name]) for n in g.nodes if n.name in self.node_of
            }
        else:
            g = self.graph
        hints = constraints.alignment_hints(g, times, self.target.alignment)
        hints += constraints.resize_hints(g, times)
        if self.original is not None and self.trial is not None:
            orig_times = {
                n.index: self._time(self.node_of[n.name])
                for n in self.original_graph.nodes
                if n.name in self.node_of
            }
            for hint in constraints.replace_hints(self.original_graph, orig_times):
                if hint.opfuse_pass:
                    hint.verdict = Verdict.from_json(
                        self.trial.verdict(hint.opfuse_pass, [hint.node], self.original_types)
                    )
                hints.append(hint)
        else:
            for hint in constraints.replace_hints(self.graph, times):
                if hint.opfuse_pass:
                    hint.verdict = Verdict(
                        hint.opfuse_pass,
                        available=hint.opfuse_pass in registered(),
                        reason="no model given: not tried",
                    )
                hints.append(hint)
        hints += constraints.fallback_hints(
            self.profile.records, self.profile.provider, self.profile.source
        )
        hints.sort(key=lambda h: (h.kind, -h.duration_us))
        return [h.to_json() for h in hints]

    def _report(self, model_path: str | os.PathLike[str] | None) -> dict[str, object]:
        self.step("grouping", 0, 1)
        groups, ub = self._ub()
        aipp = self._aipp()
        l2 = self._l2(groups) if self._ascend_sections() else []
        hints = self._hints()
        self.step("grouping", 1, 1)
        p = self.profile
        total = p.total_us or 1.0
        stats: list[dict[str, object]] = [
            {
                "op_type": s.op_type,
                "count": s.count,
                "total_us": round(s.total_us, 3),
                "mean_us": round(s.mean_us, 3),
                "share": round(s.share, 6),
            }
            for s in op_statistic(p.records)
        ]
        next_steps = self._next_steps(model_path, stats)
        totals = p.run_totals_us()
        return {
            "schema": SCHEMA,
            "model": str(model_path) if model_path is not None else None,
            "target": {
                **self.target.to_json(),
                "peaks": "measured" if self.peaks is not None else "file",
                "peaks_measured_on": self.peaks.key if self.peaks is not None else None,
            },
            "ascend_sections": self._ascend_sections(),
            "next_steps": next_steps,
            "graph": self._graph_info(),
            "profile": {
                "source": p.source,
                "path": p.path or None,
                "runs": p.runs,
                "warmup": p.warmup,
                "provider": p.provider or None,
                "graph_opt": p.graph_opt or None,
                "total_us": round(p.total_us, 3),
                "run_total_median_us": round(statistics.median(totals), 3) if totals else None,
                "total_iqr_us": round(iqr(totals), 3),
                "variance_warning": self._variance(),
                "unmapped_us": round(self.times.unmapped_us, 3),
                "unmapped_nodes": [r.name for r in self.times.unmapped],
                "missing_columns": p.missing_columns,
                "notes": p.notes,
            },
            "op_statistic": stats,
            "top_nodes": [self._top_node(r, total) for r in top_nodes(p.records, len(p.records))],
            "ub_fusion": ub,
            "aipp_fusion": aipp,
            "l2_fusion": l2,
            "hints": hints,
            "graph_fusion": self.trial.pass_summary() if self.trial is not None else [],
        }


def runtime_fuses(group: Mapping[str, object]) -> bool:
    """Whether onnxruntime already runs the group as one kernel."""
    ort = group.get("onnxruntime")
    return isinstance(ort, dict) and ort.get("fuses") == "yes"


def read_outside(g: OpGraph, names: frozenset[str]) -> bool:
    """Whether a tensor made by one of these nodes and read by another is also read by a
    node outside them (or is a graph output): folding them would lose that value."""
    inside = {g.by_name[n] for n in names if n in g.by_name}
    for i in inside:
        for t in g.nodes[i].outputs:
            readers = set(g.consumers.get(t, ()))
            if readers & inside and (readers - inside or t in g.graph_outputs):
                return True
    return False


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def advise(
    model_path: str | os.PathLike[str] | None,
    *,
    profile_path: str | os.PathLike[str] | None = None,
    op_summary: str | os.PathLike[str] | None = None,
    options: AdviseOptions | None = None,
    step: Step | None = None,
) -> dict[str, object]:
    """The advisor report as a JSON-ready dict (schema opfuse.advise/2)."""
    return Advisor(options or AdviseOptions(), step).run(model_path, profile_path, op_summary)
