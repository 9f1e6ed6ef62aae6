"""The worklist driver: applies rules until nothing changes, revisiting only what a
rewrite touched, so the cost stays linear in the size of the graph."""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from opfuse.errors import EngineError
from opfuse.rewrite.builder import Builder, NameScope
from opfuse.rewrite.context import PassContext
from opfuse.rewrite.edit import replace_value
from opfuse.rewrite.passinfo import PassInfo
from opfuse.rewrite.pattern import DEFAULT_DOMAINS, FLOATING, Match, const_array
from opfuse.rewrite.rule import Rule

REWRITE_BUDGET_PER_NODE = 8
REWRITE_BUDGET_MIN = 1000


def common_check(rule: Rule, m: Match) -> str | None:
    """The safety checks every rule needs, kept here once."""
    for name in rule.constants:
        if name in m.values and name not in m.consts:
            array = const_array(m.values[name])
            if array is None:
                return f"{name} is not a constant"
            m.consts[name] = array
    if rule.exclusive:
        inside = set(map(id, m.nodes))
        for node in m.nodes:
            if node is m.root:
                continue
            for out in node.outputs:
                if out.is_graph_output():
                    return f"{node.op_type} {node.name!r} output is a graph output"
                if any(id(user) not in inside for user, _ in out.uses()):
                    return f"{node.op_type} {node.name!r} output has another consumer"
    root_dtype = m.root.outputs[0].dtype if m.root.outputs else None
    if root_dtype in FLOATING:
        for name, array in m.consts.items():
            if np.issubdtype(array.dtype, np.floating) and array.dtype != root_dtype.numpy():
                return f"constant {name!r} is {array.dtype}, the output is {root_dtype}"
    return None


@dataclass(frozen=True)
class Explanation:
    """One match of a rule in a dry run: the nodes it covers (``Match.covered``) and why
    it would not fire (None: it would)."""

    info: PassInfo
    rule: Rule
    root: ir.Node
    nodes: tuple[ir.Node, ...]
    reason: str | None


class Driver:
    """Runs a group of rule passes over every graph of a model to a fixpoint."""

    def __init__(self, ctx: PassContext, passes: Sequence[PassInfo]) -> None:
        self.ctx = ctx
        self.by_type: dict[str, list[tuple[PassInfo, Rule]]] = {}
        for info in passes:
            for rule in info.rules:
                ctx.entry(rule.name, info)  # every pattern gets a log line, zero or not
                for op_type in rule.root_types():
                    self.by_type.setdefault(op_type, []).append((info, rule))

    @functools.cached_property
    def names(self) -> NameScope:
        """The model's names, collected at the first rewrite (a stage that rewrites
        nothing never walks the model for them)."""
        return NameScope(self.ctx.graphs())

    def run(self) -> int:
        """Apply rules everywhere; return the number of rewrites."""
        return sum(self._run_graph(graph) for graph in self.ctx.graphs())

    def _run_graph(self, graph: ir.Graph) -> int:
        queue: deque[ir.Node] = deque(graph)
        queued: set[int] = {id(n) for n in queue}
        budget = REWRITE_BUDGET_PER_NODE * len(queue) + REWRITE_BUDGET_MIN
        fired: Counter[str] = Counter()
        done = 0
        while queue:
            node = queue.popleft()
            queued.discard(id(node))
            if node.graph is not graph or node.domain not in DEFAULT_DOMAINS:
                continue
            self.ctx.visit_memo.clear()
            for info, rule in self.by_type.get(node.op_type, ()):
                touched = self._try(info, rule, node, graph)
                if touched is None:
                    continue
                done += 1
                fired[f"{rule.name} ({info.name})"] += 1
                if done > budget:
                    top = " and ".join(name for name, _ in fired.most_common(2))
                    raise EngineError(
                        f"rewrites did not converge after {done} rewrites in graph "
                        f"{graph.name or 'main'!r}: {top} keep firing (rules that undo each other?)"
                    )
                for n in touched:
                    if id(n) not in queued and n.graph is graph:
                        queue.append(n)
                        queued.add(id(n))
                break
        return done

    def explain(self, graph: ir.Graph | None = None) -> list[Explanation]:
        """A dry run over ``graph`` (default: the main graph): every match of every rule,
        in node order, with the nodes it covers and the reason it would not fire. Nothing
        is rewritten and nothing is recorded in the effect log."""
        graph = self.ctx.model.graph if graph is None else graph
        out: list[Explanation] = []
        for node in list(graph):
            if node.domain not in DEFAULT_DOMAINS:
                continue
            self.ctx.visit_memo.clear()
            for info, rule in self.by_type.get(node.op_type, ()):
                judged = self._judge(info, rule, node)
                if judged is not None:
                    m, reason = judged
                    out.append(Explanation(info, rule, node, tuple(m.covered()), reason))
        return out

    def _judge(self, info: PassInfo, rule: Rule, node: ir.Node) -> tuple[Match, str | None] | None:
        """Match ``rule`` at ``node`` and run its checks: (the match, why it cannot fire)."""
        self.ctx.current = info
        m = rule.match(node, self.ctx)
        if m is None:
            return None
        return m, common_check(rule, m) or rule.check(m, self.ctx)

    def _try(
        self, info: PassInfo, rule: Rule, node: ir.Node, graph: ir.Graph
    ) -> list[ir.Node] | None:
        judged = self._judge(info, rule, node)
        if judged is None:
            return None
        m, reason = judged
        stats = self.ctx.entry(rule.name, info)
        stats.matched += 1
        if reason:
            stats.add_reason(reason, node.name)
            return None
        b = Builder(node, self.names, self.ctx.shared_constants)
        replacement = rule.rewrite(m, b, self.ctx)
        pairs = _pairs(node, replacement)
        reason = _commit_check(pairs, graph)
        if reason:
            stats.add_reason(reason, node.name)
            return None
        touched = self._commit(graph, m, b, pairs)
        self.ctx.visit_memo.clear()
        stats.effected += 1
        return touched

    def _commit(
        self, graph: ir.Graph, m: Match, b: Builder, pairs: list[tuple[ir.Value, ir.Value | None]]
    ) -> list[ir.Node]:
        for init in b.initializers:
            graph.register_initializer(init)
        b.committed()
        if b.nodes:
            graph.insert_before(m.root, b.nodes)
            self.ctx.added(b.nodes)
        touched: list[ir.Node] = list(b.nodes)
        for old, new in pairs:
            if new is None:
                continue
            touched.extend(user for user, _ in old.uses())
            # an exact rewrite keeps the value's type and shape: later rules see them
            # before the next round's shape inference
            if new.type is None and old.type is not None:
                new.type = old.type
            if new.shape is None and old.shape is not None:
                new.shape = old.shape.copy()
            replace_value(old, new)
        removed = _remove_dead(graph, m.nodes)
        for node in removed:
            self.names.forget_node(node.name)
            for inp in node.inputs:
                if inp is not None and (producer := inp.producer()) is not None:
                    touched.append(producer)
        for node in b.nodes:
            if node.name:
                node.name = self.names.node(node.name)
        _keep_value_names(pairs, b)
        return touched


