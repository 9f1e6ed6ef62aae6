"""OUTDIR/summary.html: counts per status and a sortable table of the models, each
linking to its reports. One self-contained page (no network), written atomically."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from opfuse.model.io import write_text

SUMMARY = "summary.html"
REPORT_ORDER = ("advise_html", "advise_json", "tune", "fusion_result")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>opfuse batch: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th[data-sort] {{ cursor: pointer; background: #f3f3f3; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.ok {{ color: #1a7f37; }} .bad {{ color: #cf222e; }}
</style></head><body>
<h1>opfuse batch</h1>
<p>{meta}</p>
<h2>Models per status (each model's latest record)</h2>
<table id="counts"><tr>{count_head}</tr><tr>{count_row}</tr></table>
<h2>Models</h2>
<p>Click a column head to sort.</p>
<table id="models"><thead><tr>
<th data-sort="text">model</th><th data-sort="text">status</th>
<th data-sort="num">nodes before</th><th data-sort="num">nodes after</th>
<th data-sort="num">nodes removed</th><th data-sort="num">latency ratio</th>
<th data-sort="num">seconds</th><th>reports</th><th>error</th>
</tr></thead><tbody>
{rows}
</tbody></table>
<script>
document.querySelectorAll("#models th[data-sort]").forEach((th, col) => {{
  th.addEventListener("click", () => {{
    const body = document.querySelector("#models tbody");
    const num = th.dataset.sort === "num";
    const down = th.dataset.dir !== "down";
    th.dataset.dir = down ? "down" : "up";
    const key = (row) => {{
      const text = row.children[col].dataset.value ?? row.children[col].textContent;
      return num ? (text === "" ? -Infinity : parseFloat(text)) : text;
    }};
    [...body.rows]
      .sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (down ? -1 : 1))
      .forEach((row) => body.appendChild(row));
  }});
}});
</script>
</body></html>
"""


def _num(value: Any, fmt: str = "{}", title: str = "") -> str:
    if value is None:
        return '<td class="num" data-value=""></td>'
    hover = f' title="{html.escape(title)}"' if title else ""
    return f'<td class="num" data-value="{value}"{hover}>{html.escape(fmt.format(value))}</td>'


def _timed_on(record: dict[str, Any]) -> str:
    """``timed on inputs x[1,3,224,224] (generated)``: what the latency ratio was timed on."""
    fed = record.get("latency_inputs")
    if not isinstance(fed, dict):
        return ""
    shapes = ", ".join(
        f"{k}[{','.join(map(str, v))}]" for k, v in (fed.get("shapes") or {}).items()
    )
    return f"timed on inputs {shapes} ({'generated' if fed.get('generated') else fed.get('npz')})"


def _links(record: dict[str, Any]) -> str:
    """Links to the model's reports (their paths are relative to OUTDIR, as the page)."""
    reports = record.get("reports") or {}
    links = [
        f'<a href="{html.escape(reports[kind])}">{kind.replace("_", " ")}</a>'
        for kind in REPORT_ORDER
        if kind in reports
    ]
    return " ".join(links)


def _row(record: dict[str, Any]) -> str:
    before, after = record.get("nodes_before"), record.get("nodes_after")
    removed = before - after if before is not None and after is not None else None
    status = record["status"]
    return (
        f"<tr><td>{html.escape(record['relpath'])}</td>"
        f'<td class="{"ok" if status == "ok" else "bad"}">{html.escape(status)}</td>'
        f"{_num(before)}{_num(after)}{_num(removed)}"
        f"{_num(record.get('latency_ratio'), '{:.3f}', _timed_on(record))}"
        f"{_num(record.get('seconds'), '{:.1f}')}"
        f"<td>{_links(record)}</td>"
        f"<td>{html.escape(record.get('error') or '')}</td></tr>"
    )


def render_summary_html(outdir: Path, records: list[dict[str, Any]], summary: dict) -> str:
    counts = dict(summary["status"], skipped=summary["skipped"])
    meta = (
        f"{summary['models']} models, engine {summary['engine']}, "
        f"{summary['ran']} run in {summary['seconds']:.1f} s, {summary['skipped']} skipped "
        "(done before with the same file and options)"
        + (", interrupted" if summary["interrupted"] else "")
    )
    return PAGE.format(
        title=html.escape(str(outdir)),
        meta=html.escape(meta),
        count_head="".join(f"<th>{html.escape(k)}</th>" for k in counts),
        count_row="".join(f'<td class="num">{v}</td>' for v in counts.values()),
        rows="\n".join(_row(r) for r in records),
    )


def write_summary_html(outdir: Path, records: list[dict[str, Any]], summary: dict) -> Path:
    page = render_summary_html(outdir, records, summary)
    return write_text(outdir / SUMMARY, page, what="the batch summary")


def summary_json(records: list[dict[str, Any]], summary: dict) -> str:
    return json.dumps({"summary": summary, "records": records}, indent=2) + "\n"
