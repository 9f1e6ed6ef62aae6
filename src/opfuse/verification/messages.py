"""Verification results as text a user can act on: the bound applied to every output and
how much of it the worst element used, the inputs it ran on, and on failure what to try."""

from __future__ import annotations

# the per-output text lives beside VerifyReport (its summary() uses it); said here too
from opfuse.verification.compare import (
    VerifyReport,
    bound_text,
    inputs_text,
    share,
)
from opfuse.verification.compare import output_line as output_line


def worst_share(report: VerifyReport) -> str:
    worst = max(report.outputs, key=lambda o: o.used, default=None)
    if worst is None:
        return "no outputs"
    why = f": ok, {worst.detail}" if worst.ok and worst.detail and worst.used > 1 else ""
    return f"worst element at {share(worst)} of its bound{why}"


def failure_message(
    report: VerifyReport,
    culprit: str | None = None,
    searched: bool = False,
    saved: str | None = None,
) -> str:
    """One line: which outputs differ and by how much against which bound, on which
    inputs, the first pass to blame with the ``--disable`` to try, where the inputs went."""
    parts = []
    for o in report.outputs:
        if o.ok:
            continue
        if o.detail:
            parts.append(f"output {o.name!r} {o.detail}")
        else:
            parts.append(
                f"output {o.name!r} differs by {o.max_abs:.3g} (relative {o.max_rel:.3g}), "
                f"{share(o)} of its bound {bound_text(o, report.rtol)}"
            )
    text = "; ".join(parts) + f"; inputs {inputs_text(report)}"
    if culprit:
        text += f"; the first pass whose output differs is {culprit}: try --disable {culprit}"
    elif searched:
        text += "; the difference stays with every optional pass that fired switched off"
    if saved:
        text += f"; inputs saved to {saved}"
    return text
