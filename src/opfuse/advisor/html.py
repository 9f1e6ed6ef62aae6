"""One self-contained HTML file: the op-time chart and each top group drawn as inline SVG,
then the tables of every section. No external resources, no network. One renderer per
section (``*_html(report, top)``: the page's lines, listed with their text twins in
render.py's table) and the page around them (``page``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from opfuse.advisor.l2 import ABOVE_PEAK, RATIO_KEYS
from opfuse.advisor.report import (
    CAPTION,
    EMPTY,
    HINT_TITLES,
    ORIGINAL,
    RUNS_NOTE,
    above_peak,
    finding_nodes,
    fold_columns,
    fused_text,
    group_verdict,
    header_lines,
    more,
    nodes_text,
    ort_text,
    ratio_text,
    unchanged_text,
    verdict_text,
)
from opfuse.advisor.report_types import AdviceReport, L2Chain, NextSteps, UBGroup

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1180px}
h1{font-size:20px;margin-bottom:4px}h2{font-size:17px;margin:28px 0 2px;border-bottom:1px solid #ccc}
.sub{color:#777;font-size:12px;margin:0 0 8px}.head p{margin:2px 0;font-size:13px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.num{text-align:right;white-space:nowrap}.dim{color:#666;font-size:12px}
.warn{color:#a33;font-size:13px}.more{color:#666;font-size:12px;font-style:italic}
.steps li{margin:3px 0}.good{color:#176b2c;font-weight:bold}
.cards{display:flex;flex-wrap:wrap;gap:8px}
.group{border:1px solid #ddd;border-radius:4px;padding:6px;font-size:12px;max-width:560px;
min-width:0;box-sizing:border-box;overflow-wrap:anywhere}
.group svg,svg.chart{display:block;max-width:100%;height:auto}
td{overflow-wrap:anywhere}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
"""
SCRIPT = """
window.addEventListener('error', function (e) {
  document.body.setAttribute('data-error', String(e.message));
});
window.addEventListener('load', function () {
  var bars = document.querySelectorAll('svg.chart rect.bar').length;
  var graphs = document.querySelectorAll('svg.group-graph').length;
  var chart = document.getElementById('group-chart');
  var box = chart ? chart.getBoundingClientRect() : null;
  var seen = box && box.width > 0 && box.top >= 0 && box.bottom <= window.innerHeight;
  var steps = document.getElementById('steps').getBoundingClientRect().top;
  document.body.setAttribute('data-rendered', 'bars=' + bars + ';groups=' + graphs +
    ';chart-in-view=' + (seen ? 'yes' : 'no') + ';steps-top=' + Math.round(steps));
  // layout boxes: every drawing (and each of its shapes) inside its card, each op label
  // inside its box, no two cards overlapping
  function inside(a, b) {
    return a.left >= b.left - 0.5 && a.right <= b.right + 0.5 &&
      a.top >= b.top - 0.5 && a.bottom <= b.bottom + 0.5;
  }
  var cards = document.querySelectorAll('.group'), outside = 0, labels = 0, overlaps = 0;
  var widest = 0;
  for (var i = 0; i < cards.length; i++) {
    var card = cards[i].getBoundingClientRect();
    var shapes = cards[i].querySelectorAll('svg, svg rect, svg text, svg path, svg line');
    for (var j = 0; j < shapes.length; j++) {
      if (shapes[j].closest('defs')) { continue; }  // the arrow marker's template
      if (!inside(shapes[j].getBoundingClientRect(), card)) { outside++; }
    }
    var texts = cards[i].querySelectorAll('svg g.op');
    for (var k = 0; k < texts.length; k++) {
      var box = texts[k].querySelector('rect').getBoundingClientRect();
      var label = texts[k].querySelector('text').getBoundingClientRect();
      if (!inside(label, box)) { labels++; }
    }
    widest = Math.max(widest, card.width);
    for (var m = i + 1; m < cards.length; m++) {
      var other = cards[m].getBoundingClientRect();
      if (card.left < other.right && other.left < card.right &&
          card.top < other.bottom && other.top < card.bottom) { overlaps++; }
    }
  }
  document.body.setAttribute('data-layout', 'cards=' + cards.length + ';outside=' + outside +
    ';labels-outside=' + labels + ';overlaps=' + overlaps + ';widest=' + Math.round(widest) +
    ';page-width=' + document.documentElement.scrollWidth);
});
"""
# human title -> msadvisor's own section name (shown as the subtitle)
TITLES = {
    "steps": ("Next steps", "measured on this machine"),
    "ub": ("Groups a backend could fuse", "msadvisor: UBModel"),
    "aipp": ("Input conversion before the first convolution", "msadvisor: AippFusionModel"),
    "l2": ("Chains whose intermediates could stay in L2", "msadvisor: L2Model"),
    "time": ("Where the time goes", "msadvisor: Op Statistic"),
    "hints": ("Operator constraints", "Atlas tuning guide"),
    "quantized": ("The quantized model (int8)", "Q/DQ, integer kernels, the CPU"),
    "passes": ("opfuse passes on this model", "CANN: GraphFusion"),
}
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
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f'<text x="0" y="16" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i, (label, value, color) in enumerate(rows):
        y = 26 + i * bar_h
        w = max(1.0, (width - label_w - 110) * value / top)
        short = shorten(label, LABEL_CHARS)
        fit = _fit(short, 11, label_w - 10)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" font-size="11" text-anchor="end"{fit}>'
            f"{escape(short)}</text>"
            f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" '
            f'fill="{color}"><title>{escape(label)}: {value:.1f} us</title></rect>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" font-size="11">{value:.1f} us</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


