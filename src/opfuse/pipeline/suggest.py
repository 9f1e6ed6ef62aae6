"""Typo suggestions by similarity over whole names, abbreviations included:
``ConvBNFusionPass`` is closest to ``ConvBatchNormFusionPass`` (BN: Batch Norm)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
CUTOFF = 0.6


def spellings(name: str) -> set[str]:
    """``name`` lowercased, and with every run of two or more CamelCase words written as
    their initials (ConvBatchNormFusionPass: convbnfusionpass, convbatchnormfp, ...)."""
    words = WORD.findall(name) or [name]
    found = {name.lower()}
    for i in range(len(words)):
        for j in range(i + 2, len(words) + 1):
            initials = "".join(w[0] for w in words[i:j])
            found.add("".join(words[:i] + [initials] + words[j:]).lower())
    return found


def similarity(typed: str, known: str) -> float:
    """How close ``typed`` is to ``known`` or one of its abbreviated spellings (0 to 1)."""
    typed = typed.lower()
    return max(difflib.SequenceMatcher(None, typed, s).ratio() for s in spellings(known))


def closest(typed: str, known: Iterable[str]) -> str | None:
    """The known name most similar to ``typed``, when similar enough to suggest."""
    scored = [(similarity(typed, k), k) for k in known]
    best = max(scored, default=(0.0, ""))
    return best[1] if best[0] >= CUTOFF else None
