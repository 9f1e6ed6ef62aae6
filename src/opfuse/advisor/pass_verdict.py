"""What opfuse says about one recommendation, the ``opfuse`` entry of every report row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """``pass_name``: the pass that would apply the recommendation (None: none does);
    ``available``: this opfuse has it; ``fires``: it applies to this model (None: not
    tried); ``reason``: why not, or what the pass leaves to the backend."""

    pass_name: str | None
    available: bool
    fires: bool | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "pass": self.pass_name,
            "available": self.available,
            "fires": self.fires,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Verdict:
        fires, reason = data.get("fires"), data.get("reason")
        return cls(
            pass_name=str(data["pass"]) if data.get("pass") is not None else None,
            available=bool(data["available"]),
            fires=fires if isinstance(fires, bool) else None,
            reason=str(reason) if reason is not None else None,
        )
