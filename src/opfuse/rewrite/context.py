"""What a pass sees: the model, the options, and where it records what it did."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import onnx_ir as ir

from opfuse.model.graphs import all_graphs, node_graphs, subgraphs
from opfuse.rewrite.builder import SharedConstants
from opfuse.rewrite.stats import EffectLog, PatternStats

DEFAULT_FOLD_SIZE_LIMIT = 1 << 20


@dataclass
class Options:
    """Settings that passes read; the CLI and the Python API fill them."""

    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT
    target_opset: int | None = None  # --target-opset: convert the model before fusing
    layout: str = "keep"  # --layout keep|nchw|nhwc (the layout pass reads it)
    target: str | None = None  # --target: a runtime whose UBFusion passes may run
    keep_inputs: list[str] | None = None  # --inputs: strip what they do not need
    keep_outputs: list[str] | None = None  # --outputs
    extra: dict[str, object] = field(default_factory=dict)


class PassLabel(Protocol):
    """What the effect log needs of a pass (a ``PassInfo``, which imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def section(self) -> str: ...


class PassContext:
    def __init__(self, model: ir.Model, options: Options, log: EffectLog) -> None:
        self.model = model
        self.options = options
        self.log = log
        self.current: PassLabel | None = None
        self.notes: list[str] = []  # facts the summary must tell the user (layout changes)
        # what the rules tried at one node found out about it (the affine chain ending
        # there): shared by them, emptied by the driver before each node and each change
        self.visit_memo: dict[tuple[str, int], object] = {}
        self._flat: bool | None = None  # no node holds a graph (known after one walk)
        # equal small constants the rewrites make, one initializer each (the pipeline
        # sets it when common-subexpression elimination is on: Builder.const)
        self.shared_constants: SharedConstants | None = None

    @property
    def opset(self) -> int:
        return self.model.opset_imports.get("", self.model.opset_imports.get("ai.onnx", 1))

    def graphs(self) -> list[ir.Graph]:
        """The main graph and every subgraph (If/Loop/Scan bodies), outermost first.

        A model without control flow is walked for them once: rewrites remove nodes
        holding graphs but never add one to a flat model (``added`` checks what the
        driver commits), so its list stays the main graph alone."""
        if self._flat is None:
            self._flat = next(subgraphs(self.model.graph), None) is None
        return [self.model.graph] if self._flat else all_graphs(self.model.graph)

    def added(self, nodes: Iterable[ir.Node]) -> None:
        """Nodes a rewrite put into the model: one holding a graph ends the flat path."""
        if self._flat and any(node_graphs(node) for node in nodes):
            self._flat = False

    def entry(self, pattern: str, info: PassLabel | None = None) -> PatternStats:
        info = info or self.current
        assert info is not None, "record() outside a pass"
        return self.log.entry(info.name, info.section, pattern)

    def record(self, pattern: str, matched: int = 0, effected: int = 0) -> None:
        stats = self.entry(pattern)
        stats.matched += matched
        stats.effected += effected

    def reason(self, pattern: str, reason: str, node: ir.Node | None = None) -> None:
        self.entry(pattern).add_reason(reason, node.name if node else None)
