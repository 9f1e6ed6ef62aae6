"""``opfuse passes``: every pass in execution order (the registry), as a table, JSON or
the markdown of docs/PASSES.md."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from opfuse.cli.console import out
from opfuse.cli.options import format_option
from opfuse.errors import EXIT_STATUSES

if TYPE_CHECKING:
    from opfuse.rewrite.registry import PassInfo


@click.command(epilog=EXIT_STATUSES)
@format_option("A table, JSON, or the markdown of docs/PASSES.md.", "table", "json", "markdown")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Every column (section, mandatory, opset, patterns) and the whole description.",
)
def passes(fmt: str, verbose: bool) -> None:
    """List every pass in execution order: switch name, default, what it does."""
    from opfuse.rewrite.registry import markdown_table
    from opfuse.rules import all_passes

    infos = all_passes()
    if fmt == "markdown":
        click.echo(markdown_table(infos), nl=False)
        return
    if fmt == "json":
        rows = [
            {
                "name": p.name,
                "section": p.section,
                "default": "on" if p.default else "off",
                "mandatory": p.mandatory,
                "opset": p.opset_range,
                "description": p.description,
                "note": p.note,
                "patterns": [r.name for r in p.rules],
            }
            for p in infos
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    if verbose:
        _verbose(infos)
        return
    # the summary is the column a user reads: it folds onto more lines, never truncated
    table = Table(expand=False)
    table.add_column("pass", no_wrap=True, min_width=max(len(p.name) for p in infos))
    table.add_column("default", no_wrap=True)
    table.add_column("summary", ratio=1, overflow="fold")
    for p in infos:
        table.add_row(
            p.name, ("on" if p.default else "off") + ("*" if p.mandatory else ""), p.summary
        )
    out.print(table)
    out.print(
        "* mandatory (always runs). opfuse passes --verbose: every field and the whole description",
        markup=False,
    )


def _verbose(infos: list[PassInfo]) -> None:
    """One block per pass: its name and settings on the first line, then its description and
    patterns folded to the console's width under it."""
    for p in infos:
        head = Text(p.name, style="bold")
        head.append(
            f"  {'on' if p.default else 'off'}{' (mandatory)' if p.mandatory else ''}"
            f"  section {p.section}  opset {p.opset_range}"
        )
        out.print(head)
        desc = p.description + (f" ({p.note})" if p.note else "")
        patterns = ", ".join(r.name for r in p.rules) or "(graph pass)"
        out.print(Padding(Text(desc, overflow="fold"), (0, 0, 0, 4), expand=False))
        out.print(
            Padding(Text(f"patterns: {patterns}", overflow="fold"), (0, 0, 0, 4), expand=False)
        )
