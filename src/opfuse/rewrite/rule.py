"""A rule: a pattern rooted at one op type, a check that says why it cannot fire, and a
rewrite that builds the replacement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import onnx_ir as ir

from opfuse.rewrite.builder import Builder
from opfuse.rewrite.context import PassContext
from opfuse.rewrite.pattern import Match, Op

Replacement = Sequence[ir.Value | None] | Mapping[ir.Value, ir.Value]


class Rule:
    """Subclasses set ``name`` (the pattern name in the effect log) and ``pattern``, or
    override ``match`` for what a tree pattern cannot say.

    The driver checks, for every rule, that each matched node other than the root feeds
    only the match and is not a graph output, and that float constants have the root's
    dtype, and that the names in ``constants`` are bound to constant tensors (so a
    ``Var`` there yields the reason "... is not a constant" rather than no match). Rules that keep intermediate nodes alive set ``exclusive = False``.
    """

    name: ClassVar[str]
    pattern: ClassVar[Op | None] = None
    roots: ClassVar[tuple[str, ...]] = ()  # defaults to the pattern's op types
    exclusive: ClassVar[bool] = True
    constants: ClassVar[tuple[str, ...]] = ()  # bound names that must be constant tensors

    def root_types(self) -> tuple[str, ...]:
        if self.roots:
            return self.roots
        assert self.pattern is not None, f"{type(self).__name__} needs a pattern or roots"
        return self.pattern.op_types

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        assert self.pattern is not None
        m = Match(node)
        return m if self.pattern.match_node(node, m) else None

    def check(self, m: Match, ctx: PassContext) -> str | None:
        """Return why the rewrite cannot be applied, or None when it can."""
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext) -> Replacement:
        """Build the replacement; return new values for the root's outputs, in order
        (None for an output nothing uses), or a mapping old value -> new value."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
