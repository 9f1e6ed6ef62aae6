"""Text rendering of the advisor report, in the sections and wording of Ascend's model
advisor (====UBModel====, ====AippFusionModel====, ====L2Model====), with rich tables for the
op statistics: one renderer per section (``*_text(report, console, top)``, listed with
their HTML twins in render.py's table), and the wording both formats share."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from opfuse.advisor.l2 import ABOVE_PEAK, RATIO_KEYS
from opfuse.advisor.pass_verdict import Verdict
from opfuse.advisor.profile_readers import InputShape, OpStat

if TYPE_CHECKING:
    from opfuse.verification.compare import FedInputs
from opfuse.advisor.report_types import (
    AdviceReport,
    Finding,
    HintRow,
    L2Chain,
    OpTime,
    OrtFusion,
    StepCommand,
    TopNode,
    UBGroup,
)

# the width of a report's plain text (``summary()``): the CLI's width off a terminal
PLAIN_WIDTH = 100


def plain_text(draw: Callable[[Console], None], width: int = PLAIN_WIDTH) -> str:
    """What ``draw`` prints on a console, as plain text ``width`` wide (no colour, no
    trailing blanks)."""
    console = Console(
        file=io.StringIO(), record=True, width=width, color_system=None, highlight=False
    )
    draw(console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def record(console: Console, text: str) -> None:
    """One record in msadvisor's form (``Fusion Type: ...; Fusion Operator Detail: ...;``,
    ``Op Name: ...; OP Type: ...;``) on one line whatever the width, on a terminal or in a
    file, as msadvisor prints them and as users grep them (prose and tables fold)."""
    console.print(text, markup=False, soft_wrap=True)


# what a section says when it has nothing (text and HTML)
EMPTY = {
    "ub_fusion": "No UB fusion group found.",
    "aipp_fusion": "No preprocessing chain in front of the first Conv.",
    "l2_fusion": "No L2 fusion chain found.",
    "hints": "No operator constraint hints.",
    "graph_fusion": "No opfuse pass matched anything.",
}
HINT_TITLES = {
    "alignment": "Channels not aligned",
    "replace": "Replaceable operators",
    "resize_align_corners": "Resize with align_corners",
    "fallback": "Operators on another execution unit",
}


ORIGINAL = "Original Node(s)"
RUNS_NOTE = "each node's median over the runs"
NUMBERS = ("Duration(us)", "IQR(us)", "Ratio(%)")
CAPTION = "Original Node(s): the model's nodes behind a fused kernel's name; = the node itself"


# cells that say nothing: a column of only these is left out of its table
SAYS_NOTHING = frozenset({"", "n/a", "="})


def fold_columns(
    headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[str] = ()
) -> tuple[list[str], list[list[object]], list[str]]:
    """Leave out the text columns (never the first) that are the same in every row: a
    column that says nothing (``n/a``, ``=`` or empty everywhere) is dropped; one sentence
    repeated in every row is said once, under the table (returned as notes)."""
    if len(rows) < 2:
        return list(headers), [list(r) for r in rows], []
    keep, notes = [], []
    for i, h in enumerate(headers):
        values = {v.strip() if isinstance(v := r[i], str) else v for r in rows}
        text = all(isinstance(r[i], str) for r in rows) and h not in numeric
        if i == 0 or len(values) > 1 or not text:
            keep.append(i)
            continue
        (value,) = values
        if value not in SAYS_NOTHING:
            said = str(value).lower().startswith(h.lower())  # "opfuse: no pass (...)"
            notes.append(f"Every row: {value}" if said else f"{h}, every row: {value}")
        elif value == "=" and h == ORIGINAL:
            notes.append(f"{h}: every name is the model's own node")
    return (
        [headers[i] for i in keep],
        [[r[i] for i in keep] for r in rows],
        notes,
    )


def nodes_text(name: str, nodes: list[str]) -> str:
    """The model's node(s) behind a profiled name ('=' where it is the node's own name)."""
    if nodes == [name]:
        return "="
    return ", ".join(nodes) if nodes else "(not mapped)"


def _us(value: float | None) -> str:
    return f"{float(value):.6f}" if isinstance(value, (int, float)) else "n/a"


def ratio_text(value: float | None) -> str:
    """msprof's six decimals; ``*`` marks an estimate above 1 (see ABOVE_PEAK)."""
    if not isinstance(value, (int, float)):
        return "n/a"
    return f"{value:.6f}" + ("*" if value > 1 else "")


