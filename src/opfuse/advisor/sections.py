"""The advisor's sections, each a function of the ``Analysis`` (the profile's times on
the graph that ran, opfuse's trial): UB fusion groups, first-layer AIPP, L2 chains,
hints, next steps, and the report that gathers them (schema ``opfuse.advise/2``)."""

from __future__ import annotations

import os
import statistics

from opfuse.advisor import constraints
from opfuse.advisor.aipp_candidates import NORMALIZATION, aipp_chains
from opfuse.advisor.analysis import Analysis, ort_providers
from opfuse.advisor.attribution import original_nodes
from opfuse.advisor.graph import OpGraph
from opfuse.advisor.groups import Group, grow_groups, rank_groups
from opfuse.advisor.l2 import RATIO_KEYS, estimate_ratios, l2_chains
from opfuse.advisor.nextsteps import Changes, dominant, trial
from opfuse.advisor.opkinds import Kind, classify
from opfuse.advisor.pass_verdict import Verdict
from opfuse.advisor.profile_readers import OpRecord, Profile, iqr, op_statistic, top_nodes
from opfuse.advisor.quantized import quantized_findings
from opfuse.advisor.report_types import (
    Activation,
    AdviceReport,
    AippChain,
    BatchSplit,
    Finding,
    GraphInfo,
    HintRow,
    L2Chain,
    L2Op,
    NextStepLabel,
    NextSteps,
    OpTime,
    PeakShare,
    ProfileInfo,
    StepCommand,
    TargetInfo,
    TopNode,
    UBGroup,
    dominant_of,
    finding_of,
    pass_row_of,
    step_command_of,
)
from opfuse.advisor.trial import AIPP_PASS, Refusal, Trial, registered
from opfuse.advisor.written_activations import find_activations
from opfuse.rules import all_passes
from opfuse.runtime import Runtime, get_runtime

SCHEMA = "opfuse.advise/2"
VARIANCE_NODE = 0.25  # a node's IQR over its median above which runs are called unsteady
VARIANCE_TOTAL = 0.10  # the same for the sum of all nodes per run
VARIANCE_MIN_SHARE = 0.01  # nodes below this share of the time are not worth a warning


def ub_section(a: Analysis) -> tuple[list[Group], list[UBGroup]]:
    acts = find_activations(a.graph)
    groups = grow_groups(a.graph, a.target.ub_limits, a.other_unit(), acts)
    for grp in groups:
        grp.duration_us = sum(a.time(m) for m in grp.members)
    groups = rank_groups(groups)
    ub_passes = [p.name for p in all_passes() if p.section == "UBFusion"]
    refused = a.refusals()
    total = a.profile.total_us or 1.0
    rows = []
    for grp in groups:
        opfuse = Verdict(
            None,
            available=bool(ub_passes),
            reason="a UB fusion is the backend's: opfuse keeps the graph in standard "
            "ONNX ops" + (f" (UBFusion passes: {', '.join(ub_passes)})" if ub_passes else ""),
        )
        hit = refusal_about(grp.names, refused, a.graph)
        if hit is not None:  # a pass matched the group (not just one node) and gave up
            opfuse = Verdict(hit.pass_name, available=True, fires=False, reason=hit.reason)
        removed = a.removed_us(grp.members)
        rows.append(
            UBGroup(
                subgraph=0,
                fusion_type=grp.fusion_type,
                kind=grp.kind_name,
                nodes=list(grp.names),
                op_types=list(grp.op_types),
                model_nodes=[
                    list(a.ran.runs[m]) if a.ran is not None else [a.graph.nodes[m].name]
                    for m in grp.members
                ],
                activations=[
                    Activation(act.name, [a.graph.nodes[i].name for i in act.nodes])
                    for act in grp.activations
                ],
                edges=a.edges(grp.members),
                duration_us=round(grp.duration_us, 3),
                share=round(grp.duration_us / total, 6),
                opfuse_removes_us=round(removed, 3) if removed is not None else None,
                opfuse=opfuse,
                onnxruntime=a.ort_fuses(grp.members),
                next_step=None,  # set once Next steps are measured (label_next_steps)
            )
        )
    # groups the runtime does not fuse first (in rank order), those it fuses last
    rows.sort(key=lambda r: r.runtime_fuses)
    return groups, rows


