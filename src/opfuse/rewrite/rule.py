"""A rule: a pattern rooted at a node of given op types, a check that says why it cannot
fire, and a rewrite that builds the replacement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Generic, TypeVar, cast

import onnx_ir as ir

from opfuse.rewrite.builder import Builder
from opfuse.rewrite.context import PassContext
from opfuse.rewrite.pattern import Match, Op, Or

Replacement = Sequence[ir.Value | None] | Mapping[ir.Value, ir.Value]
M = TypeVar("M", bound=Match)


class Rule(Generic[M]):
    """Subclasses set ``name`` (the pattern name in the effect log) and ``pattern``, or
    override ``match`` for what a pattern cannot say (say why in a comment).

    What ``check`` computes for ``rewrite`` lives in a declared field of a ``Match``
    subclass: the rule is ``Rule[MyMatch]`` and sets ``match_type = MyMatch`` (a rule never
    hangs attributes on a match).

    The driver checks, for every rule, that each matched node other than the root feeds
    only the match and is not a graph output, that float constants have the root's dtype,
    and that the names in ``constants`` are bound to constant tensors (so a ``Var`` there
    yields the reason "... is not a constant" rather than no match). Rules that keep
    intermediate nodes alive set ``exclusive = False``. docs/WRITING_A_RULE.md has the
    whole contract and a worked example.
    """

    # name and pattern: class attributes, or set by __init__ for a rule made per op type
    name: str
    pattern: Op | Or | None = None
    roots: ClassVar[tuple[str, ...]] = ()  # defaults to the pattern's op types
    exclusive: ClassVar[bool] = True
    constants: ClassVar[tuple[str, ...]] = ()  # bound names that must be constant tensors
    match_type: type[Match] = Match  # the class ``match`` builds: M

    def root_types(self) -> tuple[str, ...]:
        if self.roots:
            return self.roots
        assert self.pattern is not None, f"{type(self).__name__} needs a pattern or roots"
        return self.pattern.op_types

    def match(self, node: ir.Node, ctx: PassContext) -> M | None:
        assert self.pattern is not None
        if not self.pattern.could_match(node):
            return None
        m = cast(M, self.match_type(node))
        return m if self.pattern.match_node(node, m) else None

    def check(self, m: M, ctx: PassContext) -> str | None:
        """Return why the rewrite cannot be applied, or None when it can."""
        return None

    def rewrite(self, m: M, b: Builder, ctx: PassContext) -> Replacement:
        """Build the replacement; return new values for the root's outputs, in order
        (None for an output nothing uses), or a mapping old value -> new value."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
