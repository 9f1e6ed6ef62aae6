"""The graph that ran, from an Ascend op summary and the model it profiled: one node per
profiled operator, named and typed as msprof printed it, connected through the model's
edges. A CANN fused operator's name is the concatenation of the names of the model nodes it
runs (``block2a_dwconv/depthwiseblock2a_activation/Sigmoidblock2a_activation/mul``); it is
split back into them. Model nodes no operator ran (folded away by the compiler) pass their
first input through, so the operators around them stay connected; names that match no node
are reported, with their time, and join no group."""

from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.advisor.attribution import Attribution
from opfuse.advisor.graph import GNode, OpGraph
from opfuse.advisor.profile_readers import OpRecord


@dataclass
class RanGraph:
    graph: OpGraph  # one node per profiled operator
    runs: dict[int, list[str]]  # operator -> the model's nodes it ran
    times: Attribution = field(default_factory=Attribution)

    def owner(self) -> dict[str, int]:
        """Model node name -> the operator that ran it."""
        return {name: op for op, names in self.runs.items() for name in names}


def split_fused_name(name: str, known: dict[str, int]) -> list[int] | None:
    """The model nodes whose names, concatenated, make ``name`` (None if no split does);
    the split with the fewest parts, so a node whose name is a prefix of another's does not
    break a longer match."""
    lengths = sorted({len(k) for k in known}, reverse=True)
    best: list[list[int] | None] = [None] * (len(name) + 1)
    best[len(name)] = []
    for start in range(len(name) - 1, -1, -1):
        for n in lengths:
            end = start + n
            rest = best[end] if end <= len(name) else None
            if rest is None or name[start:end] not in known:
                continue
            parts = [known[name[start:end]], *rest]
            current = best[start]
            if current is None or len(parts) < len(current):
                best[start] = parts
    return best[0]


def ran_graph(model: OpGraph, records: list[OpRecord]) -> RanGraph:
    """Operators of the profile (in execution order) on the model's edges."""
    known = {n.name: n.index for n in model.nodes}
    for n in model.nodes:  # a node is also known by its output tensor's name
        for t in n.outputs:
            known.setdefault(t, n.index)
    owner: dict[int, int] = {}  # model node -> operator (position in ops)
    ops: list[tuple[OpRecord, list[int]]] = []
    times = Attribution()
    for rec in records:
        mapped = [known[rec.name]] if rec.name in known else split_fused_name(rec.name, known)
        if mapped is None:
            times.unmapped.append(rec)
            continue
        fresh = [i for i in dict.fromkeys(mapped) if i not in owner]
        if not fresh:  # another row ran the same nodes: its time goes to that operator
            op = owner[mapped[0]]
            times.time_us[op] = times.time_us.get(op, 0.0) + rec.duration_us
            times.placed[rec.name] = ops[op][0].name
            continue
        op = len(ops)
        ops.append((rec, fresh))
        owner.update((i, op) for i in fresh)
        times.time_us[op] = rec.duration_us
        times.record[op] = rec
        times.placed[rec.name] = rec.name
    # order the operators so each comes after what it reads: by their last model node
    order = sorted(range(len(ops)), key=lambda op: max(ops[op][1]))
    renumber = {op: i for i, op in enumerate(order)}
    alias: dict[str, str] = {}  # model tensor -> the tensor that holds it in the ran graph
    for node in model.nodes:
        if node.index not in owner:
            for t in node.outputs:
                alias[t] = alias.get(node.inputs[0], node.inputs[0]) if node.inputs else t
    nodes: list[GNode] = []
    runs: dict[int, list[str]] = {}
    for op in order:
        rec, members = ops[op]
        inside = set(members)
        made = {t for i in members for t in model.nodes[i].outputs}
        inputs = [
            alias.get(t, t)
            for i in members
            for t in model.nodes[i].inputs
            if t not in made and model.producer.get(alias.get(t, t)) not in inside
        ]
        outputs = [
            t
            for i in sorted(members)
            for t in model.nodes[i].outputs
            if t in model.graph_outputs or any(c not in inside for c in model.consumers.get(t, ()))
        ] or list(model.nodes[max(members)].outputs)
        consts = [t for i in members for t in model.nodes[i].const_inputs]
        index = renumber[op]
        nodes.append(
            GNode(index, rec.name, rec.op_type, list(dict.fromkeys(inputs)), outputs, consts)
        )
        runs[index] = [model.nodes[i].name for i in sorted(members)]
    renumbered = Attribution(
        {renumber[op]: t for op, t in times.time_us.items()},
        {renumber[op]: r for op, r in times.record.items()},
        times.unmapped,
        [],
        times.placed,
    )
    graph = OpGraph(
        nodes,
        list(model.graph_inputs),
        {alias.get(t, t) for t in model.graph_outputs},
        dict(model.shapes),
        dict(model.itemsize),
        scalars=dict(model.scalars),
    )
    return RanGraph(graph, runs, renumbered)
