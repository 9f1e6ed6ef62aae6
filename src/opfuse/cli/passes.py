"""``opfuse passes``: every pass in execution order (the registry), as a table, JSON or
the markdown of docs/PASSES.md."""

from __future__ import annotations

import json

import click
from rich.table import Table

from opfuse.cli.console import out
from opfuse.errors import EXIT_STATUSES


@click.command(epilog=EXIT_STATUSES)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "markdown"]),
    default="table",
    show_default=True,
    help="A table, JSON, or the markdown of docs/PASSES.md.",
)
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
    table = Table()
    table.add_column("pass", no_wrap=True, min_width=max(len(p.name) for p in infos))
    table.add_column("default", no_wrap=True, min_width=3 if verbose else len("on (mandatory)"))
    if verbose:
        for col in ("section", "mandatory", "opset", "patterns"):
            table.add_column(col)
        table.add_column("description", ratio=1)
    else:
        table.add_column("summary", no_wrap=True, overflow="ellipsis")
    for p in infos:
        if verbose:
            desc = p.description + (f" ({p.note})" if p.note else "")
            patterns = ", ".join(r.name for r in p.rules) or "(graph pass)"
            table.add_row(
                p.name,
                "on" if p.default else "off",
                p.section,
                "yes" if p.mandatory else "",
                p.opset_range,
                patterns,
                desc,
            )
        else:
            mandatory = " (mandatory)" if p.mandatory else ""
            table.add_row(p.name, ("on" if p.default else "off") + mandatory, p.summary)
    out.print(table)
    if not verbose:
        out.print("opfuse passes --verbose: every column and the whole description")
