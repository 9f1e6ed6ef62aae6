"""Editing a graph in place, for whole-graph passes (the worklist driver commits a
rule's ``Builder`` the same way)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite.builder import NameScope


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Every use of ``old`` reads ``new``; a graph output keeps its name (callers feed
    and read a model by name), so ``new`` takes it."""
    if old.is_graph_output():
        name, old.name = old.name, None
        new.name = name
    old.replace_all_uses_with(new, replace_graph_outputs=True)


def add_initializer(graph: ir.Graph, names: NameScope, array: np.ndarray, base: str) -> ir.Value:
    """A new initializer of ``graph`` holding ``array``, under a fresh name from ``base``."""
    tensor = ir.tensor(array)
    value = ir.Value(name=names.value(base), const_value=tensor)
    tensor.name = value.name
    value.type = ir.TensorType(tensor.dtype)
    value.shape = ir.Shape(array.shape)
    graph.register_initializer(value)
    return value
