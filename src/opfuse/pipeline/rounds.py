"""Which stages of passes a round must run again.

Rounds repeat every stage until nothing changes, so the last round mostly confirms the
fixpoint. A stage that left nothing to do for itself (it changed nothing, or it is a
graph pass declared ``complete``) and has seen no change of a kind it ``reads`` since
then would find nothing again, and is skipped: on a 40,000-node transformer stack the
confirming round skips dead-code removal, whose last run was followed only by shape
refinements (which it does not read) and a common-subexpression run that changed nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from opfuse.rewrite.passinfo import CHANGES, Change, PassInfo


@dataclass
class ChangeClock:
    """Counts of each kind of change so far, and what each stage had seen at its end."""

    counts: dict[Change, int] = field(default_factory=lambda: dict.fromkeys(CHANGES, 0))
    _seen: dict[str, tuple[dict[Change, int], bool]] = field(default_factory=dict)

    def record(self, kind: Change, n: int) -> None:
        self.counts[kind] += n

    def ran(self, label: str, stage: Sequence[PassInfo], effected: int) -> None:
        """``stage`` (named ``label``) has run and made ``effected`` changes."""
        if effected:
            self.record("removals" if all(p.removes_only for p in stage) else "rewrites", effected)
        settled = effected == 0 or all(p.complete for p in stage)
        self._seen[label] = (dict(self.counts), settled)

    def must_run(self, label: str, stage: Sequence[PassInfo]) -> bool:
        seen = self._seen.get(label)
        if seen is None:
            return True
        counts, settled = seen
        if not settled:
            return True
        reads = frozenset().union(*(p.reads for p in stage))
        return any(self.counts[kind] != counts[kind] for kind in reads)
