"""Editing a graph in place, for whole-graph passes (the worklist driver commits a
rule's ``Builder`` the same way)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


class GraphEditor:
    """New values, constants and nodes for a pass that edits one graph in place (rules
    build with a ``Builder`` and the driver commits; a whole-graph pass edits directly).
    Names are fresh across the model; a value without a base name gets ``stem``."""

    def __init__(self, graph: ir.Graph, names: NameScope, stem: str = "value") -> None:
        self.graph = graph
        self.names = names
        self.stem = stem

    def value(self, base: str | None, like: ir.Value | None = None) -> ir.Value:
        """A new value named after ``base``, of ``like``'s dtype."""
        value = ir.Value(name=self.names.value(base or self.stem))
        if like is not None and like.dtype is not None:
            value.dtype = like.dtype
        return value

    def const(self, array: np.ndarray, base: str) -> ir.Value:
        return add_initializer(self.graph, self.names, array, base)

    def node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Iterable[ir.Attr] = (),
        *,
        outputs: Sequence[ir.Value],
        name: str | None,
        domain: str = "",
        like: ir.Node | None = None,
    ) -> ir.Node:
        """A node (not inserted) making ``outputs``; ``like``: a node whose doc string and
        metadata it keeps."""
        node = ir.Node(domain, op_type, inputs, attributes, outputs=outputs, name=name)
        if like is not None:
            node.doc_string = like.doc_string
            node.metadata_props.update(like.metadata_props)
        return node

    def fresh_node_name(self, base: str) -> str:
        return self.names.node(base)
