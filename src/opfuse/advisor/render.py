"""The advisor report's renderers, one per section and format, in one table the text and
HTML reports share: to add a section, add its dataclass (report_types.py), build it in
sections.py, and list its two renderers here (report.py's ``*_text``, html.py's
``*_html``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console

from opfuse.advisor import html, report
from opfuse.advisor.report_types import AdviceReport


@dataclass(frozen=True)
class SectionRenderer:
    key: str  # the section's id (the HTML page's anchor where it has a title)
    text: Callable[[AdviceReport, Console, int], None]  # prints on the console
    html: Callable[[AdviceReport, int], list[str]]  # the page's lines ([]: nothing)


# the report's order: a quantized model's findings first, then what to do, then why
SECTIONS = (
    SectionRenderer("header", report.header_text, html.header_html),
    SectionRenderer("quantized", report.quantized_text, html.quantized_html),
    SectionRenderer("steps", report.steps_text, html.steps_html),
    SectionRenderer("ub", report.ub_text, html.ub_html),
    SectionRenderer("time", report.time_text, html.time_html),
    SectionRenderer("aipp", report.aipp_text, html.aipp_html),
    SectionRenderer("l2", report.l2_text, html.l2_html),
    SectionRenderer("hints", report.hints_text, html.hints_html),
    SectionRenderer("passes", report.passes_text, html.passes_html),
)


def render_text(advice: AdviceReport, console: Console, top: int = 10) -> None:
    """The text report on ``console``, ``top`` entries per list."""
    for section in SECTIONS:
        section.text(advice, console, top)


def render_html(advice: AdviceReport, top: int = 10) -> str:
    """One self-contained HTML page, ``top`` entries per list."""
    return html.page(advice, [line for s in SECTIONS for line in s.html(advice, top)])
