"""The layout pass's main job: regions of layout-agnostic operators around Transposes,
each rewritten in the storage order that removes the most Transposes (see the package's docstring)."""

from __future__ import annotations

import onnx_ir as ir

from opfuse.rewrite.edit import replace_value
from opfuse.rewrite.pattern import const_array
from opfuse.rules._util import perm_of, rank
from opfuse.rules.layout._edit import LayoutEdit, producer_perm, tag
from opfuse.rules.layout._ops import (
    Perm,
    compose,
    data_inputs,
    inverse,
    is_identity,
    remap,
    stored_constant,
)

NOT_WORTH = "moving the Transposes through this region would not remove any"


class Regions:
    """Grows a region from each Transpose's neighbours and rewrites it when a storage
    order removes Transposes; ``count``: the regions rewritten."""

    def __init__(self, edit: LayoutEdit) -> None:
        self.edit = edit
        self.ctx = edit.ctx
        self.graph = edit.graph
        self.opset = edit.opset
        self.layout_perm = edit.layout_perm
        self.order = {id(n): i for i, n in enumerate(edit.graph)}
        self.visited: set[int] = set()
        self.count = 0

    def _eligible(self, node: ir.Node, n: int) -> list[int] | None:
        if id(node) in self.visited or id(node) not in self.order or node.graph is not self.graph:
            return None
        return data_inputs(node, n, self.opset)

    # ---- Transpose pairs -----------------------------------------------------------
    def run(self) -> None:
        for node in list(self.graph):
            if node.op_type != "Transpose" or node.graph is not self.graph:
                continue
            perm = perm_of(node)
            if perm is None or len(perm) < 2:
                continue
            n = len(perm)
            seeds: list[ir.Node] = [user for user, _ in node.outputs[0].uses()]
            producer = node.inputs[0].producer() if node.inputs[0] is not None else None
            if producer is not None:
                seeds.append(producer)
            for seed in seeds:
                if node.graph is not self.graph:
                    break
                if self._eligible(seed, n) is None:
                    continue
                region = self._grow(seed, n)
                self._try(region, n)

    def _grow(self, seed: ir.Node, n: int) -> dict[int, tuple[ir.Node, list[int]]]:
        """The connected layout-agnostic nodes around ``seed`` (node id -> node, data inputs)."""
        data = self._eligible(seed, n)
        assert data is not None
        region = {id(seed): (seed, data)}
        self.visited.add(id(seed))
        queue = [seed]
        while queue:
            node = queue.pop()
            for i in region[id(node)][1]:
                v = node.inputs[i]
                if v is None or rank(v) != n or const_array(v) is not None:
                    continue
                producer = v.producer()
                if producer is not None and (d := self._eligible(producer, n)) is not None:
                    region[id(producer)] = (producer, d)
                    self.visited.add(id(producer))
                    queue.append(producer)
            for out in node.outputs:
                if rank(out) != n:
                    continue
                for user, idx in out.uses():
                    d = self._eligible(user, n)
                    if d is not None and idx in d:
                        region[id(user)] = (user, d)
                        self.visited.add(id(user))
                        queue.append(user)
        return region

    def _inside(self, region: dict, user: ir.Node, idx: int) -> bool:
        entry = region.get(id(user))
        return entry is not None and idx in entry[1]

    def _entries(self, region: dict) -> dict[int, ir.Value]:
        entries: dict[int, ir.Value] = {}
        for node, data in region.values():
            for i in data:
                v = node.inputs[i]
                if v is None or const_array(v) is not None:
                    continue
                producer = v.producer()
                if producer is None or id(producer) not in region:
                    entries[id(v)] = v
        return entries

    def _entry_removable(self, region: dict, v: ir.Value) -> bool:
        """Every use of ``v`` is a region data input or a Shape (which is remapped)."""
        if v.is_graph_output():
            return False
        return all(self._inside(region, u, i) or u.op_type == "Shape" for u, i in v.uses())

    def _input_relayout(self, region: dict, v: ir.Value, s: Perm) -> bool:
        """Whether ``--layout`` lets graph input ``v`` be re-declared in stored order."""
        return (
            self.layout_perm is not None
            and self.graph is self.ctx.model.graph
            and v.is_graph_input()
            and not v.is_graph_output()
            and not v.is_initializer()
            and inverse(s) == self.layout_perm
            and all(self._inside(region, u, i) for u, i in v.uses())
        )

    def _cost(self, region: dict, s: Perm, entries: dict[int, ir.Value]) -> int | None:
        """Transposes added minus removed with storage order ``s``; None if impossible."""
        cost = 0
        for v in entries.values():
            if producer_perm(v) == s:
                cost -= self._entry_removable(region, v)
            elif not self._input_relayout(region, v, s):
                cost += 1
        for node, _ in region.values():
            r = remap(node, s, self.opset)
            if r is None:
                return None
            for out, t in zip(node.outputs, r.out_perms, strict=False):
                if t is None or is_identity(t):
                    continue
                materialize = out.is_graph_output()
                for user, idx in out.uses():
                    if self._inside(region, user, idx):
                        continue
                    if user.op_type == "Transpose" and (q := perm_of(user)) is not None:
                        cost -= is_identity(compose(t, q))
                    elif user.op_type != "Shape":
                        materialize = True
                cost += materialize
        return cost

    def _try(self, region: dict, n: int) -> None:
        entries = self._entries(region)
        candidates: list[Perm] = []
        for v in entries.values():
            p = producer_perm(v)
            if p is not None and len(p) == n:
                candidates.append(p)
            if self.layout_perm is not None and v.is_graph_input() and n == 4:
                candidates.append(inverse(self.layout_perm))
        for node, _ in region.values():
            for out in node.outputs:
                for user, _ in out.uses():
                    if user.op_type == "Transpose" and (q := perm_of(user)) and len(q) == n:
                        candidates.append(inverse(q))
        best: tuple[int, Perm] | None = None
        for s in dict.fromkeys(candidates):
            if is_identity(s):
                continue
            cost = self._cost(region, s, entries)
            if cost is not None and (best is None or cost < best[0]):
                best = (cost, s)
        if best is None:
            return
        first = min((node for node, _ in region.values()), key=lambda nd: self.order[id(nd)])
        self.ctx.record("transpose_region", matched=1)
        if best[0] >= 0:
            self.ctx.reason("transpose_region", NOT_WORTH, first)
            return
        self._apply(region, best[1], entries)
        self.ctx.record("transpose_region", effected=1)
        self.count += 1

    # ---- rewriting -----------------------------------------------------------------
    def _apply(self, region: dict, s: Perm, entries: dict[int, ir.Value]) -> None:
        nodes = sorted((nd for nd, _ in region.values()), key=lambda nd: self.order[id(nd)])
        inv = inverse(s)
        stored: dict[int, ir.Value] = {}
        entry_transposes: list[ir.Node] = []
        relayout: list[ir.Value] = []

        def entry_value(v: ir.Value, before: ir.Node) -> ir.Value:
            if id(v) in stored:
                return stored[id(v)]
            array = const_array(v)
            if array is not None:
                new = self.edit.const(stored_constant(array, s), f"{v.name or 'const'}_{tag(s)}")
            elif producer_perm(v) == s:
                producer = v.producer()
                assert producer is not None and producer.inputs[0] is not None
                new = producer.inputs[0]
                entry_transposes.append(producer)
            elif self._input_relayout(region, v, s):
                relayout.append(v)
                new = v
            else:
                t = self.edit.transpose(v, inv, v.name)
                self.graph.insert_before(before, t)
                new = t.outputs[0]
            if array is None:
                stored[id(v)] = new
            return new

        new_of: list[tuple[ir.Node, ir.Node, list[Perm | None]]] = []
        for node in nodes:
            r = remap(node, s, self.opset)
            assert r is not None
            data = region[id(node)][1]
            inputs: list[ir.Value | None] = []
            for i, v in enumerate(node.inputs):
                if v is None:
                    inputs.append(None)
                elif i in data:
                    known = stored.get(id(v))
                    inputs.append(known if known is not None else entry_value(v, node))
                elif i in r.params:
                    inputs.append(self.edit.const(r.params[i], f"{v.name or 'param'}_{tag(s)}"))
                elif i in r.gathers:
                    index = self.edit.const(r.gathers[i], f"{v.name or 'param'}_order")
                    out = self.edit.value(f"{v.name}_{tag(s)}", v)
                    gather = self.edit.node(
                        "Gather",
                        [v, index],
                        [ir.AttrInt64("axis", 0)],
                        outputs=[out],
                        name=self.edit.fresh_node_name(f"{node.name or 'layout'}/Gather"),
                    )
                    self.graph.insert_before(node, gather)
                    inputs.append(out)
                else:
                    inputs.append(v)
            attrs = [r.attrs.get(name, a) for name, a in node.attributes.items()]
            attrs += [a for name, a in r.attrs.items() if name not in node.attributes]
            outputs = []
            for out, t in zip(node.outputs, r.out_perms, strict=True):
                new_out = self.edit.value(out.name, out)
                if out.shape is not None:
                    dims = list(out.shape)
                    new_out.shape = ir.Shape(dims if t is None else [dims[j] for j in inverse(t)])
                outputs.append(new_out)
            new = self.edit.node(
                node.op_type,
                inputs,
                attrs,
                outputs=outputs,
                name=node.name,
                domain=node.domain,
                like=node,
            )
            self.graph.insert_before(node, new)
            new_of.append((node, new, r.out_perms))
            for out, new_out, t in zip(node.outputs, outputs, r.out_perms, strict=True):
                if t is not None and len(t) == len(s) and t == s:
                    stored[id(out)] = new_out
        for node, new, perms in new_of:
            for out, new_out, t in zip(node.outputs, new.outputs, perms, strict=True):
                self._exit(region, out, new_out, new, t)
        for v in entries.values():
            if producer_perm(v) == s and self._entry_removable(region, v):
                producer = v.producer()
                assert producer is not None and producer.inputs[0] is not None
                for user, _ in list(v.uses()):
                    if user.op_type == "Shape":
                        self.edit.remap_shape(user, producer.inputs[0], s)
        self.graph.remove(nodes, safe=True)
        for t_node in dict.fromkeys(entry_transposes):
            if t_node.graph is self.graph and not any(
                o.uses() or o.is_graph_output() for o in t_node.outputs
            ):
                self.graph.remove(t_node, safe=True)
        for v in dict.fromkeys(relayout):
            self.edit.relayout_input(v, inv)

    def _exit(
        self, region: dict, out: ir.Value, new_out: ir.Value, producer: ir.Node, t: Perm | None
    ) -> None:
        """Give the consumers outside the region the value they expect."""
        if t is None or is_identity(t):
            replace_value(out, new_out)
            return
        materialized: ir.Value | None = None

        def logical() -> ir.Value:
            nonlocal materialized
            if materialized is None:
                node = self.edit.transpose(new_out, t, out.name)
                self.graph.insert_after(producer, node)
                materialized = node.outputs[0]
            return materialized

        for user, idx in list(out.uses()):
            if self._inside(region, user, idx):
                continue
            if user.op_type == "Transpose" and (q := perm_of(user)) is not None:
                c = compose(t, q)
                if is_identity(c) and not (
                    user.outputs[0].is_graph_output() and new_out.is_graph_output()
                ):
                    replace_value(user.outputs[0], new_out)
                    self.graph.remove(user, safe=True)
                else:
                    user.replace_input_with(0, new_out)
                    user.attributes["perm"] = ir.AttrInt64s("perm", list(c))
            elif user.op_type == "Shape":
                self.edit.remap_shape(user, new_out, t)
            else:
                user.replace_input_with(idx, logical())
        if out.is_graph_output():
            replace_value(out, logical())
