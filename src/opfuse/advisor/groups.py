"""Grow UB fusion groups along single-consumer edges, with the target's limits.

A group starts at a Conv-like, Reduce, Segment or (unassigned) elementwise node and takes the
elementwise consumers of its one escaping tensor while every intermediate stays inside the
group (its consumers all in the group, not a graph output). Followers may read only tensors of
the group (``Mul(x, Sigmoid(x))`` is fine); an elementwise chain's head may have several
inputs. Each node joins at most one group and each growth step reads one tensor's consumers,
so the cost is linear in the graph size.
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
        limit = limits[ANCHOR_LIMIT[kind]]
        followers = 0
        members = [node.index]
        inside = {node.index}
        produced = list(node.outputs)
        escaping = _escaping(g, inside, produced)
        while len(escaping) == 1 and escaping[0] not in g.graph_outputs:
            tensor = escaping[0]
            candidates = sorted({c for c in g.consumers.get(tensor, ()) if c not in inside})
            ok = (
                bool(candidates)
                and followers + len(candidates) + (1 if kind is Kind.ELEMENTWISE else 0) <= limit
            )
            trial = inside | set(candidates)
            for c in candidates if ok else ():
                cand = g.nodes[c]
                if (
                    c in assigned
                    or classify(cand.op_type) is not Kind.ELEMENTWISE
                    or len(cand.outputs) != 1
                    or any(g.producer.get(t) not in trial for t in cand.inputs)
                ):
                    ok = False
                    break
            if not ok:
                break
            new_produced = produced + [t for c in candidates for t in g.nodes[c].outputs]
            new_escaping = _escaping(g, trial, new_produced)
            if len(new_escaping) != 1:
                break
            members += candidates
            inside, produced, escaping = trial, new_produced, new_escaping
            followers += len(candidates)
        if len(members) < 2:
            continue
        assigned.update(members)
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
