"""Pass metadata: the one source for the CLI's pass table, switch files and docs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from opfuse.rewrite.context import PassContext
    from opfuse.rewrite.rule import Rule

Section = Literal["GraphFusion", "UBFusion"]
GraphFunction = Callable[["PassContext"], None]


@dataclass(frozen=True)
class PassInfo:
    """One switchable pass.

    A pass is either a list of rules (run together by the worklist driver) or a function
    over the whole graph (``run``), for what is not a local pattern (dead-code removal,
    layout propagation). ``run`` records its effect counts on the context itself.
    """

    name: str
    description: str
    section: Section = "GraphFusion"
    default: bool = True
    mandatory: bool = False
    opset_min: int = 1
    opset_max: int | None = None
    rules: Sequence[Rule] = field(default_factory=tuple)
    run: GraphFunction | None = None
    note: str = ""  # documented caveat (why it is off by default, thresholds)

    def __post_init__(self) -> None:
        if not (self.name[:1].isupper() and self.name.endswith("FusionPass")):
            raise ValueError(f"pass name {self.name!r} must be CamelCase ending in FusionPass")
        if bool(self.rules) == (self.run is not None):
            raise ValueError(f"pass {self.name} needs exactly one of rules or run")

    @property
    def opset_range(self) -> str:
        return f"{self.opset_min}-{self.opset_max if self.opset_max else ''}"

    def applies_to_opset(self, opset: int) -> bool:
        return self.opset_min <= opset and (self.opset_max is None or opset <= self.opset_max)


_PASSES: dict[str, PassInfo] = {}


def register(info: PassInfo) -> PassInfo:
    """Add a pass; registration order is execution order."""
    if info.name in _PASSES:
        raise ValueError(f"pass {info.name} registered twice")
    _PASSES[info.name] = info
    return info


def all_passes() -> list[PassInfo]:
    import opfuse.passes  # noqa: F401  (registers every pass module)

    return list(_PASSES.values())


def get_pass(name: str) -> PassInfo:
    all_passes()
    return _PASSES[name]
