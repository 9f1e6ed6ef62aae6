"""LayoutTransposeFusionPass: Transposes pushed through layout-agnostic operators until
they meet and cancel (Grappler's layout optimizer, for NHWC models exported to ONNX).

Why a graph function over regions rather than push-down rules: a push-down rule sees one
operator, and a single step often has to add a Transpose that only pays off several
operators later (a squeeze-excite branch reads the same tensor as the main path). A
region is a connected set of layout-agnostic operators (elementwise, broadcast with
constants, Pad, Reduce*, Concat/Split, Resize, Softmax...); its boundary says exactly how
many Transposes a storage order ``s`` removes (Transposes entering with perm ``s``,
leaving with its inverse) and how many it needs (other entries and exits). The region
is rewritten only when the count goes down, so the pass never adds Transposes. Each sweep
visits every node a bounded number of times: linear in the graph.

Inside a region a value ``v`` is stored as ``v'`` with ``v = transpose(v', s)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from opfuse.graphs import INPUT_PERMUTATION_KEY
from opfuse.passes._layout_ops import (
    Perm,
    compose,
    data_inputs,
    inverse,
    is_identity,
    remap,
    stored_constant,
)
from opfuse.passes._util import DEFAULT_DOMAINS, attr, perm_of, rank, static_shape
from opfuse.registry import PassInfo, register
from opfuse.rewrite import PassContext
from opfuse.rewrite.builder import NameScope
from opfuse.rewrite.edit import add_initializer, replace_value
from opfuse.rewrite.pattern import const_array

MAX_SWEEPS = 4
# --layout: how an image input is re-declared, as the perm from the original layout
LAYOUT_INPUT_PERM: dict[str, Perm] = {"nchw": (0, 3, 1, 2), "nhwc": (0, 2, 3, 1)}
NOT_WORTH = "moving the Transposes through this region would not remove any"


def _producer_perm(value: ir.Value) -> Perm | None:
    node = value.producer()
    if node is None or node.op_type != "Transpose" or node.domain not in DEFAULT_DOMAINS:
        return None
    return perm_of(node)


class _Sweep:
    """One pass over a graph: compose Transpose pairs, then grow and rewrite regions."""

    def __init__(self, ctx: PassContext, graph: ir.Graph) -> None:
        self.ctx = ctx
        self.graph = graph
        self.opset = ctx.opset
        self.names = NameScope(ctx.model)
        self.order = {id(n): i for i, n in enumerate(graph)}
        self.visited: set[int] = set()
        self.layout_perm = LAYOUT_INPUT_PERM.get(ctx.options.layout)
        self.regions = 0
        self.pairs = 0
        self.units = 0
        self.inputs = 0

    # ---- helpers -------------------------------------------------------------------
    def _value(self, base: str | None, like: ir.Value | None = None) -> ir.Value:
        value = ir.Value(name=self.names.value(base or "layout"))
        if like is not None and like.dtype is not None:
            value.dtype = like.dtype
        return value

    def _transpose(self, x: ir.Value, perm: Perm, base: str | None) -> ir.Node:
        out = self._value(f"{base or x.name}_transposed", x)
        if x.shape is not None:
            out.shape = ir.Shape([x.shape[p] for p in perm])
        return ir.Node(
            "",
            "Transpose",
            [x],
            [ir.AttrInt64s("perm", list(perm))],
            outputs=[out],
            name=self.names.node(f"{base or 'layout'}/Transpose"),
        )

    def _const(self, array: np.ndarray, base: str) -> ir.Value:
        return add_initializer(self.graph, self.names, array, base)

    def _eligible(self, node: ir.Node, n: int) -> list[int] | None:
        if id(node) in self.visited or id(node) not in self.order or node.graph is not self.graph:
            return None
        return data_inputs(node, n, self.opset)

    # ---- Transpose pairs -----------------------------------------------------------
    def compose_pairs(self) -> None:
        """Transpose(Transpose(x, p), q) ==> Transpose(x, p∘q), or x when that is identity."""
        for node in list(self.graph):
            if node.op_type != "Transpose" or node.graph is not self.graph:
                continue
            inner = node.inputs[0].producer() if node.inputs[0] is not None else None
            if inner is None or inner.op_type != "Transpose" or inner.graph is not self.graph:
                continue
            p, q = perm_of(inner), perm_of(node)
            if p is None or q is None or len(p) != len(q):
                continue
            c = compose(p, q)
            x = inner.inputs[0]
            assert x is not None
            out = node.outputs[0]
            fixed = x.is_graph_input() or x.is_graph_output() or x.is_initializer()
            if is_identity(c) and not (out.is_graph_output() and fixed):
                replace_value(out, x)
                self.graph.remove(node, safe=True)
            else:
                node.replace_input_with(0, x)
                node.attributes["perm"] = ir.AttrInt64s("perm", list(c))
            if not inner.outputs[0].uses() and not inner.outputs[0].is_graph_output():
                self.graph.remove(inner, safe=True)
            self.pairs += 1

    def absorb_input_transposes(self) -> None:
        """With ``--layout``, a graph input read only through Transposes into that layout
        is re-declared in it: ``Transpose(x, p)`` ==> ``x'`` with ``x' = x`` transposed by p."""
        if self.layout_perm is None or self.graph is not self.ctx.model.graph:
            return
        for v in list(self.graph.inputs):
            if v.is_graph_output() or v.is_initializer() or rank(v) != len(self.layout_perm):
                continue
            users = [u for u, _ in v.uses()]
            if not users or not all(
                u.op_type == "Transpose"
                and perm_of(u) == self.layout_perm
                and u.graph is self.graph
                and not u.outputs[0].is_graph_output()
                for u in users
            ):
                continue
            for user in dict.fromkeys(users):
                replace_value(user.outputs[0], v)
                self.graph.remove(user, safe=True)
            self._relayout_input(v, self.layout_perm)
            self.inputs += 1

    def drop_unit_transposes(self) -> None:
        """Reshape(Transpose(x, p), shape) ==> Reshape(x, shape) when the Transpose only
        moves axes of size 1 (the element order is unchanged), with the Transpose's Shape
        consumers remapped."""
        for node in list(self.graph):
            if node.op_type != "Transpose" or node.graph is not self.graph:
                continue
            x, out, perm = node.inputs[0], node.outputs[0], perm_of(node)
            if x is None or perm is None or x.shape is None or out.is_graph_output():
                continue
            dims = list(x.shape)
            moved = [p for p in perm if dims[p] != 1]
            if moved != sorted(moved) or not out.uses():
                continue
            users = list(out.uses())
            if not all(
                (u.op_type == "Reshape" and i == 0 and self._zero_safe(u, dims, perm))
                or u.op_type == "Shape"
                for u, i in users
            ):
                continue
            for user, i in users:
                if user.op_type == "Reshape":
                    user.replace_input_with(i, x)
                else:
                    self._remap_shape(user, x, perm)
            self.graph.remove(node, safe=True)
            self.units += 1

    def reshape_unit_transposes(self) -> None:
        """Transpose(Reshape(x, shape), p) ==> Reshape(x, shape') when the Transpose only
        moves axes of size 1 (Keras's squeeze-excite: the global pool's [N, C] reshaped to
        [N, 1, 1, C] on the channels-last side, then transposed to [N, C, 1, 1]): the
        element order is unchanged, so the pair is one Reshape. At most one dim of the
        result may be unknown (it becomes -1)."""
        for node in list(self.graph):
            if node.op_type != "Transpose" or node.graph is not self.graph:
                continue
            x, perm = node.inputs[0], perm_of(node)
            reshape = x.producer() if x is not None else None
            if x is None or perm is None or x.shape is None or reshape is None:
                continue
            if reshape.op_type != "Reshape" or reshape.graph is not self.graph:
                continue
            if len(x.uses()) != 1 or x.is_graph_output():
                continue
            dims = list(x.shape)
            if [p for p in perm if dims[p] != 1] != sorted(p for p in perm if dims[p] != 1):
                continue
            target = _unit_target([dims[p] for p in perm])
            if target is None:
                continue
            base = node.name or "layout"
            shape = self._const(np.array(target, dtype=np.int64), f"{base}_shape")
            out = self._value(node.outputs[0].name, node.outputs[0])
            out.shape = node.outputs[0].shape
            merged = ir.Node(
                "",
                "Reshape",
                [reshape.inputs[0], shape],
                outputs=[out],
                name=self.names.node(f"{base}/Reshape"),
            )
            self.graph.insert_before(node, merged)
            replace_value(node.outputs[0], out)
            self.graph.remove(node, safe=True)
            self.graph.remove(reshape, safe=True)
            self.units += 1

    @staticmethod
    def _zero_safe(reshape: ir.Node, dims: list, perm: Perm) -> bool:
        """A 0 in the target shape copies the input's dim at its position: safe when
        allowzero is set, or the position's dim is the same with or without the Transpose,
        or the target value there is a known non-zero constant."""
        if attr(reshape, "allowzero", 0):
            return True
        target = _known_entries(reshape.inputs[1])
        if target is None:
            return False
        for i, value in enumerate(target):
            if value is not None and value != 0:
                continue
            if i >= len(dims) or dims[perm[i]] != dims[i]:
                return False
        return True

    # ---- regions -------------------------------------------------------------------
    def regions_from_transposes(self) -> None:
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
            if _producer_perm(v) == s:
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
            p = _producer_perm(v)
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
        self.regions += 1

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
                new = self._const(stored_constant(array, s), f"{v.name or 'const'}_{_tag(s)}")
            elif _producer_perm(v) == s:
                producer = v.producer()
                assert producer is not None and producer.inputs[0] is not None
                new = producer.inputs[0]
                entry_transposes.append(producer)
            elif self._input_relayout(region, v, s):
                relayout.append(v)
                new = v
            else:
                t = self._transpose(v, inv, v.name)
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
                    inputs.append(self._const(r.params[i], f"{v.name or 'param'}_{_tag(s)}"))
                elif i in r.gathers:
                    index = self._const(r.gathers[i], f"{v.name or 'param'}_order")
                    out = self._value(f"{v.name}_{_tag(s)}", v)
                    gather = ir.Node(
                        "", "Gather", [v, index], [ir.AttrInt64("axis", 0)], outputs=[out]
                    )
                    gather.name = self.names.node(f"{node.name or 'layout'}/Gather")
                    self.graph.insert_before(node, gather)
                    inputs.append(out)
                else:
                    inputs.append(v)
            attrs = [r.attrs.get(name, a) for name, a in node.attributes.items()]
            attrs += [a for name, a in r.attrs.items() if name not in node.attributes]
            outputs = []
            for out, t in zip(node.outputs, r.out_perms, strict=True):
                new_out = self._value(out.name, out)
                if out.shape is not None:
                    dims = list(out.shape)
                    new_out.shape = ir.Shape(dims if t is None else [dims[j] for j in inverse(t)])
                outputs.append(new_out)
            new = ir.Node(
                node.domain,
                node.op_type,
                inputs,
                attrs,
                outputs=outputs,
                name=node.name,
                doc_string=node.doc_string,
                metadata_props=dict(node.metadata_props),
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
            if _producer_perm(v) == s and self._entry_removable(region, v):
                producer = v.producer()
                assert producer is not None and producer.inputs[0] is not None
                for user, _ in list(v.uses()):
                    if user.op_type == "Shape":
                        self._remap_shape(user, producer.inputs[0], s)
        self.graph.remove(nodes, safe=True)
        for t_node in dict.fromkeys(entry_transposes):
            if t_node.graph is self.graph and not any(
                o.uses() or o.is_graph_output() for o in t_node.outputs
            ):
                self.graph.remove(t_node, safe=True)
        for v in dict.fromkeys(relayout):
            self._relayout_input(v, inv)

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
                node = self._transpose(new_out, t, out.name)
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
                self._remap_shape(user, new_out, t)
            else:
                user.replace_input_with(idx, logical())
        if out.is_graph_output():
            replace_value(out, logical())

    def _remap_shape(self, shape: ir.Node, stored_value: ir.Value, t: Perm) -> None:
        """Shape(transpose(stored, t)) ==> Gather(Shape(stored), t[start:end]), or the
        constant shape when it is static."""
        logical = shape.inputs[0]
        start, end = attr(shape, "start", 0), attr(shape, "end")
        index = list(t)[slice(start, end)]
        out = shape.outputs[0]
        dims = static_shape(logical)
        if dims is not None and not out.is_graph_output():
            const = self._const(np.array(dims, dtype=np.int64)[start:end], f"{out.name}_const")
            out.replace_all_uses_with(const)
            self.graph.remove(shape, safe=True)
            return
        new_shape = ir.Node("", "Shape", [stored_value], outputs=[self._value(out.name, out)])
        new_shape.name = self.names.node(f"{shape.name or 'layout'}_stored")
        order = self._const(np.array(index, dtype=np.int64), f"{out.name}_order")
        gathered = self._value(out.name, out)
        gathered.shape = out.shape
        gather = ir.Node(
            "",
            "Gather",
            [new_shape.outputs[0], order],
            [ir.AttrInt64("axis", 0)],
            outputs=[gathered],
            name=shape.name,
        )
        self.graph.insert_before(shape, [new_shape, gather])
        replace_value(out, gathered)
        self.graph.remove(shape, safe=True)

    def _relayout_input(self, v: ir.Value, perm: Perm) -> None:
        """Re-declare graph input ``v`` transposed by ``perm`` and say so."""
        old = list(v.shape) if v.shape is not None else None
        if old is not None:
            v.shape = ir.Shape([old[p] for p in perm])
        props = self.ctx.model.metadata_props
        perms = json.loads(props.get(INPUT_PERMUTATION_KEY, "{}"))
        before = perms.get(v.name)
        perms[v.name] = list(compose(before, perm)) if before else list(perm)
        props[INPUT_PERMUTATION_KEY] = json.dumps(perms, sort_keys=True)
        shape = "x".join(str(d) for d in (v.shape or []))
        self.ctx.notes.append(
            f"input {v.name!r} is now {self.ctx.options.layout.upper()} ({shape}): feed it "
            f"transposed by perm {list(perm)}"
        )


def _known_entries(value: ir.Value | None) -> list[int | None] | None:
    """The entries of a 1-D shape tensor where known (None for a run-time entry): a
    constant, or a Concat of constants and 1-element run-time pieces."""
    if value is None:
        return None
    array = const_array(value)
    if array is not None:
        return [int(a) for a in array.reshape(-1)]
    node = value.producer()
    if node is None or node.op_type != "Concat":
        return None
    entries: list[int | None] = []
    for piece in node.inputs:
        part = const_array(piece)
        if part is not None:
            entries.extend(int(a) for a in part.reshape(-1))
        elif piece is not None and piece.shape is not None and list(piece.shape) == [1]:
            entries.append(None)
        else:
            return None
    return entries


def _unit_target(dims: list) -> list[int] | None:
    """A Reshape target for ``dims``: static dims as they are, one unknown dim as -1;
    None for two unknown dims or a zero dim (-1 would be ambiguous)."""
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(unknown) > 1 or any(isinstance(d, int) and d == 0 for d in dims):
        return None
    return [d if isinstance(d, int) else -1 for d in dims]


def _tag(s: Iterable[int]) -> str:
    return "p" + "".join(str(i) for i in s)


def optimize_layout(ctx: PassContext) -> None:
    for graph in list(ctx.graphs()):
        for _ in range(MAX_SWEEPS):
            sweep = _Sweep(ctx, graph)
            sweep.compose_pairs()
            sweep.absorb_input_transposes()
            if sweep.inputs:
                ctx.record("input_transpose", matched=sweep.inputs, effected=sweep.inputs)
            sweep.drop_unit_transposes()
            sweep.reshape_unit_transposes()
            if sweep.units:
                ctx.record("unit_transpose", matched=sweep.units, effected=sweep.units)
            if sweep.pairs:
                ctx.record("transpose_pair", matched=sweep.pairs, effected=sweep.pairs)
            sweep.order = {id(n): i for i, n in enumerate(graph)}
            sweep.regions_from_transposes()
            if not (sweep.pairs or sweep.units or sweep.inputs or sweep.regions):
                break


register(
    PassInfo(
        "LayoutTransposeFusionPass",
        "Cancel inverse Transpose pairs and push Transposes through elementwise, broadcast, "
        "Pad, Reduce, Concat/Split, Resize and Softmax regions until they cancel; never adds "
        "Transposes (--layout nchw|nhwc may re-declare an image input)",
        run=optimize_layout,
    )
)
