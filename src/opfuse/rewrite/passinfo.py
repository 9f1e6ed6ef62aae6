"""A pass as the engine runs it: rules for the worklist driver, or a function over the
whole graph. ``opfuse.rewrite.registry`` keeps the table of the registered ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from opfuse.rewrite.context import PassContext
from opfuse.rewrite.rule import Rule

Section = Literal["GraphFusion", "UBFusion"]
GraphFunction = Callable[[PassContext], None]
Change = Literal["rewrites", "removals", "shapes"]
# rewrites: nodes added, replaced or rewired; removals: nodes or initializers nothing
# reads taken out; shapes: shape inference told more of a value's type or shape
CHANGES: frozenset[Change] = frozenset(("rewrites", "removals", "shapes"))


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
    # what a later round must have seen change for this pass to find anything again
    # (pipeline.rounds skips it otherwise); "removes" only: its own effects are removals
    reads: frozenset[Change] = CHANGES
    removes_only: bool = False
    # a graph pass whose one run leaves nothing for a second run of it (rule passes are
    # never taken as complete: a rewrite can enable a match the worklist does not revisit)
    complete: bool = False

    def __post_init__(self) -> None:
        if not (self.name[:1].isupper() and self.name.endswith("FusionPass")):
            raise ValueError(f"pass name {self.name!r} must be CamelCase ending in FusionPass")
        if bool(self.rules) == (self.run is not None):
            raise ValueError(f"pass {self.name} needs exactly one of rules or run")

    @property
    def summary(self) -> str:
        """The description's first clause, at most about 70 characters (``passes``)."""
        text = self.description
        for stop in ("; ", " (", ": "):
            text = text.split(stop, 1)[0]
        if len(text) > 72:
            text = text[:70].rsplit(" ", 1)[0] + " ..."
        return text

    @property
    def opset_range(self) -> str:
        """``7-17``, or ``23+`` for 23 and later."""
        if self.opset_max is None:
            return f"{self.opset_min}+"
        return f"{self.opset_min}-{self.opset_max}"

    def applies_to_opset(self, opset: int) -> bool:
        return self.opset_min <= opset and (self.opset_max is None or opset <= self.opset_max)
