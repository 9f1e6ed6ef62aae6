"""opfuse: operator-fusion optimizer and advisor for ONNX inference models."""

__version__ = "0.1.0"
