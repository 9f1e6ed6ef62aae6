"""Grow UB fusion groups along single-consumer edges, with the target's limits.

A group starts at a Conv-like, Reduce, Segment or (unassigned) elementwise node and takes
elementwise consumers of its tensors (``Mul(x, Sigmoid(x))``; ``Add(Conv(x), residual)``:
a follower may also read tensors made outside the group, as UB fusion of Conv + Add(+Relu)
and Ascend's ``se_excite/mul`` do, if they are made before the group's first node, so the
group never waits on itself). It ends where exactly one tensor leaves it: every
intermediate has all its consumers in the group and is not a graph output. A group holds at
most limit + 1 nodes and each step reads the consumers of its few escaping tensors, so the
cost is linear in the graph size.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from opfuse.advisor.graph import OpGraph
from opfuse.advisor.opkinds import ANCHOR_LIMIT, GROUP_KIND_NAME, Kind, classify


@dataclass
class Group:
    members: list[int]
    kind: Kind
    names: list[str]
    op_types: list[str]
    output: str | None
    duration_us: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def fusion_type(self) -> str:
        return "+".join(self.op_types)

    @property
    def kind_name(self) -> str:
        return GROUP_KIND_NAME[self.kind]


def _escaping(g: OpGraph, members: set[int], produced: list[str]) -> list[str]:
    return [
        t
        for t in produced
        if t in g.graph_outputs or any(c not in members for c in g.consumers.get(t, ()))
    ]


def grow_groups(
    g: OpGraph, limits: Mapping[str, int], exclude: Set[int] = frozenset()
) -> list[Group]:
    """Every group of two or more nodes, in graph order. ``exclude``: nodes that cannot join
    any group (they run on another unit, like msprof's AI CPU operators)."""
    assigned: set[int] = set(exclude)
    groups: list[Group] = []
    for node in g.nodes:
        if node.index in assigned:
            continue
        kind = classify(node.op_type)
        if kind is Kind.OPAQUE or len(node.outputs) != 1:
            continue
        members = _grow(g, node.index, kind, limits[ANCHOR_LIMIT[kind]], assigned)
        if len(members) < 2:
            continue
        assigned.update(members)
        produced = [t for m in members for t in g.nodes[m].outputs]
        escaping = _escaping(g, set(members), produced)
        groups.append(
            Group(
                members,
                kind,
                [g.nodes[i].name for i in members],
                [g.nodes[i].op_type for i in members],
                escaping[0] if len(escaping) == 1 else None,
            )
        )
    return groups


def _grow(g: OpGraph, anchor: int, kind: Kind, limit: int, assigned: set[int]) -> list[int]:
    """Add ready elementwise consumers one at a time (a consumer is ready when each data
    input is made inside the group or before its anchor: a tensor made after the anchor
    outside the group may depend on the group) and keep the longest prefix that leaves
    exactly one tensor escaping, so ``Mul(x, f(x))`` shapes of any depth fit within the
    limit."""
    members = [anchor]
    inside = {anchor}
    produced = list(g.nodes[anchor].outputs)
    followers_max = limit - 1 if kind is Kind.ELEMENTWISE else limit
    best = 1
    while len(members) - 1 < followers_max:
        escaping = _escaping(g, inside, produced)
        if any(t in g.graph_outputs for t in escaping):
            break
        ready = None
        for t in escaping:
            for c in g.consumers.get(t, ()):
                cand = g.nodes[c]
                if (
                    c in inside
                    or c in assigned
                    or classify(cand.op_type) is not Kind.ELEMENTWISE
                    or len(cand.outputs) != 1
                    or not all(_ready(g, x, inside, anchor) for x in cand.inputs)
                ):
                    continue
                ready = c if ready is None else min(ready, c)
        if ready is None:
            break
        members.append(ready)
        inside.add(ready)
        produced += g.nodes[ready].outputs
        if len(_escaping(g, inside, produced)) == 1:
            best = len(members)
    return members[:best]


def _ready(g: OpGraph, tensor: str, inside: set[int], anchor: int) -> bool:
    """Made inside the group, or a graph input, or made before the group's first node."""
    made_by = g.producer.get(tensor)
    return made_by is None or made_by in inside or made_by < anchor


def rank_groups(groups: list[Group]) -> list[Group]:
    """Largest total duration first, groups of the same fusion type together (types in the
    order of their summed duration)."""
    per_type: dict[str, float] = {}
    for grp in groups:
        per_type[grp.fusion_type] = per_type.get(grp.fusion_type, 0.0) + grp.duration_us
    return sorted(
        groups,
        key=lambda grp: (-per_type[grp.fusion_type], grp.fusion_type, -grp.duration_us),
    )
