"""The rewrite engine: patterns, rules, and the worklist driver that applies them."""

from opfuse.rewrite.builder import Builder
from opfuse.rewrite.context import Options, PassContext
from opfuse.rewrite.passinfo import PassInfo
from opfuse.rewrite.pattern import Const, Match, Op, Optional, Or, Var
from opfuse.rewrite.rule import Rule

__all__ = [
    "Builder",
    "Const",
    "Match",
    "Op",
    "Optional",
    "Options",
    "Or",
    "PassContext",
    "PassInfo",
    "Rule",
    "Var",
]
