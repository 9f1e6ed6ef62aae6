"""One self-contained HTML file: the op-time chart and each top group drawn as inline SVG,
then the tables of every section. No external resources, no network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from opfuse.advisor.l2 import ABOVE_PEAK, RATIO_KEYS
from opfuse.advisor.report import (
    CAPTION,
    EMPTY,
    HINT_TITLES,
    ORIGINAL,
    RUNS_NOTE,
    above_peak,
    nodes_text,
    ort_text,
    ratio_text,
    verdict_text,
)

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.num{text-align:right}.dim{color:#666;font-size:12px}
.group{display:inline-block;margin:6px;padding:6px;border:1px solid #ddd;border-radius:4px}
"""
SCRIPT = """
window.addEventListener('error', function (e) {
  document.body.setAttribute('data-error', String(e.message));
});
window.addEventListener('load', function () {
  var charts = document.querySelectorAll('svg.chart rect.bar').length;
  var graphs = document.querySelectorAll('svg.group-graph').length;
  var chart = document.getElementById('group-chart');
  var box = chart ? chart.getBoundingClientRect() : null;
  var seen = box && box.width > 0 && box.top >= 0 && box.bottom <= window.innerHeight;
  document.body.setAttribute('data-rendered', 'bars=' + charts + ';groups=' + graphs +
    ';chart-in-view=' + (seen ? 'yes' : 'no'));
});
"""
COLORS = {"conv": "#4e79a7", "elementwise": "#f28e2b", "reduce": "#59a14f", "other": "#9c9c9c"}


def _color(op_type: str) -> str:
    from opfuse.advisor.opkinds import Kind, classify

    kind = classify(op_type)
    return COLORS.get(kind.value, COLORS["other"]) if kind is not Kind.OPAQUE else COLORS["other"]


