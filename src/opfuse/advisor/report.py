"""Text rendering of the advisor report, in the sections and wording of Ascend's model
advisor (====UBModel====, ====AippFusionModel====, ====L2Model====), with rich tables for the
op statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from opfuse.advisor.l2 import ABOVE_PEAK, RATIO_KEYS

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
CAPTION = "Original Node(s): the model's nodes behind a fused kernel's name; = the node itself"


def nodes_text(name: str, nodes: list[str]) -> str:
    """The model's node(s) behind a profiled name ('=' where it is the node's own name)."""
    if nodes == [name]:
        return "="
    return ", ".join(nodes) if nodes else "(not mapped)"


def _us(value: object) -> str:
    return f"{float(value):.6f}" if isinstance(value, (int, float)) else "n/a"  # type: ignore[arg-type]


def ratio_text(value: object) -> str:
    """msprof's six decimals; ``*`` marks an estimate above 1 (see ABOVE_PEAK)."""
    if not isinstance(value, (int, float)):
        return "n/a"
    return f"{value:.6f}" + ("*" if value > 1 else "")


def above_peak(chains: list[Mapping[str, Any]]) -> bool:
    return any(
        isinstance(op[k], (int, float)) and op[k] > 1
        for c in chains
        for op in c["ops"]
        for k in RATIO_KEYS
    )


def verdict_text(opfuse: Mapping[str, Any] | None) -> str:
    if not opfuse:
        return "opfuse: no pass"
    name = opfuse.get("pass")
    if name is None:
        return (
            f"opfuse: no pass ({opfuse.get('reason')})"
            if opfuse.get("reason")
            else "opfuse: no pass"
        )
    if opfuse.get("available") is False:
        return f"opfuse: {name} not available ({opfuse.get('reason')})"
    if opfuse.get("fires") is True:
        return f"opfuse: {name} applies it"
    if opfuse.get("fires") is False:
        return f"opfuse: {name} would not fire: {opfuse.get('reason')}"
    return f"opfuse: {name} ({opfuse['reason']})" if opfuse.get("reason") else f"opfuse: {name}"


def ort_text(ort: Mapping[str, Any] | None) -> str:
    if not ort:
        return ""
    kernels = ", ".join(ort["kernels"]) or "none"
    return f"onnxruntime fuses it: {ort['fuses']} (runs {kernels})"