BOX_W, BOX_H, GAP, ROW_GAP, MARGIN = 104, 38, 30, 44, 8
PER_ROW = 4  # boxes per row: a card (560 px) holds 4; longer groups wrap onto more rows
CHAR_W = 0.6  # an average glyph's width per unit of font size (sans-serif)
LABEL_CHARS = 66  # bar chart labels: what fits in the label column at 11 px
BREAK = re.compile(r"(?<=[/,+:_. -])|(?<=[a-z0-9])(?=[A-Z])")


def shorten(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters between words (at ``/ , + : _ .``,
    spaces and camel-case steps), its start and end kept around an ellipsis; never inside
    a word, so a word longer than the limit is kept whole (the drawing scales it)."""
    if len(text) <= limit:
        return text
    words = [w for w in BREAK.split(text) if w]
    head: list[str] = []
    tail: list[str] = []
    used = 1
    for w in words:  # the start: up to 40% of the room
        if used + len(w) > 0.4 * limit and head:
            break
        head.append(w)
        used += len(w)
    for w in reversed(words[len(head) :]):
        if used + len(w) > limit and tail:
            break
        tail.insert(0, w)
        used += len(w)
    if len(head) + len(tail) >= len(words):
        return text
    return "".join(head) + "…" + "".join(tail)


def label_lines(op: str, chars: int) -> list[str]:
    """An op type on at most two lines of about ``chars`` characters, broken between
    camel-case words (``Dequantize`` / ``Linear``), never inside one."""
    if len(op) <= chars:
        return [op]
    words = [w for w in BREAK.split(op) if w]
    best = [op]
    for i in range(1, len(words)):
        first, second = "".join(words[:i]), "".join(words[i:])
        if max(len(first), len(second)) < max(len(x) for x in best):
            best = [first, second]
    return best


def _fit(text: str, size: float, room: float) -> str:
    """A ``textLength`` that squeezes ``text`` into ``room`` px where it would not fit at
    ``size`` px (the glyphs narrowed; no character dropped), else nothing."""
    if len(text) * size * CHAR_W <= room:
        return ""
    return f' textLength="{room:.0f}" lengthAdjust="spacingAndGlyphs"'


def group_graph(
    types: Sequence[str], names: Sequence[str], edges: Sequence[Sequence[int]], uid: int = 0
) -> str:
    """The group's nodes in reading order, ``PER_ROW`` to a row (a long group wraps onto
    more rows, so the drawing keeps its card's width at any length), with the edges
    between them; it also scales down with its card (viewBox). ``uid`` keeps the arrow
    marker's id unique in the page."""
    count = len(types)
    cols = min(count, PER_ROW)
    rows = -(-count // PER_ROW)
    width = 2 * MARGIN + cols * BOX_W + (cols - 1) * GAP
    xs = [MARGIN + (i % PER_ROW) * (BOX_W + GAP) for i in range(count)]
    ys = [MARGIN + (i // PER_ROW) * (BOX_H + ROW_GAP) for i in range(count)]
    skips = any(  # an arc under the last row needs room below it
        ys[src] == ys[dst] == ys[-1] and xs[dst] != xs[src] + BOX_W + GAP for src, dst in edges
    )
    height = 2 * MARGIN + rows * BOX_H + (rows - 1) * ROW_GAP + (22 if skips else 0)
    arrow = f"arrow-{uid}"
    parts = [
        f'<svg class="group-graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}"><defs><marker id="{arrow}" '
        'markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>'
    ]
    for src, dst in edges:
        same_row = ys[src] == ys[dst]
        if same_row and xs[dst] == xs[src] + BOX_W + GAP:  # neighbours: a short arrow
            y = ys[src] + BOX_H / 2
            parts.append(
                f'<line x1="{xs[src] + BOX_W}" y1="{y}" x2="{xs[dst] - 2}" y2="{y}" '
                f'stroke="#555" marker-end="url(#{arrow})"/>'
            )
            continue
        x1, y1 = xs[src] + BOX_W / 2, ys[src] + BOX_H
        x2 = xs[dst] + BOX_W / 2
        if same_row:  # a skip edge: an arc under the boxes, within the row gap
            y2 = ys[dst] + BOX_H + 2
            low = y1 + min(ROW_GAP, 26) - 4
            parts.append(
                f'<path d="M{x1},{y1} Q{(x1 + x2) / 2},{low} {x2},{y2}" fill="none" '
                f'stroke="#555" marker-end="url(#{arrow})"/>'
            )
        else:  # to a later row: down from the box's foot into the next box's head
            y2 = ys[dst] - 2
            mid = (y1 + y2) / 2
            parts.append(
                f'<path d="M{x1},{y1} C{x1},{mid} {x2},{mid} {x2},{y2}" fill="none" '
                f'stroke="#555" marker-end="url(#{arrow})"/>'
            )
    chars = int((BOX_W - 10) / (12 * CHAR_W))
    for x, y, op, name in zip(xs, ys, types, names, strict=True):
        lines = label_lines(op, chars)
        size = 12 if len(lines) == 1 else 11
        first = y + BOX_H / 2 + size * 0.35 - (len(lines) - 1) * size * 0.55
        text = "".join(
            f'<tspan x="{x + BOX_W / 2}" y="{first + k * size * 1.1:.1f}"'
            f"{_fit(line, size, BOX_W - 8)}>{escape(line)}</tspan>"
            for k, line in enumerate(lines)
        )
        parts.append(
            f'<g class="op"><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="{_color(op)}"><title>{escape(name)}</title></rect>'
            f'<text font-size="{size}" fill="#fff" text-anchor="middle">{text}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def breakable(text: str) -> str:
    """``text`` escaped, with a line-break opportunity after each ``/ , + _ .`` so a long
    node name wraps between its parts rather than inside a word (or out of its box)."""
    return re.sub(r"([/,+_]|\.(?=\D))", r"\1<wbr>", escape(text))


def _cell(c: object) -> str:
    if isinstance(c, float):
        return f'<td class="num">{c:.3f}</td>'
    if isinstance(c, int) and not isinstance(c, bool):
        return f'<td class="num">{c}</td>'
    return f"<td>{breakable(str(c))}</td>"


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    empty: str | None = None,
    top: int | None = None,
) -> str:
    """A table (its first ``top`` rows and a line saying how many more), or the ``empty``
    message (as the text report prints it) when no rows."""
    if not rows and empty is not None:
        return f'<p class="empty">{escape(empty)}</p>'
    cut = rows if top is None else rows[:top]
    headers, shown, notes = fold_columns(headers, cut)  # of the rows shown
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in shown)
    said = "".join(f'<p class="dim">{escape(n)}</p>' for n in notes)
    return f"<table><tr>{head}</tr>{body}</table>" + _more(len(shown), len(rows)) + said


def _more(shown: int, total: int) -> str:
    line = more(shown, total)
    return f'<p class="more">{escape(line)}</p>' if line else ""


def _title(key: str) -> str:
    title, sub = TITLES[key]
    return f'<h2 id="{key}">{escape(title)}</h2><p class="sub">{escape(sub)}</p>'


def _legend() -> str:
    names = {
        "conv": "Conv-like",
        "elementwise": "elementwise",
        "reduce": "reduce",
        "other": "other",
    }
    return (
        '<p class="legend">'
        + "".join(
            f'<span><i style="background:{COLORS[k]}"></i>{escape(v)}</span>'
            for k, v in names.items()
        )
        + "</p>"
    )


def _cards(groups: Sequence[UBGroup], top: int) -> str:
    """One card per fusion type (the largest group of the type drawn), with how many groups
    of that type there are and their summed time."""
    by_type: dict[str, list[UBGroup]] = {}
    for g in groups:
        by_type.setdefault(g.fusion_type, []).append(g)
    kinds = sorted(by_type.values(), key=lambda gs: -sum(g.duration_us for g in gs))
    out = ['<div class="cards">']
    for i, gs in enumerate(kinds[:top]):
        big = max(gs, key=lambda g: g.duration_us)
        total = sum(g.duration_us for g in gs)
        acts = ", ".join(a.name for a in big.activations)
        out.append(
            f'<div class="group"><div><b>{breakable(big.fusion_type)}</b> &times; {len(gs)}: '
            f"{total:.1f} us per run ({100 * sum(g.share for g in gs):.1f}% of the time)"
            + (f"; activation {escape(acts)}" if acts else "")
            + f"</div>{group_graph(big.op_types, big.nodes, big.edges, i)}"
            f'<div class="dim">largest: {breakable(", ".join(big.nodes))} '
            f"({big.duration_us:.1f} us)</div></div>"
        )
    out.append("</div>")
    return "".join(out) + _more(min(top, len(kinds)), len(kinds))


def page(report: AdviceReport, sections: Sequence[str]) -> str:
    """The page around the sections' lines (each section's HTML, in the table's order)."""
    name = escape(str(report.model or "op summary"))
    out = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>opfuse advise: {name}</title>",
        f"<style>{CSS}</style><script>{SCRIPT}</script></head><body>",
        f"<h1>opfuse advise: {name}</h1>",
        *sections,
        "</body></html>\n",
    ]
    return "\n".join(out)


# --- the sections, in the order render.py's table prints them ----------------------------


def header_html(report: AdviceReport, top: int) -> list[str]:
    notes = report.profile.notes
    return [
        '<div class="head">'
        + "".join(
            f'<p class="{"warn" if line.startswith("warning") else "dim"}">{escape(line)}</p>'
            for line in header_lines(report)
        )
        + "".join(f'<p class="dim">note: {escape(n)}</p>' for n in notes[:top])
        + _more(min(top, len(notes)), len(notes))
        + "</div>"
    ]


def quantized_html(report: AdviceReport, top: int) -> list[str]:
    if not report.quantized:
        return []
    return [
        _title("quantized"),
        _table(
            ["Finding", "Why it costs", "What to do", "Nodes", "Cost (us)"],
            [
                (f.finding, f.why, f.what_to_do, finding_nodes(f), f.cost_us)
                for f in report.quantized
            ],
        ),
    ]


def steps_html(report: AdviceReport, top: int) -> list[str]:
    return [_title("steps"), _steps(report.next_steps, top)]


def ub_html(report: AdviceReport, top: int) -> list[str]:
    unfused, fused = report.unfused_and_fused()
    # the report lists groups of one type together; the chart shows the largest ones the
    # runtime does not already fuse
    largest = sorted(unfused, key=lambda g: -g.duration_us)[:top]
    out = [
        _title("ub"),
        _legend(),
        bar_chart(
            f"Top {len(largest)} UB fusion groups by duration (us per run)",
            [
                (f"{g.fusion_type}: {g.nodes[0]}", g.duration_us, _color(g.op_types[0]))
                for g in largest
            ],
            "group-chart",
        ),
        _cards(unfused, top),
    ]
    ub_table = _table(
        [
            "Fusion Type",
            "Fusion Operator Detail",
            "Duration (us per run)",
            "Share (%)",
            "opfuse removes (us)",
            "opfuse",
            "onnxruntime",
        ],
        [
            (
                g.fusion_type,
                ", ".join(g.nodes),
                g.duration_us,
                100 * g.share,
                g.opfuse_removes_us if g.opfuse_removes_us is not None else "n/a",
                group_verdict(g),
                ort_text(g.onnxruntime),
            )
            for g in unfused
        ],
        EMPTY["ub_fusion"],
        top,
    )
    out.append(ub_table if unfused or not fused else "")
    if fused:
        out.append(
            f'<p class="dim">{len(fused)} {"other " if unfused else ""}group(s) onnxruntime '
            f"already runs as one kernel ({escape(fused_text(fused))} per run): listed in "
            "--format json</p>"
        )
    return out


def time_html(report: AdviceReport, top: int) -> list[str]:
    stats, nodes = report.op_statistic, report.top_nodes
    out = [
        _title("time"),
        bar_chart(
            "Time per op type (us per run)",
            [(s.op_type, s.total_us, _color(s.op_type)) for s in stats[:top]],
            "op-chart",
        ),
        _table(
            ["OP Type", "Count (per run)", "Total (us)", "Mean (us)", "Share (%)"],
            [(s.op_type, s.count, s.total_us, s.mean_us, 100 * s.share) for s in stats],
            top=top,
        ),
        f'<p class="dim">{escape(RUNS_NOTE)}; IQR: the spread over the runs</p>',
        _table(
            ["Op Name", "OP Type", "Duration (us)", "IQR (us)", "Share (%)", ORIGINAL],
            [
                (
                    n.name,
                    n.op_type,
                    n.duration_us,
                    n.iqr_us,
                    100 * n.share,
                    nodes_text(n.name, n.nodes),
                )
                for n in nodes
            ],
            top=top,
        ),
    ]
    if any(nodes_text(n.name, n.nodes) != "=" for n in nodes[:top]):
        out.append(f'<p class="dim">{escape(CAPTION)}</p>')
    return out


def aipp_html(report: AdviceReport, top: int) -> list[str]:
    return [
        _title("aipp"),
        _table(
            ["#", "Operators", "First Conv", "Normalization", "Duration (us)", "opfuse"],
            [
                (
                    i,
                    "+".join(a.nodes),
                    a.first_conv,
                    ", ".join(a.normalization),
                    a.duration_us,
                    verdict_text(a.opfuse),
                )
                for i, a in enumerate(report.aipp_fusion, 1)
            ],
            EMPTY["aipp_fusion"],
            top,
        ),
    ]


def l2_html(report: AdviceReport, top: int) -> list[str]:
    if not report.ascend_sections:
        return []
    return [_title("l2"), _l2(report.l2_fusion, report.target.name, top)]


def hints_html(report: AdviceReport, top: int) -> list[str]:
    return [
        _title("hints"),
        _table(
            ["Kind", "Node", "OP Type", "Duration (us)", "Est. gain (us)", "Hint", "opfuse"],
            [
                (
                    HINT_TITLES.get(h.kind, h.kind),
                    h.node,
                    h.op_type,
                    h.duration_us,
                    h.gain_us if h.gain_us is not None else "n/a",
                    h.message,
                    verdict_text(h.opfuse),
                )
                for h in report.hints
            ],
            EMPTY["hints"],
            top,
        ),
    ]


def passes_html(report: AdviceReport, top: int) -> list[str]:
    if not report.graph_fusion:
        return []
    return [
        _title("passes"),
        _table(
            ["Pass", "matched", "effected", "not applied because"],
            [
                (
                    r.pass_name,
                    r.matched,
                    r.effected,
                    "; ".join(f"{x.reason} ({x.count}x)" for x in r.reasons),
                )
                for r in report.graph_fusion
            ],
            top=top,
        ),
    ]


def _steps(steps: NextSteps, top: int) -> str:
    out = []
    if steps.skipped:
        out.append(f'<p class="dim">No trial: {escape(steps.skipped)}.</p>')
    if steps.commands:
        items = []
        for c in steps.commands[:top]:
            if c.error:
                result = f'<span class="warn">fails: {escape(c.error)}</span>'
            elif c.unchanged:
                items.append(f"<li>{escape(unchanged_text(c))}</li>")
                continue
            else:
                mark = ' class="good"' if c.helps else ""
                result = (
                    f"<span{mark}>{c.ratio:.2f}x time</span> "
                    f'<span class="dim">(noise &plusmn;{c.noise:.2f}, {c.runs} runs; '
                    f"{'faster' if c.helps else 'no gain beyond the noise'}; "
                    f"{escape(str(c.effect))})</span>"
                )
            items.append(f"<li><code>{escape(c.command)}</code>: {result}</li>")
        out.append('<ul class="steps">' + "".join(items) + "</ul>")
        out.append(_more(min(top, len(steps.commands)), len(steps.commands)))
        out.append(f'<p class="dim">{escape(str(steps.trial))}</p>')
        if steps.inputs is not None:
            out.append(f'<p class="dim">{escape(steps.inputs.line("timed"))}</p>')
    if not steps.helps:
        if steps.commands:
            out.append(
                "<p>Nothing opfuse does makes this model faster here. Where the time goes:</p>"
            )
        out.append(
            '<ul class="steps">'
            + "".join(
                f"<li><b>{escape(d.op_type)}</b> ({100 * d.share:.1f}% of the time): "
                f"{escape(d.suggestion)}</li>"
                for d in steps.dominant[:top]
            )
            + "</ul>"
        )
    return "".join(out)


def _l2(chains: Sequence[L2Chain], target: str, top: int) -> str:
    if not chains:
        return f'<p class="empty">{escape(EMPTY["l2_fusion"])}</p>'
    out = []
    for i, c in enumerate(chains[:top], 1):
        split = c.batch_split
        note = f"; split batch {split.batch} into {split.runs} x {split.split_to}" if split else ""
        out.append(
            f"<p>{i}. {escape(', '.join(c.nodes))} "
            f'<span class="dim">({c.duration_us:.1f} us per run; ratios: '
            f"{escape(c.ratios_source)}{escape(note)})</span></p>"
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
                        op.name,
                        op.op_type,
                        op.input_shapes,
                        *(ratio_text(op.ratios.get(k)) for k in RATIO_KEYS),
                    )
                    for op in c.ops
                ],
                top=top,
            )
        )
    out.append(_more(min(top, len(chains)), len(chains)))
    if above_peak(chains[:top]):
        out.append(f'<p class="dim">* {escape(ABOVE_PEAK)} (target {escape(target)}).</p>')
    out.append('<p class="dim">ratios: busy fraction of the unit (1 = its peak)</p>')
    return "".join(out)
