"""Per-pattern effect counts and check-failure reasons, printed as CANN prints them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypedDict

MAX_EXAMPLES = 5
SECTION_LOG_NAME = {"GraphFusion": "GraphFusionPass", "UBFusion": "UBFusionPass"}
SECTION_RESULT_KEY = {"GraphFusion": "graph_fusion", "UBFusion": "ub_fusion"}


# why a pass's pattern matched but did not fire, how often, at which nodes ("pass" is a
# keyword: the functional form)
Reason = TypedDict(
    "Reason", {"pass": str, "pattern": str, "reason": str, "count": int, "nodes": list[str]}
)


@dataclass
class PatternStats:
    pass_name: str
    section: str
    pattern: str
    matched: int = 0
    effected: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add_reason(self, reason: str, node_name: str | None) -> None:
        self.reasons[reason] += 1
        names = self.examples.setdefault(reason, [])
        if node_name and len(names) < MAX_EXAMPLES:
            names.append(node_name)

    def log_line(self) -> str:
        return (
            f"{SECTION_LOG_NAME[self.section]}[{self.pass_name}]: pattern={self.pattern}, "
            f"matched_times={self.matched}, effected_times={self.effected}."
        )


class EffectLog:
    """All pattern statistics of one optimize run, in execution order."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, str], PatternStats] = {}

    def entry(self, pass_name: str, section: str, pattern: str) -> PatternStats:
        key = (pass_name, pattern)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = PatternStats(pass_name, section, pattern)
        return stats

    def __iter__(self) -> Iterator[PatternStats]:
        return iter(self._stats.values())

    def lines(self) -> list[str]:
        return [s.log_line() for s in self._stats.values()]

    def effected(self, pass_name: str | None = None) -> int:
        return sum(s.effected for s in self if pass_name in (None, s.pass_name))

    def matched(self, pass_name: str | None = None) -> int:
        return sum(s.matched for s in self if pass_name in (None, s.pass_name))

    def fusion_result(self) -> dict[str, dict[str, dict[str, str]]]:
        """CANN's fusion_result.json shape; counts are strings as CANN writes them."""
        totals: dict[str, dict[str, list[int]]] = {"graph_fusion": {}, "ub_fusion": {}}
        for s in self:
            per_pass = totals[SECTION_RESULT_KEY[s.section]].setdefault(s.pass_name, [0, 0])
            per_pass[0] += s.matched
            per_pass[1] += s.effected
        return {
            section: {
                name: {"match_times": str(m), "effect_times": str(e)}
                for name, (m, e) in passes.items()
            }
            for section, passes in totals.items()
        }

    def reasons(self) -> list[Reason]:
        """Why patterns matched but did not fire: for the advisor and --log-level debug."""
        return [
            {
                "pass": s.pass_name,
                "pattern": s.pattern,
                "reason": reason,
                "count": count,
                "nodes": s.examples.get(reason, []),
            }
            for s in self
            for reason, count in s.reasons.most_common()
        ]