def above_peak(chains: Sequence[L2Chain]) -> bool:
    return any(
        isinstance(op.ratios.get(k), (int, float)) and (op.ratios.get(k) or 0) > 1
        for c in chains
        for op in c.ops
        for k in RATIO_KEYS
    )


def verdict_text(opfuse: Verdict | None) -> str:
    if opfuse is None:
        return "opfuse: no pass"
    name, reason = opfuse.pass_name, opfuse.reason
    if name is None:
        return f"opfuse: no pass ({reason})" if reason else "opfuse: no pass"
    if opfuse.available is False:
        return f"opfuse: {name} not available ({reason})"
    if opfuse.fires is True:
        return f"opfuse: {name} applies it" + (f" {reason}" if reason else "")
    if opfuse.fires is False:
        return f"opfuse: {name} would not fire: {reason}"
    return f"opfuse: {name} ({reason})" if reason else f"opfuse: {name}"


def group_verdict(group: UBGroup) -> str:
    """A UB group's opfuse verdict; where a Next steps command fuses the group, that
    command (the report never says "no pass" of a group a command it measured fuses)."""
    step = group.next_step
    if step is None:
        return verdict_text(group.opfuse)
    name = group.opfuse.pass_name or "opfuse optimize"
    measured = (
        f"{step.ratio:.2f}x time, {'faster' if step.helps else 'no gain beyond the noise'}"
        if isinstance(step.ratio, (int, float))
        else "not measured"
    )
    return f"opfuse: {name} fuses it with Next steps' {step.command} ({measured})"


def ort_text(ort: OrtFusion | None) -> str:
    if ort is None:
        return ""
    kernels = ", ".join(ort.kernels) or "none"
    return f"onnxruntime fuses it: {ort.fuses} (runs {kernels})"


def more(shown: int, total: int) -> str | None:
    """The line that ends a list cut at --top."""
    return f"... and {total - shown} more (see --format json)" if total > shown else None


def header_lines(report: AdviceReport) -> list[str]:
    """What was analysed, how, and how often: the same lines in text and HTML."""
    prof, tgt, graph = report.profile, report.target, report.graph
    peaks = (
        "peaks measured on this machine"
        if tgt.peaks == "measured"
        else "peaks from the target file"
    )
    level = prof.graph_opt or ("(as profiled)" if prof.source != "op_summary" else "n/a")
    counted = "" if graph.constant_nodes_counted else ", Constant nodes not counted"
    nodes = (
        f"{graph.nodes_original} model nodes, {graph.nodes_analysed} analysed{counted}"
        if graph.nodes_original is not None
        else f"{graph.nodes_analysed} operators"
    )
    lines = [
        f"model: {report.model or '(none)'}; target: {tgt.name} ({tgt.target.source}, {peaks})",
        f"graph analysed: {graph.analysed} ({nodes})"
        + (f"; {graph.subgraphs} If/Loop/Scan bodies not analysed" if graph.subgraphs else ""),
        f"profile: {prof.source}; onnxruntime graph optimization level: {level}; "
        f"{prof.runs} run(s) after {prof.warmup} warm-up; {prof.total_us:.1f} us per "
        "run (the sum of the nodes' medians)"
        + (
            f"; the nodes' sum in each run: median {prof.run_total_median_us:.1f} us, "
            f"IQR {prof.total_iqr_us:.1f} us"
            if prof.run_total_median_us is not None
            else ""
        ),
    ]
    if prof.inputs:
        lines.append(inputs_line(prof.inputs, prof.input_shape_hint, prof.inputs_fed))
    if prof.variance_warning:
        lines.append(f"warning: {prof.variance_warning}")
    if prof.unmapped_us:
        names = prof.unmapped_nodes
        lines.append(
            f"time not mapped onto the graph: {prof.unmapped_us:.1f} us per run, "
            f"{len(names)} name(s): {', '.join(names[:5])}" + (" ..." if len(names) > 5 else "")
        )
    return lines


