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


def _producer_op(value: ir.Value | None) -> ir.Node | None:
    return None if value is None else value.producer()


def _times_act_sum(node: ir.Node) -> bool:
    """``Mul(x, Add(Erf|Tanh(...), c))``: the product at the heart of a GELU."""
    if node.op_type != "Mul":
        return False
    for value in node.inputs:
        add = _producer_op(value)
        if add is not None and add.op_type == "Add":
            for term in add.inputs:
                act = _producer_op(term)
                if act is not None and act.op_type in ("Erf", "Tanh"):
                    return True
    return False


def gelu_product(mul: ir.Node) -> bool:
    """Whether ``mul`` is one of the Muls of ``0.5 * x * (1 + Erf|Tanh(...))``, which
    onnxruntime fuses into one Gelu kernel: folding its constant into a neighbour (a
    MatMul's weight) would break that fusion."""
    if _times_act_sum(mul):
        return True
    return any((p := _producer_op(v)) is not None and _times_act_sum(p) for v in mul.inputs)
