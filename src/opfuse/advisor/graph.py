"""A light view of the analysed graph for grouping: nodes in topological order, their data
inputs (constants left out), producers, consumers and shapes. Built from an onnx_ir model,
or, for an Ascend op_summary CSV without a model, as a chain in execution order."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from opfuse.model.graphs import DEFAULT_DOMAINS

Shape = tuple[int | None, ...]


@dataclass
class GNode:
    index: int
    name: str
    op_type: str
    inputs: list[str]  # non-constant inputs
    outputs: list[str]
    const_inputs: list[str] = field(default_factory=list)
    attrs: dict[str, object] = field(default_factory=dict)


@dataclass
class OpGraph:
    nodes: list[GNode]
    graph_inputs: list[str]
    graph_outputs: set[str]
    shapes: dict[str, Shape] = field(default_factory=dict)
    itemsize: dict[str, int] = field(default_factory=dict)
    chain: bool = False  # edges assumed from execution order (no model given)
    scalars: dict[str, float] = field(default_factory=dict)  # one-element constants

    def __post_init__(self) -> None:
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        self.by_name: dict[str, int] = {}
        for node in self.nodes:
            self.by_name.setdefault(node.name, node.index)
            for t in node.outputs:
                self.producer[t] = node.index
            for t in dict.fromkeys(node.inputs):
                self.consumers.setdefault(t, []).append(node.index)

    def tensor_bytes(self, name: str, default_itemsize: int = 4) -> int | None:
        shape = self.shapes.get(name)
        if shape is None or any(d is None for d in shape):
            return None
        dims = [int(d) for d in shape if d is not None]
        return int(np.prod(dims, dtype=np.int64)) * self.itemsize.get(name, default_itemsize)


def _shape(value: ir.Value) -> Shape | None:
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape)


def _attrs(node: ir.Node) -> dict[str, object]:
    wanted = ("group", "kernel_shape", "coordinate_transformation_mode", "mode", "transA")
    return {k: node.attributes[k].value for k in wanted if k in node.attributes}


def from_model(model: ir.Model) -> OpGraph:
    """The main graph; Constant nodes and constant inputs are not part of any group."""
    graph = model.graph
    constants = set(graph.initializers)
    nodes: list[GNode] = []
    shapes: dict[str, Shape] = {}
    itemsize: dict[str, int] = {}

    def note(value: ir.Value) -> None:
        shape = _shape(value)
        if value.name and shape is not None:
            shapes[value.name] = shape
        if value.name and value.dtype is not None:
            with contextlib.suppress(Exception):  # string and other non-numeric types
                itemsize[value.name] = int(value.dtype.itemsize)

    scalars: dict[str, float] = {}

    def scalar(name: str, tensor: ir.TensorProtocol | None) -> None:
        with contextlib.suppress(Exception):  # strings, sparse or external data
            assert tensor is not None
            array = tensor.numpy()
            if array.size == 1 and array.dtype.kind in "fiu":
                scalars[name] = float(array.reshape(()))

    for value in graph.inputs:
        note(value)
    for value in graph.initializers.values():
        note(value)
        if value.name and value.const_value is not None:
            scalar(value.name, value.const_value)
    for node in graph:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            constants.update(o.name for o in node.outputs if o.name)
            if "value" in node.attributes and node.outputs[0].name:
                scalar(node.outputs[0].name, node.attributes["value"].value)
            continue
        data = [v.name for v in node.inputs if v is not None and v.name and v.name not in constants]
        consts = [v.name for v in node.inputs if v is not None and v.name in constants]
        for v in (*node.inputs, *node.outputs):
            if v is not None:
                note(v)
        nodes.append(
            GNode(
                len(nodes),
                node.name or f"{node.op_type}_{len(nodes)}",
                node.op_type,
                data,
                [o.name for o in node.outputs if o.name],
                consts,
                _attrs(node),
            )
        )
    return OpGraph(
        nodes,
        [v.name for v in graph.inputs if v.name and v.name not in constants],
        {v.name for v in graph.outputs if v.name},
        shapes,
        itemsize,
        scalars=scalars,
    )


def from_chain(names: Sequence[str], op_types: Sequence[str]) -> OpGraph:
    """Operators in execution order, each assumed to feed the next (no edges known)."""
    nodes = [
        GNode(i, name, op, [f"t{i - 1}"] if i else ["input"], [f"t{i}"])
        for i, (name, op) in enumerate(zip(names, op_types, strict=True))
    ]
    return OpGraph(nodes, ["input"], {f"t{len(nodes) - 1}"} if nodes else set(), chain=True)