def inputs_line(
    inputs: Sequence[InputShape], hint: str | None, fed: FedInputs | None = None
) -> str:
    """The input shapes profiled (every per-op figure depends on them), where they came
    from (generated, or the user's .npz; ``fed`` None: a profile read, as it recorded
    them) and, where opfuse chose a dynamic dim, what to give instead."""

    def dims(values: Sequence[object]) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]"

    shown = "; ".join(
        f"{i.name} {dims(i.shape)}" + (f" (declared {dims(i.declared)})" if i.dynamic else "")
        for i in inputs
    )
    line = f"inputs profiled: {shown}"
    if fed is not None and fed.npz is not None:
        line += f", from {fed.npz}"
    elif fed is not None:
        line += f", generated (seed {fed.seed}" + (f"; {fed.grown}" if fed.grown else "") + ")"
    if hint:
        line += "; opfuse chose the dynamic dims: give the inputs you run with, " + hint
    return line


def unchanged_text(c: StepCommand) -> str:
    """A command whose output has the model's nodes, said without the command to run:
    ``--target-opset 20 (at opset 20, ...): changes no node of this model, nothing to
    recommend``."""
    what = " ".join(c.flags) or "opfuse optimize"
    return f"{what} ({c.why}): changes no node of this model, nothing to recommend"


def step_text(c: StepCommand) -> str:
    if c.error:
        return f"{c.command}: fails ({c.error})"
    if c.unchanged:
        return unchanged_text(c)
    verdict = "faster" if c.helps else "no gain beyond the noise"
    return (
        f"{c.command}: {c.ratio:.2f}x time (noise +-{c.noise:.2f}, {c.runs} runs; "
        f"{verdict}); {c.effect}"
    )


def fused_text(fused: Sequence[UBGroup]) -> str:
    us = sum(g.duration_us for g in fused)
    return f"{us:.1f} us, {100 * sum(g.share for g in fused):.1f}% of the time"


def finding_nodes(f: Finding) -> str:
    return ", ".join(f.nodes) + (" ..." if f.count > len(f.nodes) else "")


# --- the sections, in the order render.py's table prints them ----------------------------


def header_text(report: AdviceReport, console: Console, top: int) -> None:
    p = console.print
    for text in header_lines(report):
        p(text, markup=False)
    notes = report.profile.notes
    for note in notes[:top]:
        p(f"note: {note}", markup=False)
    if (line := more(top, len(notes))) is not None:
        p(line)


def quantized_text(report: AdviceReport, console: Console, top: int) -> None:
    """A quantized model's own findings (first, when there are any)."""
    if not report.quantized:
        return
    p = console.print
    p("")
    p("====Quantized model (int8)====")
    for f in report.quantized:
        p(f"{f.finding}", markup=False)
        p(f"    why it costs: {f.why}", markup=False, style="dim")
        p(f"    what to do: {f.what_to_do}", markup=False, style="dim")
        if f.cost_us:
            total = report.profile.total_us or 1.0
            p(
                f"    cost: {f.cost_us:.1f} us per run ({100 * f.cost_us / total:.1f}% "
                "of the profiled time)",
                markup=False,
                style="dim",
            )
        if f.nodes:
            p(f"    nodes: {finding_nodes(f)}", markup=False, style="dim")


