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

from opfuse.advisor.graph import GNode, OpGraph
from opfuse.advisor.opkinds import Kind, classify
from opfuse.advisor.profile_readers import OpRecord

LAYOUT_OPS = frozenset({"ReorderInput", "ReorderOutput"})
# ops onnxruntime removes or folds into a kernel next to them
PASS_THROUGH = frozenset({"Transpose", "Identity", "Reshape", "Flatten"})
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


def _known(g: OpGraph, tensor: str) -> str | None:
    """A runtime tensor's name in ``g``: itself or without onnxruntime's decorations, else
    the output of the node it is named after (onnxruntime renames some tensors so)."""
    bases = _base_names(tensor)
    found = next((b for b in bases if b in g.producer or b in g.consumers), None)
    if found is None:
        node = next((g.nodes[g.by_name[b]] for b in bases if b in g.by_name), None)
        if node is not None and len(node.outputs) == 1:
            found = node.outputs[0]
    return found


def _node_in(g: OpGraph, name: str) -> int | None:
    """The node of ``g`` a kernel is named after (its name, or its output tensor's)."""
    for base in _base_names(name):
        if base in g.by_name:
            return g.by_name[base]
        if base in g.producer:
            return g.producer[base]
    return None


@dataclass
class Resolver:
    analysed: OpGraph
    original: OpGraph | None = None
    runtime: OpGraph | None = None  # the graph onnxruntime ran, if saved
    _owners: dict[str, str] | None = field(default=None, init=False, repr=False)

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

    def kernel_nodes(self, name: str) -> list[str] | None:
        """The model's nodes one onnxruntime kernel runs, in the graph the kernel came from
        (the original model's when given, else the analysed one). Where the tensors it
        reads map back (names, ``..._nchwc`` suffixes, layout reorders): the nodes on a path
        from them to the node it is named after or a tensor it makes, so shape arithmetic
        onnxruntime folded into a constant is left out. Where they do not (it reads another
        fused kernel's renamed tensor): the node it is named after and the nodes folded into
        it above, up to one Conv-like node (a kernel runs at most one). A layout reorder
        runs the node whose output it reorders; an inlined function body's kernels, named
        after nothing, are taken with the kernels after them up to a known tensor. None when
        the kernel is unknown or nothing maps."""
        rt = self.runtime
        if rt is None or name not in rt.by_name:
            return None
        g = self.original if self.original is not None else self.analysed
        rnode = rt.nodes[rt.by_name[name]]
        if rnode.op_type in LAYOUT_OPS:
            return self._reordered(g, rnode)
        named = _node_in(g, name)
        region = [rnode]
        while named is None and not any(_known(g, t) for r in region for t in r.outputs):
            nxt = [
                c
                for r in region
                for t in r.outputs
                for c in (rt.nodes[i] for i in rt.consumers.get(t, ()))
                if c not in region and c.op_type not in LAYOUT_OPS and _node_in(g, c.name) is None
            ]
            if not nxt or len(region) + len(nxt) > MAX_WALK:
                return None
            region += nxt
        made = {t for r in region for t in r.outputs}
        stops = {self._graph_tensor(g, t) for r in region for t in r.inputs if t not in made}
        if None not in stops:
            made_here = (_known(g, t) for r in region for t in r.outputs)
            starts = [g.producer[t] for t in made_here if t is not None and t in g.producer]
            if named is not None:
                starts.append(named)
            kept = self._between(g, {r.name for r in region}, stops, starts)
            if (
                kept is not None
                and sum(classify(g.nodes[i].op_type) is Kind.CONV for i in kept) <= 1
            ):
                return [g.nodes[i].name for i in kept]
        return [g.nodes[i].name for i in self._folded_into(g, named)] if named is not None else None

    def _between(
        self, g: OpGraph, kernels: set[str], stops: set[str | None], starts: list[int]
    ) -> list[int] | None:
        """Nodes above ``starts`` down to the ``stops`` tensors that are computed from them;
        None if the walk reaches a graph input it does not read or another kernel's node."""
        others = self._kernel_owners()
        seen: set[int] = set()
        todo = list(starts)
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            if len(seen) > MAX_WALK or self._owner(g.nodes[i], others) not in (None, *kernels):
                return None
            for t in g.nodes[i].inputs:
                if t in stops:
                    continue
                if t not in g.producer:
                    return None
                todo.append(g.producer[t])
        between: set[str] = set()  # tensors computed from the kernel's inputs
        kept = []
        for i in sorted(seen):  # topological order
            if any(t in stops or t in between for t in g.nodes[i].inputs):
                between.update(g.nodes[i].outputs)
                kept.append(i)
        return kept or None

    def _folded_into(self, g: OpGraph, start: int) -> list[int]:
        """``start`` and the nodes above it that no kernel is named after (elementwise,
        Conv-like, or layout ops), up to and including one Conv-like node."""
        others = self._kernel_owners()
        kept, todo = {start}, [start]
        while todo:
            node = g.nodes[todo.pop()]
            if classify(node.op_type) is Kind.CONV:
                continue
            for t in node.inputs:
                p = g.producer.get(t)
                if p is None or p in kept or len(kept) >= MAX_WALK:
                    continue
                above = g.nodes[p]
                kind = classify(above.op_type)
                if self._owner(above, others) is not None or (
                    kind not in (Kind.CONV, Kind.ELEMENTWISE) and above.op_type not in PASS_THROUGH
                ):
                    continue
                kept.add(p)
                todo.append(p)
        return sorted(kept)

    @staticmethod
    def _owner(node: GNode, owners: dict[str, str]) -> str | None:
        return owners.get(node.name) or next((owners[t] for t in node.outputs if t in owners), None)

    def _reordered(self, g: OpGraph, rnode: GNode) -> list[str] | None:
        """The node whose output a layout reorder converts."""
        for t in (*rnode.inputs, *rnode.outputs):
            src = self._graph_tensor(g, t)
            if src in g.producer:
                return [g.nodes[g.producer[src]].name]
        for t in (*rnode.inputs, *rnode.outputs):  # a tensor named after its node
            index = _node_in(g, t)
            if index is not None:
                return [g.nodes[index].name]
        return None

    def _graph_tensor(self, g: OpGraph, tensor: str) -> str | None:
        """A runtime tensor's name in ``g``: itself or without ``_nchwc``, or the input of
        the layout reorder(s) that made it."""
        for _ in range(MAX_WALK):
            known = _known(g, tensor)
            runtime = self.runtime
            made_by = runtime.producer.get(tensor) if runtime is not None else None
            if known is not None or runtime is None or made_by is None:
                return known
            rnode = runtime.nodes[made_by]
            if rnode.op_type not in LAYOUT_OPS or not rnode.inputs:
                return None
            tensor = rnode.inputs[0]
        return None

    def _kernel_owners(self) -> dict[str, str]:
        """Node or tensor name -> the runtime kernel named after it (layout ops left out)."""
        if self._owners is None:
            assert self.runtime is not None
            self._owners = {}
            for rnode in self.runtime.nodes:
                if rnode.op_type not in LAYOUT_OPS:
                    for base in _base_names(rnode.name):
                        self._owners.setdefault(base, rnode.name)
        return self._owners