def graph_info(a: Analysis) -> GraphInfo:
    if a.original is None:
        return GraphInfo(
            analysed="op summary in execution order (each op assumed to feed the next)",
            nodes_original=None,
            nodes_analysed=len(a.graph.nodes),
            constant_nodes_counted=False,
            subgraphs=0,
            quantized=False,
        )
    if a.ran is not None and a.profile.source == "op_summary":
        analysed = "the operators of the op summary, on the model's edges (the graph that ran)"
    elif (
        a.ran is not None
        and a.ran_kernels_fused
        and a.quantized
        and a.profile.source == "onnxruntime"
    ):
        analysed = (
            "the graph onnxruntime deploys for this quantized (QDQ) model: its kernels at "
            f"'{a.profile.graph_opt}' (QDQ fusion on), as profiled, each mapped to the model's "
            "nodes after opfuse's default passes"
        )
    elif a.ran is not None and a.ran_kernels_fused:
        analysed = (
            "the kernels of the profile: onnxruntime's graph of the model at "
            f"'{a.profile.graph_opt}' (the graph that ran)"
        )
    elif a.ran is not None:
        analysed = "the model's nodes, as profiled (the graph that ran)"
    elif a.profile.source == "onnxruntime":
        analysed = (
            "the model after opfuse's default passes, profiled at onnxruntime graph "
            f"optimization '{a.profile.graph_opt}'"
        )
    else:
        analysed = "the model after opfuse's default passes, times mapped from the profile"
    assert a.original_graph is not None
    return GraphInfo(
        analysed=analysed,
        nodes_original=len(a.original_graph.nodes),
        nodes_analysed=len(a.graph.nodes),
        constant_nodes_counted=False,
        subgraphs=sum(1 for _ in a.original.graph.subgraphs()),
        quantized=a.quantized,
    )


