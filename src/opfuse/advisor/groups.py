"""Grow UB fusion groups along single-consumer edges, with the target's limits.

A group starts at a Conv-like, Reduce, Segment or (unassigned) elementwise node and takes
elementwise consumers of its tensors (``Mul(x, Sigmoid(x))``; ``Add(Conv(x), residual)``:
a follower may also read tensors made outside the group, as UB fusion of Conv + Add(+Relu)
and Ascend's ``se_excite/mul`` do, if they are made before the group's first node, so the
group never waits on itself). It ends where exactly one tensor leaves it: every
intermediate has all its consumers in the group and is not a graph output. A group holds at
most limit + 1 members (a written-out activation is one member) and each step reads the
consumers of its few escaping tensors, so the cost is linear in the graph size.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from opfuse.advisor.graph import OpGraph
from opfuse.advisor.opkinds import ANCHOR_LIMIT, GROUP_KIND_NAME, Kind, classify
from opfuse.advisor.written_activations import Activation, find_activations

MAX_SIDE_BRANCH = 16  # nodes of a squeeze-excite branch (ReduceMean, Conv, act, Conv, Sigmoid)


@dataclass
class Group:
    members: list[int]
    kind: Kind
    names: list[str]
    op_types: list[str]
    output: str | None
    duration_us: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)
    activations: list[Activation] = field(default_factory=list)

    @property
    def fusion_type(self) -> str:
        """The members' op types joined by '+', as msadvisor prints them."""
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
    g: OpGraph,
    limits: Mapping[str, int],
    exclude: Set[int] = frozenset(),
    activations: Mapping[int, Activation] | None = None,
) -> list[Group]:
    """Every group of two or more nodes, in graph order. ``exclude``: nodes that cannot join
    any group (they run on another unit, like msprof's AI CPU operators). ``activations``:
    written-out activations (activations.find_activations), each one member."""
    acts = activations if activations is not None else find_activations(g)
    assigned: set[int] = set(exclude)
    groups: list[Group] = []
    for node in g.nodes:
        if node.index in assigned:
            continue
        kind = classify(node.op_type)
        if kind is Kind.OPAQUE or len(node.outputs) != 1:
            continue
        grown = _Growth(g, node.index, kind, limits[ANCHOR_LIMIT[kind]], assigned, acts).grow()
        if grown is None:
            continue
        members, side = grown
        assigned.update(members)
        produced = [t for m in members for t in g.nodes[m].outputs]
        escaping = [t for t in _escaping(g, set(members), produced) if t not in side]
        groups.append(
            Group(
                members,
                kind,
                [g.nodes[i].name for i in members],
                [g.nodes[i].op_type for i in members],
                escaping[0] if len(escaping) == 1 else None,
                activations=_named(members, acts),
            )
        )
    return groups


def _named(members: list[int], acts: Mapping[int, Activation]) -> list[Activation]:
    seen: dict[Activation, None] = {}
    for m in members:
        if m in acts:
            seen.setdefault(acts[m], None)
    return list(seen)


