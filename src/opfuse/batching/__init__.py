"""``opfuse batch``: many models optimized (verified, advised), each in an isolated task,
on this machine's worker processes or on a Ray cluster. See docs/BATCH.md."""

from opfuse.batching.runner import batch

__all__ = ["batch"]
