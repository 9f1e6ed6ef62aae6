"""opfuse: operator-fusion optimizer and advisor for ONNX inference models."""

__version__ = "0.1.0"


def batch(inputs, outdir, **kwargs):  # type: ignore[no-untyped-def]
    """Optimize many models, each in its own worker process; see opfuse.batching.batch."""
    from opfuse.batching import batch as run

    return run(inputs, outdir, **kwargs)
