"""Editing a graph for the layout pass: the ``GraphEditor`` plus what the pass's jobs
share (a Transpose, a remapped Shape, a re-declared input)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from opfuse.model.graphs import INPUT_PERMUTATION_KEY
from opfuse.rewrite import PassContext
from opfuse.rewrite.builder import NameScope
from opfuse.rewrite.edit import GraphEditor, replace_value
from opfuse.rules._util import DEFAULT_DOMAINS, attr, perm_of, static_shape
from opfuse.rules.layout._ops import Perm, compose

# --layout: how an image input is re-declared, as the perm from the original layout
LAYOUT_INPUT_PERM: dict[str, Perm] = {"nchw": (0, 3, 1, 2), "nhwc": (0, 2, 3, 1)}


def producer_perm(value: ir.Value) -> Perm | None:
    """The permutation of the Transpose that makes ``value``, else None."""
    node = value.producer()
    if node is None or node.op_type != "Transpose" or node.domain not in DEFAULT_DOMAINS:
        return None
    return perm_of(node)


def tag(s: Iterable[int]) -> str:
    return "p" + "".join(str(i) for i in s)


class LayoutEdit(GraphEditor):
    """One sweep's edits of one graph (fresh names across the model for the sweep)."""

    def __init__(self, ctx: PassContext, graph: ir.Graph) -> None:
        super().__init__(graph, NameScope(ctx.graphs()), stem="layout")
        self.ctx = ctx
        self.opset = ctx.opset
        self.layout_perm = LAYOUT_INPUT_PERM.get(ctx.options.layout)

    def transpose(self, x: ir.Value, perm: Perm, base: str | None) -> ir.Node:
        out = self.value(f"{base or x.name}_transposed", x)
        if x.shape is not None:
            out.shape = ir.Shape([x.shape[p] for p in perm])
        return self.node(
            "Transpose",
            [x],
            [ir.AttrInt64s("perm", list(perm))],
            outputs=[out],
            name=self.fresh_node_name(f"{base or 'layout'}/Transpose"),
        )

    def remap_shape(self, shape: ir.Node, stored_value: ir.Value, t: Perm) -> None:
        """Shape(transpose(stored, t)) ==> Gather(Shape(stored), t[start:end]), or the
        constant shape when it is static."""
        logical = shape.inputs[0]
        start, end = attr(shape, "start", 0), attr(shape, "end")
        index = list(t)[slice(start, end)]
        out = shape.outputs[0]
        dims = static_shape(logical)
        if dims is not None and not out.is_graph_output():
            const = self.const(np.array(dims, dtype=np.int64)[start:end], f"{out.name}_const")
            out.replace_all_uses_with(const)
            self.graph.remove(shape, safe=True)
            return
        new_shape = self.node(
            "Shape",
            [stored_value],
            outputs=[self.value(out.name, out)],
            name=self.fresh_node_name(f"{shape.name or 'layout'}_stored"),
        )
        order = self.const(np.array(index, dtype=np.int64), f"{out.name}_order")
        gathered = self.value(out.name, out)
        gathered.shape = out.shape
        gather = self.node(
            "Gather",
            [new_shape.outputs[0], order],
            [ir.AttrInt64("axis", 0)],
            outputs=[gathered],
            name=shape.name,
        )
        self.graph.insert_before(shape, [new_shape, gather])
        replace_value(out, gathered)
        self.graph.remove(shape, safe=True)

    def relayout_input(self, v: ir.Value, perm: Perm) -> None:
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
