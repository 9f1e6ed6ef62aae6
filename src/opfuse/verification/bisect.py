"""Which pass broke a verification: re-run the optimizer with a suffix of the passes that
fired switched off, a binary search over their execution order."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def first_bad_pass(fired: Sequence[str], fails: Callable[[list[str]], bool]) -> str | None:
    """The first pass of ``fired`` (execution order) whose output fails verification.

    ``fails(disabled)`` re-runs the optimizer with the passes ``disabled`` switched off
    and says whether verification still fails. With the passes ``fired[:k]`` on and the
    rest off, the shortest failing prefix ends with the culprit; about log2(n) + 1 re-runs.
    None when the failure stays with every pass of ``fired`` off (no single pass of them
    is to blame: a mandatory pass, or the model itself).
    """
    if not fired or fails(list(fired)):
        return None
    good, bad = 0, len(fired)  # fired[:good] verifies; fired[:bad] fails (the full run)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fails(list(fired[mid:])):
            bad = mid
        else:
            good = mid
    return fired[bad - 1]
