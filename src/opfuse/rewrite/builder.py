"""Builds a rewrite's new nodes and constants without touching the graph.

The driver commits them only when the rewrite passes its checks, so a rule that gives
up halfway leaves the graph as it was. Beside the Builder, the helpers rules share to put
a value in place of the root's output (``forward``, ``needs_identity``), a folded constant
in place of an old one (``constant_value``), and to give back the pages of a large
external weight a fold has read (``drop_pages``).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from opfuse.model.constants import SHARED_CONSTANT_BYTES
from opfuse.rewrite.pattern import Match


class NameScope:
    """Fresh value and node names, unique across the whole model (subgraphs included).

    The model's names are collected at the first use: a pass that makes nothing never
    walks the model for them."""

    def __init__(self, graphs: Iterable[ir.Graph]) -> None:
        """``graphs``: every graph of the model (``PassContext.graphs()``)."""
        self._graphs = graphs

    @functools.cached_property
    def _names(self) -> tuple[set[str], set[str]]:
        """The model's value names and node names, in one walk."""
        values: set[str] = set()
        nodes: set[str] = set()
        for graph in self._graphs:
            values.update(v.name for v in graph.inputs if v.name)
            values.update(graph.initializers)
            for node in graph:
                if node.name:
                    nodes.add(node.name)
                values.update(v.name for v in node.outputs if v.name)
        return values, nodes

    @property
    def values(self) -> set[str]:
        return self._names[0]

    @property
    def nodes(self) -> set[str]:
        return self._names[1]

    def forget_node(self, name: str | None) -> None:
        """A removed node's name is free again (nothing to do before the first use)."""
        if "_names" in self.__dict__:
            self.nodes.discard(name or "")

    @staticmethod
    def _fresh(base: str, used: set[str]) -> str:
        name, i = base, 0
        while name in used:
            i += 1
            name = f"{base}_{i}"
        used.add(name)
        return name

    def value(self, base: str) -> str:
        return self._fresh(base, self.values)

    def node(self, base: str) -> str:
        return self._fresh(base, self.nodes)


ConstantKey = tuple[int, np.dtype, tuple[int, ...], bytes]


class SharedConstants:
    """One initializer per graph for the equal small constants rewrites make.

    A stack of identical blocks folds the same shape vectors and scalars in every block;
    common-subexpression elimination would merge the copies at the end of the round, so
    the pipeline shares them from the start when that pass is on (never otherwise: equal
    constants then stay apart). Numeric numpy dtypes only; equal means the same dtype,
    shape and bytes (0.0 and -0.0 stay apart)."""

    def __init__(self) -> None:
        self._values: dict[ConstantKey, ir.Value] = {}
        self.hits = 0  # copies not made: logged as CSE's duplicate_initializers

    @staticmethod
    def key(graph: ir.Graph | None, array: np.ndarray) -> ConstantKey | None:
        if graph is None or array.nbytes > SHARED_CONSTANT_BYTES or array.dtype.kind not in "biuf":
            return None
        return (id(graph), array.dtype, array.shape, array.tobytes())

    def get(self, key: ConstantKey, graph: ir.Graph) -> ir.Value | None:
        """The initializer made for ``key`` while it is still one of ``graph``'s."""
        value = self._values.get(key)
        return value if value is not None and value.graph is graph else None

    def remember(self, key: ConstantKey, value: ir.Value) -> None:
        """``value`` (an initializer just registered) holds the constant of ``key``."""
        self._values[key] = value


