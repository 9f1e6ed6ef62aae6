"""Verification results as text a user can act on: the bound applied to every output and
how much of it the worst element used, the inputs it ran on, and on failure what to try."""

from __future__ import annotations

from opfuse.verification.compare import OutputDiff, VerifyReport


def share(o: OutputDiff) -> str:
    """How much of its bound the worst element used: ``23%``."""
    if not o.ok and o.detail:
        return "-"
    if o.used >= 10:
        return f"{o.used:.0f}x"
    return f"{o.used:.1%}" if o.used < 0.1 else f"{o.used:.0%}"


def bound_text(o: OutputDiff, rtol: float) -> str:
    """The bound applied to every element: ``1e-05 + 1e-04*|ref|`` (atol already scaled)."""
    if o.detail and not o.abs_bound:
        return "exact" if "exact dtype" in o.detail else "-"
    return f"{o.abs_bound:.3g} + {rtol:.3g}*|ref|"


def output_line(o: OutputDiff, rtol: float) -> str:
    if o.detail and not o.abs_bound:
        return f"output {o.name!r} {o.detail}"
    verdict = "ok" if o.ok else "DIFFERS"
    if o.ok and o.detail:  # passed the float64 judge (opfuse.verification.tolerance)
        verdict = f"ok, {o.detail}"
    return (
        f"output {o.name!r}: max abs error {o.max_abs:.3g} (relative {o.max_rel:.3g}); "
        f"bound {bound_text(o, rtol)}; worst element at {share(o)} of its bound: {verdict}"
    )


def inputs_text(report: VerifyReport) -> str:
    """``x[1,3,224,224] (seed 0)``: what both models ran on."""
    shapes = ", ".join(f"{k}[{','.join(map(str, v))}]" for k, v in report.input_shapes.items())
    origin = f"seed {report.seed}" if report.seed is not None else "from the .npz"
    return f"{shapes or 'no inputs'} ({origin})"


def worst_share(report: VerifyReport) -> str:
    worst = max(report.outputs, key=lambda o: o.used, default=None)
    return f"worst element at {share(worst)} of its bound" if worst else "no outputs"


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