class _Growth:
    """One group grown from its anchor: add ready elementwise consumers one at a time (a
    consumer is ready when each data input is made inside the group or before its anchor: a
    tensor made after the anchor outside the group may depend on the group) and keep the
    longest prefix that leaves exactly one tensor escaping, so ``Mul(x, f(x))`` shapes of any
    depth fit within the limit. A written-out activation joins whole, as one member.

    The squeeze-excite rule: a Mul may also read a tensor made after the anchor by a side
    branch (outside any group) that starts with a Reduce of the group's own tensor and reads
    nothing else made after the anchor (``se_excite/mul(swish,
    Sigmoid(Conv(ReduceMean(swish))))``, as msadvisor groups it); the group's tensor that
    the branch reads may then escape into it (it is written out once for the branch),
    besides the group's one result."""

    def __init__(
        self,
        g: OpGraph,
        anchor: int,
        kind: Kind,
        limit: int,
        assigned: set[int],
        acts: Mapping[int, Activation],
    ) -> None:
        self.g, self.anchor, self.assigned, self.acts = g, anchor, assigned, acts
        self.followers_max = limit - 1 if kind is Kind.ELEMENTWISE else limit
        self.members = [anchor]
        self.inside = {anchor}
        self.side: set[str] = set()  # group tensors read by a side branch that returns
        if anchor in acts:  # an elementwise group that starts with an activation
            unit = [i for i in acts[anchor].nodes if i not in self.inside]
            self.members += unit
            self.inside.update(unit)

    def units(self) -> int:
        """Followers so far, an activation counted once."""
        seen: set[object] = set()
        for m in self.members[1:]:
            seen.add(self.acts.get(m, m))
        if self.anchor in self.acts:
            seen.discard(self.acts[self.anchor])
        return len(seen)

    def grow(self) -> tuple[list[int], set[str]] | None:
        g = self.g
        best, best_side = len(self.members), set(self.side)
        if len(self.members) > 1 and len(self._leaving()) != 1:
            best = 1
        while self.units() < self.followers_max:
            leaving = self._leaving()
            if any(t in g.graph_outputs for t in leaving):
                break
            step = self._next(leaving)
            if step is None:
                break
            unit, side = step
            if self.units() + 1 > self.followers_max:
                break
            self.members += unit
            self.inside.update(unit)
            self.side |= side
            if len(self._leaving()) == 1:
                best, best_side = len(self.members), set(self.side)
        if best < 2:
            return None
        kept = self.members[:best]
        return kept, {t for t in best_side if any(t in g.nodes[m].outputs for m in kept)}

    def _produced(self) -> list[str]:
        return [t for m in self.members for t in self.g.nodes[m].outputs]

    def _leaving(self) -> list[str]:
        return [t for t in _escaping(self.g, self.inside, self._produced()) if t not in self.side]

    def _next(self, leaving: list[str]) -> tuple[list[int], set[str]] | None:
        """The first ready consumer (whole activation) of the group's escaping tensors."""
        g = self.g
        best: tuple[list[int], set[str]] | None = None
        for t in [*leaving, *self.side]:
            for c in g.consumers.get(t, ()):
                cand = g.nodes[c]
                if (
                    c in self.inside
                    or c in self.assigned
                    or classify(cand.op_type) is not Kind.ELEMENTWISE
                    or len(cand.outputs) != 1
                ):
                    continue
                unit = list(self.acts[c].nodes) if c in self.acts else [c]
                if any(u in self.assigned or u in self.inside for u in unit):
                    continue
                side = self._ready(unit)
                if side is None:
                    continue
                if best is None or unit[0] < best[0][0]:
                    best = (unit, side)
        return best

    def _ready(self, unit: list[int]) -> set[str] | None:
        """None if the unit cannot join yet; else the group tensors its side branches read."""
        g = self.g
        made_here = {t for u in unit for t in g.nodes[u].outputs}
        side: set[str] = set()
        for u in unit:
            for x in g.nodes[u].inputs:
                made_by = g.producer.get(x)
                if x in made_here or made_by is None or made_by in self.inside:
                    continue
                if made_by < self.anchor:
                    continue
                branch = self._side_branch(made_by) if g.nodes[u].op_type == "Mul" else None
                if branch is None:
                    return None
                side |= branch
        return side

    def _side_branch(self, start: int) -> set[str] | None:
        """The group tensors a squeeze-excite branch ending at ``start`` reads: it starts
        with a Reduce (ReduceMean, GlobalAveragePool) of a group tensor and reads nothing
        else made after the anchor; no node of it is in a group. None otherwise."""
        g = self.g
        seen: set[int] = set()
        reads: set[str] = set()
        squeezes = False
        todo = [start]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            if i in self.assigned or len(seen) > MAX_SIDE_BRANCH:
                return None
            for x in g.nodes[i].inputs:
                made_by = g.producer.get(x)
                if made_by is None:
                    return None  # a graph input: not computed from the group
                if made_by in self.inside:
                    reads.add(x)
                    squeezes = squeezes or classify(g.nodes[i].op_type) is Kind.REDUCE
                elif made_by > self.anchor:
                    todo.append(made_by)
        return reads if reads and squeezes else None


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