class Builder:
    def __init__(
        self, root: ir.Node, names: NameScope, shared: SharedConstants | None = None
    ) -> None:
        self.root = root
        self.names = names
        self.nodes: list[ir.Node] = []
        self.initializers: list[ir.Value] = []
        self.shared = shared
        # the shareable constants this rewrite made, remembered once it is committed, and
        # how many it took from ``shared`` instead of making them
        self.shareable: list[tuple[ConstantKey, ir.Value]] = []
        self.shared_hits = 0

    def op(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        num_outputs: int = 1,
        domain: str = "",
        like: ir.Node | None = None,
    ) -> ir.Value:
        """Add a node and return its first output (``outputs(...)`` for all of them).

        ``like``: a node whose name, doc string and metadata the new node keeps (the
        fused node takes the name of the node it replaces, as CANN does).
        """
        return self.node(
            op_type,
            inputs,
            attributes,
            name=name,
            num_outputs=num_outputs,
            domain=domain,
            like=like,
        ).outputs[0]

    def node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        num_outputs: int = 1,
        domain: str = "",
        like: ir.Node | None = None,
    ) -> ir.Node:
        if name is not None:
            base = name
        elif like is not None:
            base = like.name or ""  # an unnamed node stays unnamed
        else:
            base = f"{self.root.name}/{op_type}" if self.root.name else ""
        attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
        node = ir.node(
            op_type,
            list(inputs),
            attrs,
            domain=domain,
            num_outputs=num_outputs,
            name=base,  # made unique on commit, once the replaced nodes' names are free
        )
        if like is not None:
            node.doc_string = like.doc_string
            node.metadata_props.update(like.metadata_props)
        stem = base or f"{self.root.outputs[0].name or op_type}_{op_type}"
        for i, out in enumerate(node.outputs):
            out.name = self.names.value(f"{stem}_out{i}" if i else f"{stem}_out")
        self.nodes.append(node)
        return node

    def const_tensor(self, tensor: ir.TensorProtocol, name: str) -> ir.Value:
        """A new initializer holding ``tensor`` as it is (no copy into numpy)."""
        value = ir.Value(name=self.names.value(name), const_value=tensor)
        tensor.name = value.name
        value.type = ir.TensorType(tensor.dtype)
        value.shape = ir.Shape(tensor.shape.numpy())  # a tensor's dims are integers
        self.initializers.append(value)
        return value

    def const(self, array: np.ndarray | Iterable[Any], name: str, dtype: Any = None) -> ir.Value:
        """An initializer holding ``array``: a new one, or with ``shared`` the graph's
        initializer of an equal small constant a committed rewrite made."""
        arr = np.asarray(array, dtype=dtype)
        key = None
        if self.shared is not None and (key := self.shared.key(self.root.graph, arr)):
            assert self.root.graph is not None
            existing = self.shared.get(key, self.root.graph)
            if existing is not None:
                self.shared_hits += 1
                return existing
        # ir.Tensor directly: ir.tensor's Protocol isinstance checks cost 0.1 ms a call
        tensor = ir.tensor(arr) if arr.dtype.kind in "OSU" else ir.Tensor(arr)
        value = self.const_tensor(tensor, name)
        if key is not None:
            self.shareable.append((key, value))
        return value

    def committed(self) -> None:
        """The driver has put this rewrite into the graph: the shareable constants it
        made are the graph's now, and the ones it took count as copies not made."""
        if self.shared is not None:
            for key, value in self.shareable:
                self.shared.remember(key, value)
            self.shared.hits += self.shared_hits


def constant_value(array: np.ndarray, b: Builder, old: ir.Value, like: ir.Node) -> ir.Value:
    """A constant for ``old``: an initializer, or a Constant node when ``old`` is a graph
    output (a graph output cannot be an initializer)."""
    if old.is_graph_output():
        return b.op("Constant", [], {"value": ir.tensor(array)}, like=like)
    return b.const(array, old.name or "folded")


def needs_identity(x: ir.Value, root: ir.Node) -> bool:
    """Whether the root's output, a graph output, cannot simply become ``x``: x is a
    graph input, an initializer, another graph output, or a value of an enclosing graph
    (a graph's outputs must be made by its own nodes)."""
    if not root.outputs[0].is_graph_output():
        return False
    made_by = x.producer()
    return made_by is None or made_by.graph is not root.graph or x.is_graph_output()


def forward(m: Match, b: Builder, x: ir.Value) -> ir.Value:
    """``x`` in place of the root's output, through an Identity where ``needs_identity``
    (Add(x, 0) from a graph input to a graph output becomes Identity(x))."""
    return b.op("Identity", [x], like=m.root) if needs_identity(x, m.root) else x


def drop_pages(value: ir.Value | None) -> None:
    """Let the kernel take back the pages of a memory-mapped external weight that a fold
    has read (they are read from the file again if needed), so folding several large
    weights does not keep every one of them in the process's memory."""
    tensor = value.const_value if value is not None else None
    raw = getattr(tensor, "raw", None)
    if isinstance(tensor, ir.ExternalTensor) and raw is not None and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            raw.madvise(mmap.MADV_DONTNEED)