def render_text(report: Mapping[str, Any], console: Console, top: int = 10) -> None:
    p = console.print
    prof = report["profile"]
    tgt = report["target"]
    p(
        f"model: {report['model'] or '(none)'}; target: {tgt['name']} ({tgt['source']}); "
        f"profile: {prof['source']}, {prof['runs']} run(s) after {prof['warmup']} warm-up, "
        f"total {prof['total_us']:.1f} us per run",
        markup=False,
    )
    graph = report["graph"]
    p(
        f"graph: {graph['analysed']}"
        + (
            f" ({graph['nodes_original']} -> {graph['nodes_analysed']} nodes)"
            if graph["nodes_original"] is not None
            else f" ({graph['nodes_analysed']} ops)"
        )
        + (
            f"; {graph['subgraphs']} If/Loop/Scan bodies not analysed" if graph["subgraphs"] else ""
        ),
        markup=False,
    )
    if prof["unmapped_us"]:
        p(
            f"time not mapped onto the graph: {prof['unmapped_us']:.1f} us "
            f"({', '.join(prof['unmapped_nodes'][:5])})",
            markup=False,
        )
    for note in prof["notes"]:
        p(f"note: {note}", markup=False)

    table = Table(title=f"Op Statistic (per run, {RUNS_NOTE})", title_justify="left")
    for col in ("OP Type", "Count", "Total Time(us)", "Avg Time(us)", "Ratio(%)"):
        table.add_column(col, justify="left" if col == "OP Type" else "right")
    for s in report["op_statistic"]:
        table.add_row(
            s["op_type"],
            str(s["count"]),
            f"{s['total_us']:.3f}",
            f"{s['mean_us']:.3f}",
            f"{100 * s['share']:.2f}",
        )
    p(table)
    table = Table(
        title=f"Top {len(report['top_nodes'])} slow nodes (per run)",
        title_justify="left",
        caption=CAPTION,
    )
    for col in ("Op Name", "OP Type", "Duration(us)", "Ratio(%)", ORIGINAL):
        table.add_column(col, justify="right" if col in ("Duration(us)", "Ratio(%)") else "left")
    for n in report["top_nodes"]:
        table.add_row(
            n["name"],
            n["op_type"],
            f"{n['duration_us']:.3f}",
            f"{100 * n['share']:.2f}",
            nodes_text(n["name"], n["nodes"]),
        )
    p(table)

    p("")
    p("====UBModel====")
    if report["ub_fusion"]:
        p("UB fusion operators need to be optimized")
        p(
            "Identifications of UB fusion operators: the following operators can be used for UB fusion:"
        )
        # the verdict most groups share (no opfuse pass: a UB fusion is the backend's) is
        # printed once; a group's own line shows only a verdict of its own
        verdicts = Counter(verdict_text(g["opfuse"]) for g in report["ub_fusion"])
        shared, n = verdicts.most_common(1)[0]
        common = shared if n > 1 else None
        if common is not None:
            p(f"For every group below unless noted, {common}", markup=False, soft_wrap=True)
        p("List of operators that can be fused in subgraph 0")
        for g in report["ub_fusion"]:
            p(
                f"Fusion Type: {g['fusion_type']}; Fusion Operator Detail: {', '.join(g['nodes'])}; "
                f"Fusion Operator Duration: {_us(g['duration_us'])};",
                markup=False,
                soft_wrap=True,
            )
            verdict = verdict_text(g["opfuse"])
            extra = [
                x for x in (verdict if verdict != common else "", ort_text(g["onnxruntime"])) if x
            ]
            if extra:
                p("    " + "; ".join(extra), markup=False, soft_wrap=True, style="dim")
        p(
            "Recommendation: fuse the operators of each group (a runtime with UB fusion does it "
            "when the group is within its limits)."
        )
    else:
        p(EMPTY["ub_fusion"])

    p("")
    p("====AippFusionModel====")
    if report["aipp_fusion"]:
        p("Fuse Cast/TransData with Conv needs to be optimized")
        p(
            "Identifications of AIPP fusion operators: the following operators can be used for AIPP fusion:"
        )
        p("List of operators that can be fused with aipp")
        for i, a in enumerate(report["aipp_fusion"], 1):
            p(f"{i}. {'+'.join(a['nodes'] + [a['first_conv']])}", markup=False, soft_wrap=True)
            p(
                f"    op types: {'+'.join(a['op_types'])}+Conv; input normalization: "
                f"{', '.join(a['normalization']) or 'none'}; duration: {_us(a['duration_us'])} us",
                markup=False,
                soft_wrap=True,
                style="dim",
            )
            p(f"    {verdict_text(a['opfuse'])}", markup=False, soft_wrap=True, style="dim")
        p(
            "Recommendation: move the input conversion and normalization into hardware "
            "preprocessing (AIPP) or fold it into the first Conv."
        )
    else:
        p(EMPTY["aipp_fusion"])

    p("")
    p("====L2Model====")
    if report["l2_fusion"]:
        p("L2 fusion operators need to be optimized")
        p(
            "Identifications of L2 fusion operators: the following operators can be used for L2 fusion:"
        )
        p("List of operators that can be fused in subgraph")
        for i, c in enumerate(report["l2_fusion"], 1):
            p(f"{i}. {', '.join(c['nodes'])}", markup=False, soft_wrap=True)
        for i, c in enumerate(report["l2_fusion"], 1):
            source = c["ratios_source"]
            label = (
                " (ratios are estimates: FLOPs and bytes against the target's peaks)"
                if "estimate" in source
                else ""
            )
            p(f"Op Info {i}{label}", markup=False)
            for op in c["ops"]:
                p(
                    f"Op Name: {op['name']}; OP Type: {op['op_type']}; Input Shapes: "
                    f"{op['input_shapes']}; mac_ratio: {ratio_text(op['mac_ratio'])}; vec_ratio: "
                    f"{ratio_text(op['vec_ratio'])}; mte2_ratio: {ratio_text(op['mte2_ratio'])}; "
                    f"mte3_ratio: {ratio_text(op['mte3_ratio'])};",
                    markup=False,
                    soft_wrap=True,
                )
            split = c["batch_split"]
            if split:
                p(
                    f"Recommendation: split batch {split['batch']} into {split['runs']} runs of "
                    f"batch {split['split_to']} so the intermediates stay in L2 "
                    f"({tgt['l2_bytes']} bytes).",
                    markup=False,
                )
        if above_peak(report["l2_fusion"]):
            p(f"* {ABOVE_PEAK} (target {tgt['name']}).", markup=False)
        # "Recommadation" is msadvisor's own spelling in its L2 section, kept so the output
        # matches what Ascend users grep for
        p("Recommadation: 1. Open AOE (or let the runtime keep these intermediates in L2).")
    else:
        p(EMPTY["l2_fusion"])

    p("")
    p("====Operator constraints====")
    if not report["hints"]:
        p(EMPTY["hints"])
    else:
        by_kind: dict[str, list[Mapping[str, Any]]] = {}
        for h in report["hints"]:
            by_kind.setdefault(h["kind"], []).append(h)
        for kind, hints in by_kind.items():
            p(f"{HINT_TITLES.get(kind, kind)}: {len(hints)}")
            for h in hints[:top]:
                p(
                    f"  {h['node']} ({h['op_type']}, {h['duration_us']:.3f} us): {h['message']}; "
                    f"{verdict_text(h['opfuse'])}",
                    markup=False,
                    soft_wrap=True,
                )
            if len(hints) > top:
                p(f"  ... and {len(hints) - top} more (see --format json)")
    if report["graph_fusion"]:
        p("")
        p("====GraphFusion (opfuse trial run)====")
        for row in report["graph_fusion"]:
            p(
                f"{row['pass']}: matched_times={row['matched']}, effected_times={row['effected']}",
                markup=False,
            )
            for r in row["reasons"][:3]:
                p(
                    f"    not applied {r['count']}x: {r['reason']} ({', '.join(r['nodes'][:3])})",
                    markup=False,
                    soft_wrap=True,
                    style="dim",
                )
