"""Activation functions written out as several elementwise nodes (HardSwish as
``x * Clip(x + 3, 0, 6) / 6``, SiLU as ``x * Sigmoid(x)``, GELU's erf and tanh forms, Mish),
recognised so a fusion group counts each as one elementwise member, as a backend's fused
activation runs it.

A candidate is the set of elementwise nodes computed from one tensor ``x`` alone (and
one-element constants) with exactly one tensor leaving it; it is an activation when its op
types, as a multiset, are one of the forms below and as many of its nodes read ``x`` as
the form's do (``Sigmoid(x) * k`` is not SiLU). Each tensor starts at most one search of
a few nodes, so finding them is linear in the graph size."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from opfuse.advisor.graph import OpGraph
from opfuse.advisor.opkinds import Kind, classify

MAX_NODES = 8


def _form(*ops: str) -> frozenset[tuple[str, int]]:
    return frozenset(Counter(ops).items())


# op types of a written-out activation -> its name and how many of its nodes read x
FORMS: dict[frozenset[tuple[str, int]], tuple[str, int]] = {
    _form("Sigmoid", "Mul"): ("SiLU", 2),  # x * Sigmoid(x)
    _form("Mul", "Sigmoid", "Mul"): ("Swish", 2),  # x * Sigmoid(beta x); beta 1.702: GELU
    _form("HardSigmoid", "Mul"): ("HardSwish", 2),
    _form("Add", "Clip", "Mul", "Div"): ("HardSwish", 2),  # x * Clip(x + 3, 0, 6) / 6
    _form("Add", "Clip", "Mul", "Mul"): ("HardSwish", 2),
    _form("Add", "Relu", "Min", "Mul", "Div"): ("HardSwish", 2),
    _form("Add", "Relu", "Min", "Mul", "Mul"): ("HardSwish", 2),
    _form("Add", "Clip", "Div"): ("HardSigmoid", 1),  # Clip(x + 3, 0, 6) / 6
    _form("Add", "Clip", "Mul"): ("HardSigmoid", 1),
    _form("Div", "Erf", "Add", "Mul", "Mul"): ("GELU", 2),  # x * 0.5 * (1 + erf(x / sqrt 2))
    _form("Mul", "Erf", "Add", "Mul", "Mul"): ("GELU", 2),
    _form("Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"): ("GELU", 3),  # tanh form
    _form("Softplus", "Tanh", "Mul"): ("Mish", 2),  # x * tanh(softplus(x))
    _form("Exp", "Add", "Log", "Tanh", "Mul"): ("Mish", 2),
}
QUICK_GELU_BETA = 1.702


@dataclass(frozen=True)
class Activation:
    name: str
    nodes: tuple[int, ...]  # in graph order
    output: str


def find_activations(g: OpGraph) -> dict[int, Activation]:
    """Node index -> the activation it is part of, for every written-out activation."""
    found: dict[int, Activation] = {}
    sources = list(g.graph_inputs) + [t for n in g.nodes for t in n.outputs]
    for x in sources:
        act = _activation_from(g, x, found)
        if act is not None:
            found.update((i, act) for i in act.nodes)
    return found


def _activation_from(g: OpGraph, x: str, taken: dict[int, Activation]) -> Activation | None:
    """The largest set of nodes computed from ``x`` alone whose op types are a known form."""
    inside: list[int] = []
    made = {x}
    grew = True
    while grew and len(inside) < MAX_NODES:
        grew = False
        for t in list(made):
            for c in g.consumers.get(t, ()):
                node = g.nodes[c]
                if (
                    c in inside
                    or c in taken
                    or classify(node.op_type) is not Kind.ELEMENTWISE
                    or len(node.outputs) != 1
                    or not all(i in made for i in node.inputs)
                    or not all(k in g.scalars for k in node.const_inputs)
                ):
                    continue
                inside.append(c)
                made.update(node.outputs)
                grew = True
                if len(inside) >= MAX_NODES:
                    break
            if len(inside) >= MAX_NODES:
                break
    inside.sort()
    for end in range(len(inside), 1, -1):
        members = inside[:end]
        form = FORMS.get(frozenset(Counter(g.nodes[i].op_type for i in members).items()))
        readers = sum(x in g.nodes[i].inputs for i in members)
        if form is None or readers != form[1]:
            continue
        name = form[0]
        output = _single_output(g, members)
        if output is None:
            continue
        if name == "Swish" and _is_quick_gelu(g, members):
            name = "GELU"
        return Activation(name, tuple(members), output)
    return None


def _single_output(g: OpGraph, members: list[int]) -> str | None:
    """The one tensor that leaves ``members`` (None if none or several do)."""
    inside = set(members)
    leaving = [
        t
        for m in members
        for t in g.nodes[m].outputs
        if t in g.graph_outputs or any(c not in inside for c in g.consumers.get(t, ()))
    ]
    return leaving[0] if len(leaving) == 1 else None


def _is_quick_gelu(g: OpGraph, members: list[int]) -> bool:
    first = g.nodes[members[0]]
    return any(abs(g.scalars.get(k, 0.0) - QUICK_GELU_BETA) < 1e-3 for k in first.const_inputs)