def steps_text(report: AdviceReport, console: Console, top: int) -> None:
    p = console.print
    steps = report.next_steps
    p("")
    p("====Next steps====")
    if steps.skipped:
        p(f"No trial: {steps.skipped}.", markup=False)
    for c in steps.commands[:top]:
        p(f"  {step_text(c)}", markup=False)
    if (line := more(top, len(steps.commands))) is not None:
        p(f"  {line}")
    if steps.inputs is not None:
        p(steps.inputs.line("timed"), markup=False)
    if steps.commands and not steps.helps:
        p("Nothing opfuse does makes this model faster here. Where the time goes:")
    if not steps.helps:
        for d in steps.dominant[:top]:
            p(f"  {d.op_type} ({100 * d.share:.1f}% of the time): {d.suggestion}", markup=False)


def ub_text(report: AdviceReport, console: Console, top: int) -> None:
    p = console.print
    groups = report.ub_fusion
    unfused, fused = report.unfused_and_fused()
    p("")
    p("====UBModel====")
    if groups and not unfused:
        p(
            f"onnxruntime already runs each of the {len(fused)} group(s) as one kernel "
            f"({fused_text(fused)}): nothing to fuse here (listed in --format json).",
            markup=False,
        )
    elif groups:
        _ub_groups(report, console, top)
    else:
        p(EMPTY["ub_fusion"])


def _ub_groups(report: AdviceReport, console: Console, top: int) -> None:
    p = console.print
    groups = report.ub_fusion
    unfused, fused = report.unfused_and_fused()
    p("UB fusion operators need to be optimized")
    p("Identifications of UB fusion operators: the following operators can be used for UB fusion:")
    # the verdict most groups share (no opfuse pass: a UB fusion is the backend's) is
    # printed once; a group's own line shows only a verdict of its own
    verdicts = Counter(group_verdict(g) for g in groups)
    shared, n = verdicts.most_common(1)[0]
    common = shared if n > 1 else None
    if common is not None:
        p(f"For every group below unless noted, {common}", markup=False)
    # onnxruntime's word, when every group listed gets the same, is said once too
    orts = {ort_text(g.onnxruntime) for g in unfused[:top]}
    common_ort = orts.pop() if len(orts) == 1 and len(unfused[:top]) > 1 else ""
    if common_ort:
        p(f"For every group below, {common_ort}", markup=False)
    p("List of operators that can be fused in subgraph 0")
    for g in unfused[:top]:
        record(
            console,
            f"Fusion Type: {g.fusion_type}; Fusion Operator Detail: {', '.join(g.nodes)}; "
            f"Fusion Operator Duration: {_us(g.duration_us)}; "
            f"({100 * g.share:.1f}% of the time)",
        )
        extra = _group_extra(g, common, common_ort)
        if extra:
            p("    " + "; ".join(extra), markup=False, style="dim")
    if (line := more(top, len(unfused))) is not None:
        p(line)
    if fused:
        p(
            f"{len(fused)} other group(s) onnxruntime already runs as one kernel "
            f"({fused_text(fused)}): listed in --format json",
            markup=False,
        )
    p(
        "Recommendation: fuse the operators of each group (a runtime with UB fusion does it "
        "when the group is within its limits)."
    )


def _group_extra(g: UBGroup, common: str | None, common_ort: str) -> list[str]:
    """What a group's own line adds: what is not said once for every group."""
    verdict = group_verdict(g)
    return [
        x
        for x in (
            verdict if verdict != common else "",
            ort_text(g.onnxruntime) if not common_ort else "",
            "activation: " + ", ".join(a.name for a in g.activations) if g.activations else "",
            f"opfuse removes {g.opfuse_removes_us:.3f} us of this group"
            if g.opfuse_removes_us
            else "",
        )
        if x
    ]