@dataclass
class Attribution:
    time_us: dict[int, float] = field(default_factory=dict)  # analysed node -> us per run
    record: dict[int, OpRecord] = field(default_factory=dict)  # first record mapped to it
    unmapped: list[OpRecord] = field(default_factory=list)
    aligned: list[str] = field(default_factory=list)  # kernels placed by execution order
    placed: dict[str, str] = field(default_factory=dict)  # record name -> node name

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
        result.placed[rec.name] = resolver.analysed.nodes[index].name
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
    shape; where the next nodes without a time are of the run's op types in the same order
    (the body's own nodes), one kernel to each. Other unknown names stay unmapped."""
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
        # the graph holds the body's nodes themselves (onnxruntime's saved graph, whose
        # inlined names differ from the profiling session's): one kernel to each, in order
        ahead = [m for m in missing[cursor:] if m > last and m not in result.time_us]
        seq = ahead[: len(run)]
        if len(run) > 1 and [g.nodes[m].op_type for m in seq] == [r.op_type for r in run]:
            for m, r in zip(seq, run, strict=True):
                result.time_us[m] = r.duration_us
                result.record[m] = r
                result.placed[r.name] = g.nodes[m].name
            result.aligned.extend(r.name for r in run)
            last, cursor = seq[-1], missing.index(seq[-1]) + 1
            i = j + 1
            continue
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
            result.placed.update((r.name, g.nodes[target].name) for r in run)
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


def original_nodes(name: str, resolver: Resolver, attribution: Attribution) -> list[str]:
    """The model's node(s) behind a profiled name: the nodes the onnxruntime kernel runs
    (``.../BatchNormalization_output_0_nchwc``: the Conv and its BatchNorm), else the node
    its time was attributed to (an inlined function body's kernel: the function's node),
    else none. ``attribution`` was made on ``resolver.runtime`` or ``resolver.analysed``."""
    placed = attribution.placed.get(name)
    for kernel in dict.fromkeys((name, placed)):
        nodes = resolver.kernel_nodes(kernel) if kernel is not None else None
        if nodes is not None:
            return nodes
    if placed is None:
        return []
    index = resolver.node(placed)
    return [resolver.analysed.nodes[index].name] if index is not None else []