def _keep_value_names(pairs: list[tuple[ir.Value, ir.Value | None]], b: Builder) -> None:
    """A value the rewrite made takes the name of the value it replaced once that one is
    gone with its node (a lifted Constant "c" stays "c", not "c_1"), as a fused node takes
    the replaced node's name."""
    made = {id(v) for v in b.initializers} | {id(o) for n in b.nodes for o in n.outputs}
    for old, new in pairs:
        if new is None or id(new) not in made or not old.name or new.name == old.name:
            continue
        producer = old.producer()
        if producer is not None and producer.graph is not None:
            continue  # the replaced value's node is still there (another output is used)
        new.name = old.name
        made.discard(id(new))  # one name per value, when it replaced several


def _pairs(root: ir.Node, replacement: object) -> list[tuple[ir.Value, ir.Value | None]]:
    if isinstance(replacement, Mapping):
        return list(replacement.items())
    assert isinstance(replacement, Iterable)
    new_values = list(replacement)
    if len(new_values) > len(root.outputs):
        raise ValueError(f"rewrite of {root.op_type} returned too many values")
    new_values += [None] * (len(root.outputs) - len(new_values))
    return list(zip(root.outputs, new_values, strict=True))


def _commit_check(pairs: list[tuple[ir.Value, ir.Value | None]], graph: ir.Graph) -> str | None:
    """Refuse replacements that would leave a dangling use, put two outputs in one value,
    or make a graph's output a value of an enclosing graph (its outputs must be its own)."""
    for old, new in pairs:
        if new is None:
            if old.uses() or old.is_graph_output():
                return f"output {old.name!r} is still needed"
            continue
        if not old.is_graph_output():
            continue
        if new.is_graph_input() or new.is_graph_output() or new.is_initializer():
            return f"graph output {old.name!r} would become a graph input or initializer"
        producer = new.producer()
        owner = producer.graph if producer is not None else new.graph
        if owner is not None and owner is not graph:
            return f"graph output {old.name!r} would become a value of an enclosing graph"
    return None


def _remove_dead(graph: ir.Graph, nodes: Sequence[ir.Node]) -> list[ir.Node]:
    """Remove the matched nodes whose outputs nothing uses any more."""
    removed: list[ir.Node] = []
    pending = [n for n in nodes if n.graph is graph]
    changed = True
    while changed:
        changed = False
        for node in list(pending):
            if all(not out.uses() and not out.is_graph_output() for out in node.outputs):
                graph.remove(node, safe=True)
                pending.remove(node)
                removed.append(node)
                changed = True
    return removed