def op_statistic_table(stats: Sequence[OpTime] | Sequence[OpStat]) -> Table:
    """msadvisor's Op Statistic (``opfuse profile`` prints it too)."""
    table = Table(title=f"Op Statistic (per run, {RUNS_NOTE})", title_justify="left")
    for col in ("OP Type", "Count", "Total Time(us)", "Avg Time(us)", "Ratio(%)"):
        table.add_column(col, justify="left" if col == "OP Type" else "right", overflow="fold")
    for s in stats:
        table.add_row(
            s.op_type, str(s.count), f"{s.total_us:.3f}", f"{s.mean_us:.3f}", f"{100 * s.share:.2f}"
        )
    return table


def time_text(report: AdviceReport, console: Console, top: int) -> None:
    """Where the time goes: the op statistic, then the slowest nodes."""
    p = console.print
    p(op_statistic_table(report.op_statistic[:top]))
    if (line := more(top, len(report.op_statistic))) is not None:
        p(line)
    shown = report.top_nodes[:top]
    headers, cells, notes = fold_columns(
        ("Op Name", "OP Type", "Duration(us)", "IQR(us)", "Ratio(%)", ORIGINAL),
        [
            (
                n.name,
                n.op_type,
                f"{n.duration_us:.3f}",
                f"{n.iqr_us:.3f}",
                f"{100 * n.share:.2f}",
                nodes_text(n.name, n.nodes),
            )
            for n in shown
        ],
        numeric=NUMBERS,
    )
    natural = sum(
        max([len(h), *(len(str(r[i])) for r in cells)]) + 3 for i, h in enumerate(headers)
    )
    if natural + 1 <= console.width or not shown:
        table = Table(
            title=f"Top {len(shown)} slow nodes (per run)",
            title_justify="left",
            caption=CAPTION if ORIGINAL in headers else None,
        )
        for col in headers:  # names fold onto more lines, never cut
            table.add_column(col, justify="right" if col in NUMBERS else "left", overflow="fold")
        for row in cells:
            table.add_row(*(str(c) for c in row))
        p(table)
        for note in notes:
            p(note, markup=False)
    else:
        _slow_list(shown, console)
    if (line := more(top, len(report.top_nodes))) is not None:
        p(line)


def _slow_list(shown: Sequence[TopNode], console: Console) -> None:
    """Too narrow for the names in a table: one entry per node, the names whole."""
    p = console.print
    p(
        f"Top {len(shown)} slow nodes (per run): duration, IQR over the runs, share of the "
        "time, op type, name; runs: the model's nodes behind a fused kernel's name",
        markup=False,
    )
    for i, n in enumerate(shown, 1):
        p(
            f"{i:>3}. {n.duration_us:.3f} us (IQR {n.iqr_us:.3f}, "
            f"{100 * n.share:.2f}%) {n.op_type} {n.name}",
            markup=False,
        )
        behind = nodes_text(n.name, n.nodes)
        if behind != "=":
            p(f"     runs: {behind}", markup=False, style="dim")


def aipp_text(report: AdviceReport, console: Console, top: int) -> None:
    p = console.print
    chains = report.aipp_fusion
    p("")
    p("====AippFusionModel====")
    if not chains:
        p(EMPTY["aipp_fusion"])
        return
    p("Fuse Cast/TransData with Conv needs to be optimized")
    p(
        "Identifications of AIPP fusion operators: the following operators can be used for AIPP fusion:"
    )
    p("List of operators that can be fused with aipp")
    for i, a in enumerate(chains[:top], 1):
        p(f"{i}. {'+'.join([*a.nodes, a.first_conv])}", markup=False)
        p(
            f"    op types: {'+'.join(a.op_types)}+Conv; input normalization: "
            f"{', '.join(a.normalization) or 'none'}; duration: {_us(a.duration_us)} us",
            markup=False,
            style="dim",
        )
        p(f"    {verdict_text(a.opfuse)}", markup=False, style="dim")
    if (line := more(top, len(chains))) is not None:
        p(line)
    p(
        "Recommendation: move the input conversion and normalization into hardware "
        "preprocessing (AIPP) or fold it into the first Conv."
    )


