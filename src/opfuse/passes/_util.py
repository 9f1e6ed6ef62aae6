"""Small facts about values that many rules ask."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import onnx_ir as ir


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dim is a known integer, else None."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(isinstance(d, int) for d in dims):
        return tuple(int(d) for d in dims)  # type: ignore[arg-type]
    return None


def rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    a = node.attributes.get(name)
    return default if a is None else a.value


def float_key(value: float) -> bytes:
    """A float attribute as a dict key: -0.0 and 0.0 differ; NaN equals the same NaN."""
    return struct.pack("<d", value)


def scalar_value(array: np.ndarray) -> float | None:
    """The single value of an array whose elements are all equal, else None."""
    if array.size == 0:
        return None
    flat = array.reshape(-1)
    first = flat[0]
    return float(first) if np.all(flat == first) else None