def bar_chart(title: str, rows: Sequence[tuple[str, float, str]], chart_id: str) -> str:
    """Horizontal bars: (label, value in us, color)."""
    if not rows:
        return ""
    width, label_w, bar_h = 1040, 440, 20
    height = 30 + bar_h * len(rows)
    top = max(v for _, v, _ in rows) or 1.0
    parts = [
        f'<svg class="chart" id="{chart_id}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="16" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i, (label, value, color) in enumerate(rows):
        y = 26 + i * bar_h
        w = max(1.0, (width - label_w - 110) * value / top)
        short = label if len(label) <= 64 else label[:30] + "…" + label[-33:]
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" font-size="11" text-anchor="end">'
            f"{escape(short)}</text>"
            f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" '
            f'fill="{color}"><title>{escape(label)}: {value:.1f} us</title></rect>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" font-size="11">{value:.1f} us</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def group_graph(group: Mapping[str, Any], uid: int = 0) -> str:
    """The group's nodes left to right with the edges between them; ``uid`` keeps the
    arrow marker's id unique in the page."""
    types, names = group["op_types"], group["nodes"]
    box_w, box_h, gap = 110, 34, 40
    width = len(types) * (box_w + gap) - gap + 20
    height = box_h + 70
    arrow = f"arrow-{uid}"
    parts = [
        f'<svg class="group-graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}"><defs><marker id="{arrow}" markerWidth="8" markerHeight="8" '
        f'refX="7" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker>'
        "</defs>"
    ]
    xs = [10 + i * (box_w + gap) for i in range(len(types))]
    y = 20
    for src, dst in group.get("edges", []):
        x1, x2 = xs[src] + box_w, xs[dst]
        if dst == src + 1:
            parts.append(
                f'<line x1="{x1}" y1="{y + box_h / 2}" x2="{x2 - 2}" y2="{y + box_h / 2}" '
                f'stroke="#555" marker-end="url(#{arrow})"/>'
            )
        else:  # skip edge drawn as an arc below the boxes
            mid = (xs[src] + xs[dst] + box_w) / 2
            parts.append(
                f'<path d="M{xs[src] + box_w / 2},{y + box_h} Q{mid},{y + box_h + 40} '
                f'{xs[dst] + box_w / 2},{y + box_h + 2}" fill="none" stroke="#555" '
                f'marker-end="url(#{arrow})"/>'
            )
    for x, op, name in zip(xs, types, names, strict=True):
        parts.append(
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="5" fill="{_color(op)}">'
            f"<title>{escape(name)}</title></rect>"
            f'<text x="{x + box_w / 2}" y="{y + 21}" font-size="12" fill="#fff" '
            f'text-anchor="middle">{escape(op)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str | None = None
) -> str:
    """A table, or the ``empty`` message (as the text report prints it) when no rows."""
    if not rows and empty is not None:
        return f'<p class="empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{c:.3f}</td>'
            if isinstance(c, float)
            else f"<td>{escape(str(c))}</td>"
            for c in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(report: Mapping[str, Any], top: int = 10) -> str:
    prof, tgt = report["profile"], report["target"]
    ub = report["ub_fusion"]
    out = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>opfuse advise: {escape(str(report['model'] or 'op summary'))}</title>",
        f"<style>{CSS}</style><script>{SCRIPT}</script></head><body>",
        f"<h1>opfuse advise: {escape(str(report['model'] or 'op summary'))}</h1>",
        f'<p class="dim">target {escape(tgt["name"])}; profile {escape(prof["source"])}, '
        f"{prof['runs']} run(s), total {prof['total_us']:.1f} us per run; "
        f"unmapped {prof['unmapped_us']:.1f} us</p>",
    ]
    for note in prof["notes"]:
        out.append(f'<p class="dim">note: {escape(note)}</p>')
    out.append("<h2>Op time</h2>")
    # the report lists groups of one type together; the chart and drawings show the largest
    largest = sorted(ub, key=lambda g: -g["duration_us"])[:top]
    out.append(
        bar_chart(
            f"Top {len(largest)} UB fusion groups by duration",
            [
                (f"{g['fusion_type']}: {g['nodes'][0]}", g["duration_us"], _color(g["op_types"][0]))
                for g in largest
            ],
            "group-chart",
        )
    )
    out.append(
        bar_chart(
            "Time per op type",
            [
                (s["op_type"], s["total_us"], _color(s["op_type"]))
                for s in report["op_statistic"][:15]
            ],
            "op-chart",
        )
    )
    out.append(f"<h2>Op Statistic (per run, {escape(RUNS_NOTE)})</h2>")
    out.append(
        _table(
            ["OP Type", "Count", "Total Time(us)", "Avg Time(us)", "Ratio(%)"],
            [
                (s["op_type"], s["count"], s["total_us"], s["mean_us"], 100 * s["share"])
                for s in report["op_statistic"]
            ],
        )
    )
    out.append(
        _table(
            ["Op Name", "OP Type", "Duration(us)", "Ratio(%)", ORIGINAL],
            [
                (
                    n["name"],
                    n["op_type"],
                    n["duration_us"],
                    100 * n["share"],
                    nodes_text(n["name"], n["nodes"]),
                )
                for n in report["top_nodes"]
            ],
        )
    )
    out.append(f'<p class="dim">{escape(CAPTION)}</p>')
    out.append("<h2>====UBModel====</h2>")
    for i, g in enumerate(largest):
        out.append(
            f'<div class="group"><div><b>{escape(g["fusion_type"])}</b> '
            f"{g['duration_us']:.1f} us</div>{group_graph(g, i)}"
            f'<div class="dim">{escape(g["nodes"][0])}</div></div>'
        )
    out.append(
        _table(
            [
                "Fusion Type",
                "Fusion Operator Detail",
                "Fusion Operator Duration",
                "opfuse",
                "onnxruntime",
            ],
            [
                (
                    g["fusion_type"],
                    ", ".join(g["nodes"]),
                    g["duration_us"],
                    verdict_text(g["opfuse"]),
                    ort_text(g["onnxruntime"]),
                )
                for g in ub
            ],
            EMPTY["ub_fusion"],
        )
    )
    out.append("<h2>====AippFusionModel====</h2>")
    out.append(
        _table(
            ["#", "Operators", "First Conv", "Normalization", "Duration(us)", "opfuse"],
            [
                (
                    i,
                    "+".join(a["nodes"]),
                    a["first_conv"],
                    ", ".join(a["normalization"]),
                    a["duration_us"],
                    verdict_text(a["opfuse"]),
                )
                for i, a in enumerate(report["aipp_fusion"], 1)
            ],
            EMPTY["aipp_fusion"],
        )
    )
    out.append("<h2>====L2Model====</h2>")
    if not report["l2_fusion"]:
        out.append(f'<p class="empty">{escape(EMPTY["l2_fusion"])}</p>')
    for i, c in enumerate(report["l2_fusion"], 1):
        split = c["batch_split"]
        note = (
            f"; split batch {split['batch']} into {split['runs']} x {split['split_to']}"
            if split
            else ""
        )
        out.append(
            f"<p>{i}. {escape(', '.join(c['nodes']))} "
            f'<span class="dim">({c["duration_us"]:.1f} us; ratios: '
            f"{escape(c['ratios_source'])}{escape(note)})</span></p>"
        )
        out.append(
            _table(
                [
                    "Op Name",
                    "OP Type",
                    "Input Shapes",
                    "mac_ratio",
                    "vec_ratio",
                    "mte2_ratio",
                    "mte3_ratio",
                ],
                [
                    (
                        op["name"],
                        op["op_type"],
                        op["input_shapes"],
                        *(ratio_text(op[k]) for k in RATIO_KEYS),
                    )
                    for op in c["ops"]
                ],
            )
        )
    if above_peak(report["l2_fusion"]):
        out.append(f'<p class="dim">* {escape(ABOVE_PEAK)} (target {escape(tgt["name"])}).</p>')
    out.append("<h2>Operator constraints</h2>")
    out.append(
        _table(
            ["Kind", "Node", "OP Type", "Duration(us)", "Hint", "opfuse"],
            [
                (
                    HINT_TITLES.get(h["kind"], h["kind"]),
                    h["node"],
                    h["op_type"],
                    h["duration_us"],
                    h["message"],
                    verdict_text(h["opfuse"]),
                )
                for h in report["hints"]
            ],
            EMPTY["hints"],
        )
    )
    if report["graph_fusion"]:
        out.append("<h2>GraphFusion (opfuse trial run)</h2>")
        out.append(
            _table(
                ["Pass", "matched", "effected", "not applied because"],
                [
                    (
                        r["pass"],
                        r["matched"],
                        r["effected"],
                        "; ".join(f"{x['reason']} ({x['count']}x)" for x in r["reasons"]),
                    )
                    for r in report["graph_fusion"]
                ],
            )
        )
    out.append("</body></html>\n")
    return "\n".join(out)