def hints_text(report: AdviceReport, console: Console, top: int) -> None:
    p = console.print
    p("")
    p("====Operator constraints====")
    if not report.hints:
        p(EMPTY["hints"])
        return
    by_kind: dict[str, list[HintRow]] = {}
    for h in report.hints:
        by_kind.setdefault(h.kind, []).append(h)
    for kind, hints in by_kind.items():
        p(f"{HINT_TITLES.get(kind, kind)}: {len(hints)}")
        for h in hints[:top]:
            p(
                f"  {h.node} ({h.op_type}, {h.duration_us:.3f} us): {h.message}; "
                f"{verdict_text(h.opfuse)}",
                markup=False,
            )
        if (line := more(top, len(hints))) is not None:
            p(f"  {line}")


def passes_text(report: AdviceReport, console: Console, top: int) -> None:
    rows = report.graph_fusion
    if not rows:
        return
    p = console.print
    p("")
    p("====GraphFusion (opfuse trial run)====")
    for row in rows[:top]:
        p(
            f"{row.pass_name}: matched_times={row.matched}, effected_times={row.effected}",
            markup=False,
        )
        for r in row.reasons[:3]:
            p(
                f"    not applied {r.count}x: {r.reason} ({', '.join(r.nodes[:3])})",
                markup=False,
                style="dim",
            )
    if (line := more(top, len(rows))) is not None:
        p(line)


def l2_text(report: AdviceReport, console: Console, top: int) -> None:
    """msadvisor's L2 section (Ascend's: shown for ascend targets or msprof counters)."""
    if not report.ascend_sections:
        return
    p = console.print
    chains = report.l2_fusion
    p("")
    p("====L2Model====")
    if not chains:
        p(EMPTY["l2_fusion"])
        return
    p("L2 fusion operators need to be optimized")
    p("Identifications of L2 fusion operators: the following operators can be used for L2 fusion:")
    p("List of operators that can be fused in subgraph")
    shown = chains[:top]
    for i, c in enumerate(shown, 1):
        p(f"{i}. {', '.join(c.nodes)}", markup=False)
    if (line := more(top, len(chains))) is not None:
        p(line)
    for i, c in enumerate(shown, 1):
        _l2_chain(report, c, i, console)
    if above_peak(shown):
        p(f"* {ABOVE_PEAK} (target {report.target.name}).", markup=False)
    # "Recommadation" is msadvisor's own spelling in its L2 section, kept so the output
    # matches what Ascend users grep for
    p("Recommadation: 1. Open AOE (or let the runtime keep these intermediates in L2).")


def _l2_chain(report: AdviceReport, c: L2Chain, i: int, console: Console) -> None:
    p = console.print
    label = (
        " (ratios are estimates: FLOPs and bytes against the target's peaks)"
        if "estimate" in c.ratios_source
        else ""
    )
    p(f"Op Info {i}{label}", markup=False)
    for op in c.ops:
        r = op.ratios
        record(
            console,
            f"Op Name: {op.name}; OP Type: {op.op_type}; Input Shapes: "
            f"{op.input_shapes}; mac_ratio: {ratio_text(r.get('mac_ratio'))}; vec_ratio: "
            f"{ratio_text(r.get('vec_ratio'))}; mte2_ratio: {ratio_text(r.get('mte2_ratio'))}; "
            f"mte3_ratio: {ratio_text(r.get('mte3_ratio'))};",
        )
    split = c.batch_split
    if split:
        p(
            f"Recommendation: split batch {split.batch} into {split.runs} runs of "
            f"batch {split.split_to} so the intermediates stay in L2 "
            f"({report.target.target.l2_bytes} bytes).",
            markup=False,
        )