def refusal_about(
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


def aipp_section(a: Analysis) -> list[AippChain]:
    g = a.original_graph if a.original_graph is not None else a.graph
    chains = aipp_chains(g)
    if not chains:
        return []
    trial = aipp_trial(a)
    rows = []
    for chain, conv in chains:
        names = [g.nodes[i].name for i in chain]
        types = [g.nodes[i].op_type for i in chain]
        if a.original is not None:
            dur = sum(a.time(i) for i in {a.node_of[n] for n in names if n in a.node_of})
            verdict = (
                Verdict.from_json(trial.verdict(AIPP_PASS, [*names, conv.name], a.original_types))
                if trial is not None
                else Verdict(
                    AIPP_PASS,
                    available=False,
                    reason=f"{AIPP_PASS} is not registered in this opfuse yet",
                )
            )
        else:
            dur = sum(a.time(i) for i in chain)
            verdict = Verdict(
                AIPP_PASS,
                available=AIPP_PASS in registered(),
                reason="no model given: not tried",
            )
        rows.append(
            AippChain(
                nodes=names,
                op_types=types,
                normalization=[n for n, t in zip(names, types, strict=True) if t in NORMALIZATION],
                first_conv=conv.name,
                duration_us=round(dur, 3),
                opfuse=verdict,
            )
        )
    return rows


def aipp_trial(a: Analysis) -> Trial | None:
    if a.original is None or a.trial is None:
        return None
    known = registered()
    if AIPP_PASS not in known:
        return None
    if AIPP_PASS in a.trial.result.passes:
        return a.trial
    a.step(f"opfuse trial with {AIPP_PASS}", 0, 1)
    trial = Trial.run(a.original, enable=[AIPP_PASS], target=a.target.name)
    a.step(f"opfuse trial with {AIPP_PASS}", 1, 1)
    return trial


def l2_section(a: Analysis, groups: list[Group]) -> list[L2Chain]:
    chains = l2_chains(a.graph, groups, a.out_bytes, a.batch, a.target)
    for ch in chains:
        ch.duration_us = sum(a.time(m) for m in ch.members)
    chains.sort(key=lambda ch: -ch.duration_us)
    rows = []
    for ch in chains:
        ops = []
        sources = set()
        for m in ch.members:
            node = a.graph.nodes[m]
            rec = a.record(m)
            shapes_text = (
                rec.shapes_text
                if rec is not None and rec.shapes_text
                else ";".join(",".join(str(d) for d in s) for s in a.in_shapes(m))
            )
            ratios: dict[str, float] | None = None
            if rec is not None and rec.ratios:
                ratios, source = rec.ratios, "op_summary"
            else:
                outs = rec.output_shapes if rec is not None else []
                if not outs and node.outputs:
                    s = a.graph.shapes.get(node.outputs[0])
                    outs = [[d for d in s if d is not None]] if s and None not in s else []
                ratios = estimate_ratios(
                    node.op_type,
                    a.in_shapes(m),
                    outs,
                    a.time(m),
                    a.target,
                    a.graph.itemsize.get(node.outputs[0], 4) if node.outputs else 4,
                )
                source = "estimate"
            sources.add(source if ratios else "none")
            ops.append(
                L2Op(
                    name=node.name,
                    op_type=node.op_type,
                    input_shapes=shapes_text,
                    ratios={
                        k: (round(ratios[k], 6) if ratios and k in ratios else None)
                        for k in RATIO_KEYS
                    },
                    duration_us=round(a.time(m), 3),
                )
            )
        split = None
        if ch.batch > 1 and ch.split_to < ch.batch:
            split = BatchSplit(ch.batch, ch.split_to, ch.batch // ch.split_to)
        rows.append(
            L2Chain(
                nodes=[a.graph.nodes[m].name for m in ch.members],
                duration_us=round(ch.duration_us, 3),
                batch=ch.batch,
                max_intermediate_bytes=ch.max_bytes,
                batch_split=split,
                ratios_source="+".join(sorted(sources)),
                ops=ops,
                opfuse=Verdict(
                    None, available=False, reason="L2 fusion and batch split are the runtime's"
                ),
            )
        )
    return rows


def next_steps_section(
    a: Analysis,
    model_path: str | os.PathLike[str] | None,
    stats: list[OpTime],
    changes: Changes | None = None,
) -> NextSteps:
    o = a.opts
    skipped = None
    if model_path is None or a.original is None:
        skipped = "no model given"
    elif a.profile.source == "op_summary":
        skipped = "the profile is from Ascend: a trial on this machine would not measure it"
    elif not o.next_steps:
        skipped = "turned off (--no-trial)"
    elif o.runtime is None and o.provider not in ort_providers():
        skipped = f"{o.provider} is not available on this machine"
    commands: list[StepCommand] = []
    runtime: Runtime | None = None
    fed = None
    if skipped is None:
        assert model_path is not None and a.original is not None
        runtime = o.runtime or get_runtime(provider=o.provider, threads=o.threads or 1)
        rows, fed = trial(
            model_path,
            a.original,
            runtime,
            o.trial_seconds,
            a.step,
            input_shapes=o.input_shapes,
            changes=changes,
            inputs_npz=o.inputs,
        )
        commands = [step_command_of(r) for r in rows]
        commands.sort(key=lambda c: c.ratio if isinstance(c.ratio, float) else 9e9)
    helps = any(c.helps for c in commands)
    return NextSteps(
        trial=(
            f"each command's output (verified) against the model, interleaved rounds of "
            f"about {o.trial_seconds:g} s in all on {runtime.describe()} (ratio: median "
            "time optimized / original; noise: the difference between two copies of the "
            "original)"
        )
        if runtime is not None
        else None,
        skipped=skipped,
        commands=commands,
        helps=helps,
        dominant=[dominant_of(d) for d in dominant([s.to_json() for s in stats], a.quantized)],
        inputs=fed,
    )


def label_next_steps(ub: list[UBGroup], commands: list[StepCommand], changes: Changes) -> None:
    """One truth per report: a group whose nodes a measured Next steps command changes
    (``--target-opset 14`` fusing a written-out HardSwish into one op) gets that command
    (``next_step``: the helping one first, then the fastest) and its pass as its verdict."""
    for row in ub:
        members = set(row.nodes)
        members.update(n for ns in row.model_nodes for n in ns)
        hits = [
            c
            for c in commands
            if not c.error and not c.unchanged and changes.nodes.get(c.command, set()) & members
        ]
        hits.sort(key=lambda c: (not c.helps, c.ratio if c.ratio is not None else 9e9))
        row.next_step = None
        if not hits:
            continue
        c = hits[0]
        row.next_step = NextStepLabel(c.command, c.ratio, c.helps)
        passes = changes.passes.get(c.command) or []
        measured = (
            f"{c.ratio:.2f}x time, {'faster' if c.helps else 'no gain beyond the noise'}"
            if isinstance(c.ratio, float)
            else "not measured"
        )
        reason = f"with {' '.join(c.flags)} (Next steps: {measured})"
        row.opfuse = Verdict(
            passes[0] if passes else None,
            available=True,
            fires=True if passes else None,
            reason=reason,
        )


def quantized_section(a: Analysis) -> list[Finding]:
    """Findings on a QDQ model ([] for a float model, or without a model); the int8 vs
    float measurement runs with the trial (not with --no-trial)."""
    if a.model_path is None or a.original is None or a.profile.source == "op_summary":
        return []
    o = a.opts
    times = {name: a.time(index) for name, index in a.node_of.items()}
    runtime: Runtime | None = None
    if o.next_steps and (o.runtime is not None or o.provider in ort_providers()):
        runtime = o.runtime or get_runtime(provider=o.provider, threads=o.threads or 1)

    def cost_of(names: list[str]) -> float:
        """The time of the kernels that run any of these model nodes, each once."""
        wanted = set(names)
        if a.ran is not None:
            kernels = {k for k, ran in a.ran.runs.items() if wanted.intersection(ran)}
        else:
            kernels = {a.node_of[n] for n in wanted if n in a.node_of}
        return sum(a.time(k) for k in kernels)

    findings = quantized_findings(
        a.model_path,
        times_us=times,
        cost_of=cost_of,
        input_shapes=o.input_shapes,
        inputs_npz=o.inputs,
        total_us=a.profile.total_us,
        providers=[o.provider] if o.provider in ort_providers() else None,
        runtime=runtime,
        seconds=o.trial_seconds,
    )
    if a.ran_kernels_fused:  # the deployed graph: time its float islands themselves
        for f in findings:
            if f["kind"] == "unfused_qdq":
                f["cost_us"] = round(float_island_us(a), 3)
    return [finding_of(f) for f in findings]


def float_island_us(a: Analysis) -> float:
    """In the deployed graph of a QDQ model, the time of the float ops between a
    DequantizeLinear and a QuantizeLinear, with those conversions: each
    DequantizeLinear -> float elementwise ops -> QuantizeLinear path, each kernel once."""
    g = a.graph
    counted: set[int] = set()
    for d in (n.index for n in g.nodes if n.op_type == "DequantizeLinear"):
        floats: set[int] = set()
        ends: set[int] = set()
        todo = [d]
        while todo and len(floats) < 64:
            for t in g.nodes[todo.pop()].outputs:
                for c in g.consumers.get(t, ()):
                    op = g.nodes[c].op_type
                    if op == "QuantizeLinear":
                        ends.add(c)
                    elif (
                        c not in floats
                        and not op.startswith("Q")
                        and (classify(op) is Kind.ELEMENTWISE)
                    ):
                        floats.add(c)
                        todo.append(c)
        if floats and ends:
            counted |= {d, *floats, *ends}
    return sum(a.time(i) for i in counted)


def variance_warning(p: Profile) -> str | None:
    """A warning when the runs disagree: the sum per run, or a node that matters."""
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
        if r.duration_us >= VARIANCE_MIN_SHARE * total and r.iqr_us > VARIANCE_NODE * r.duration_us
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


def top_node(a: Analysis, r: OpRecord, total: float) -> TopNode:
    if a.ran is not None:
        op = a.graph.by_name.get(a.times.placed.get(r.name, r.name))
        nodes = a.ran.runs[op] if op is not None else []
    else:
        nodes = original_nodes(r.name, a.resolver, a.times)
    est = (
        estimate_ratios(
            r.op_type,
            r.input_shapes,
            r.output_shapes,
            r.duration_us / max(r.calls, 1),
            a.target,
            a.target.dtype_bytes,
        )
        if r.input_shapes and r.output_shapes
        else None
    )
    return TopNode(
        name=r.name,
        op_type=r.op_type,
        duration_us=round(r.duration_us, 3),
        iqr_us=round(r.iqr_us, 3),
        share=round(r.duration_us / total, 6),
        provider=r.provider or None,
        nodes=list(nodes),
        of_peak=PeakShare(
            flops=round(est["mac_ratio"], 6),
            bandwidth=round(est["mte2_ratio"] + est["mte3_ratio"], 6),
        )
        if est is not None and not r.ratios
        else None,
    )


def hints_section(a: Analysis) -> list[HintRow]:
    times = a.times.time_us
    if a.ran is not None:  # weights and shapes are the model's: an operator's time
        assert a.original_graph is not None  # goes to each model node it ran
        g = a.original_graph
        times = {n.index: a.time(a.node_of[n.name]) for n in g.nodes if n.name in a.node_of}
    else:
        g = a.graph
    hints = constraints.alignment_hints(g, times, a.target.alignment)
    hints += constraints.resize_hints(g, times)
    if a.original_graph is not None and a.trial is not None:
        orig_times = {
            n.index: a.time(a.node_of[n.name])
            for n in a.original_graph.nodes
            if n.name in a.node_of
        }
        for hint in constraints.replace_hints(a.original_graph, orig_times):
            if hint.opfuse_pass:
                hint.verdict = Verdict.from_json(
                    a.trial.verdict(hint.opfuse_pass, [hint.node], a.original_types)
                )
            hints.append(hint)
    else:
        for hint in constraints.replace_hints(a.graph, times):
            if hint.opfuse_pass:
                hint.verdict = Verdict(
                    hint.opfuse_pass,
                    available=hint.opfuse_pass in registered(),
                    reason="no model given: not tried",
                )
            hints.append(hint)
    hints += constraints.fallback_hints(a.profile.records, a.profile.provider, a.profile.source)
    hints.sort(key=lambda h: (h.kind, -h.duration_us))
    return [
        HintRow(
            kind=h.kind,
            node=h.node,
            op_type=h.op_type,
            message=h.message,
            duration_us=round(h.duration_us, 3),
            gain_us=round(h.gain_us, 3) if h.gain_us is not None else None,
            opfuse=h.verdict or h.no_verdict(),
        )
        for h in hints
    ]


def report(a: Analysis) -> AdviceReport:
    """The JSON report (schema ``opfuse.advise/2``): every section, each a function of the
    analysis."""
    model_path = a.model_path
    a.step("grouping", 0, 1)
    groups, ub = ub_section(a)
    aipp = aipp_section(a)
    l2 = l2_section(a, groups) if a.ascend_sections() else []
    hints = hints_section(a)
    a.step("grouping", 1, 1)
    p = a.profile
    total = p.total_us or 1.0
    stats = [
        OpTime(s.op_type, s.count, round(s.total_us, 3), round(s.mean_us, 3), round(s.share, 6))
        for s in op_statistic(p.records)
    ]
    quantized = quantized_section(a)
    changes = Changes()
    next_steps = next_steps_section(a, model_path, stats, changes)
    label_next_steps(ub, next_steps.commands, changes)
    totals = p.run_totals_us()
    return AdviceReport(
        schema=SCHEMA,
        model=str(model_path) if model_path is not None else None,
        target=TargetInfo(
            a.target,
            peaks="measured" if a.peaks is not None else "file",
            peaks_measured_on=a.peaks.key if a.peaks is not None else None,
        ),
        ascend_sections=a.ascend_sections(),
        quantized=quantized,
        next_steps=next_steps,
        graph=graph_info(a),
        profile=ProfileInfo(
            source=p.source,
            path=p.path or None,
            runs=p.runs,
            warmup=p.warmup,
            provider=p.provider or None,
            graph_opt=p.graph_opt or None,
            total_us=round(p.total_us, 3),
            run_total_median_us=round(statistics.median(totals), 3) if totals else None,
            total_iqr_us=round(iqr(totals), 3),
            variance_warning=variance_warning(a.profile),
            unmapped_us=round(a.times.unmapped_us, 3),
            unmapped_nodes=[r.name for r in a.times.unmapped],
            inputs=list(p.inputs),
            input_shape_hint=p.input_shape_hint(),
            missing_columns=list(p.missing_columns),
            notes=list(p.notes),
            inputs_fed=p.fed,
        ),
        op_statistic=stats,
        top_nodes=[top_node(a, r, total) for r in top_nodes(p.records, len(p.records))],
        ub_fusion=ub,
        aipp_fusion=aipp,
        l2_fusion=l2,
        hints=hints,
        graph_fusion=[pass_row_of(r) for r in a.trial.pass_summary()]
        if a.trial is not None
        else [],
    )


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
