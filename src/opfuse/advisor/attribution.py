"""Map profile node names onto the analysed graph's nodes.

Profiled names may be the analysed graph's own, the original model's (nodes that opfuse
folded away), or onnxruntime's fused and layout nodes (``..._nchwc``, ``.../QuickGeluFusion/``,
``ReorderOutput_token_3``). Names are tried first; then a node's output and input tensors.
A fused kernel's time goes to the node it is named after, so sums over groups are kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from opfuse.advisor.graph import OpGraph
from opfuse.advisor.profile import OpRecord

LAYOUT_OPS = frozenset({"ReorderInput", "ReorderOutput"})
MAX_WALK = 64


def _base_names(name: str) -> list[str]:
    """onnxruntime's decorations stripped: '<x>_nchwc', '<x>/SomethingFusion/', '<x>_token_7'."""
    out = [name]
    stripped = re.sub(r"_nchwc$", "", name)
    stripped = re.sub(r"/[A-Za-z]*Fusion[^/]*/?$", "", stripped)
    stripped = re.sub(r"_token_\d+$", "", stripped)
    stripped = stripped.rstrip("/")
    if stripped != name:
        out.append(stripped)
    return out


@dataclass
class Resolver:
    analysed: OpGraph
    original: OpGraph | None = None
    runtime: OpGraph | None = None  # the graph onnxruntime ran, if saved

    def _from_original(self, index: int) -> int | None:
        """An original node that opfuse removed: the nearest surviving producer upstream,
        else downstream (folded BatchNorm -> its Conv)."""
        assert self.original is not None
        g, a = self.original, self.analysed
        for direction in ("up", "down"):
            node, seen = g.nodes[index], 0
            while seen < MAX_WALK:
                seen += 1
                if node.name in a.by_name:
                    return a.by_name[node.name]
                for t in node.outputs:
                    if t in a.producer:
                        return a.producer[t]
                if direction == "up":
                    nxt = next((g.producer[t] for t in node.inputs if t in g.producer), None)
                else:
                    nxt = next((c for t in node.outputs for c in g.consumers.get(t, ())), None)
                if nxt is None:
                    break
                node = g.nodes[nxt]
        return None

    def tensor(self, name: str) -> int | None:
        if name in self.analysed.producer:
            return self.analysed.producer[name]
        if self.original is not None and name in self.original.producer:
            return self._from_original(self.original.producer[name])
        return None

    def node(self, name: str) -> int | None:
        a = self.analysed
        for base in _base_names(name):
            if base in a.by_name:
                return a.by_name[base]
            if self.original is not None and base in self.original.by_name:
                found = self._from_original(self.original.by_name[base])
                if found is not None:
                    return found
            found = self.tensor(base)
            if found is not None:
                return found
        if self.runtime is not None and name in self.runtime.by_name:
            rnode = self.runtime.nodes[self.runtime.by_name[name]]
            for t in (*rnode.outputs, *rnode.inputs):
                found = self.tensor(t)
                if found is not None:
                    return found
        return None


@dataclass
class Attribution:
    time_us: dict[int, float] = field(default_factory=dict)  # analysed node -> us per run
    record: dict[int, OpRecord] = field(default_factory=dict)  # first record mapped to it
    unmapped: list[OpRecord] = field(default_factory=list)
    aligned: list[str] = field(default_factory=list)  # kernels placed by execution order

    @property
    def unmapped_us(self) -> float:
        return sum(r.duration_us for r in self.unmapped)


def attribute(records: Iterable[OpRecord], resolver: Resolver) -> Attribution:
    result = Attribution()
    ordered = list(records)
    found = [resolver.node(rec.name) for rec in ordered]
    for rec, index in zip(ordered, found, strict=True):
        if index is None:
            continue
        result.time_us[index] = result.time_us.get(index, 0.0) + rec.duration_us
        direct = resolver.analysed.nodes[index].name == rec.name
        if direct or index not in result.record:
            result.record[index] = rec
    _align_unnamed(ordered, found, resolver.analysed, result)
    return result


def _align_unnamed(
    ordered: list[OpRecord], found: list[int | None], g: OpGraph, result: Attribution
) -> None:
    """Kernels onnxruntime named itself (``HardSigmoid_122``, named ``<op type>_<index>``: the
    inlined body of a function op such as HardSwish) go, run by run in execution order, to
    the next node after the last mapped one that has no time of its own and the same output
    shape. Other unknown names stay unmapped."""
    missing = [n.index for n in g.nodes if n.index not in result.time_us]
    own = [bool(re.fullmatch(rf"{re.escape(r.op_type)}_\d+", r.name)) for r in ordered]
    cursor, last = 0, -1
    i = 0
    while i < len(ordered):
        here = found[i]
        if here is not None:
            last = max(last, here)
            i += 1
            continue
        if not own[i]:  # a name of someone else's (a subgraph node, another model)
            result.unmapped.append(ordered[i])
            i += 1
            continue
        j = i
        while j + 1 < len(ordered) and found[j + 1] is None and own[j + 1]:
            j += 1
        run = ordered[i : j + 1]
        shape = run[-1].output_shapes[0] if run[-1].output_shapes else None
        target = None
        for k in range(cursor, len(missing)):
            node = g.nodes[missing[k]]
            if node.index <= last or node.index in result.time_us:
                continue
            known = g.shapes.get(node.outputs[0]) if node.outputs else None
            if shape is None or known is None or list(known) == list(shape) or None in known:
                target, cursor = node.index, k + 1
                break
        if target is None:
            result.unmapped.extend(run)
        else:
            result.time_us[target] = sum(r.duration_us for r in run)
            result.record[target] = run[-1]
            result.aligned.extend(r.name for r in run)
            last = target
        i = j + 1


def runtime_kernels(resolver: Resolver) -> dict[int, list[str]]:
    """For each analysed node, the op types of the onnxruntime kernels named after it
    (layout reorders left out); a node with none was fused into another kernel."""
    assert resolver.runtime is not None
    kernels: dict[int, list[str]] = {}
    for rnode in resolver.runtime.nodes:
        if rnode.op_type in LAYOUT_OPS:
            continue
        index = resolver.node(rnode.name)
        if index is not None:
            kernels.setdefault(index, []).append(rnode.op_type)
    return kernels
