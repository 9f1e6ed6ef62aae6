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

A sub-package whose internals no other module imports (the import-linter contracts check
it): ``_ops`` (each operator under another axis order), ``_edit`` (the graph editor the
jobs share), ``_regions`` (the regions and their rewrite); the pass itself is here.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import PassContext
from opfuse.rewrite.edit import replace_value
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr, perm_of, rank
from opfuse.rules.layout._edit import LayoutEdit
from opfuse.rules.layout._ops import Perm, compose, is_identity
from opfuse.rules.layout._regions import Regions

MAX_SWEEPS = 4


# ---- Transpose pairs -------------------------------------------------------------------
def compose_pairs(edit: LayoutEdit) -> int:
    """Transpose(Transpose(x, p), q) ==> Transpose(x, p∘q), or x when that is identity."""
    count = 0
    for node in list(edit.graph):
        if node.op_type != "Transpose" or node.graph is not edit.graph:
            continue
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        if inner is None or inner.op_type != "Transpose" or inner.graph is not edit.graph:
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
            edit.graph.remove(node, safe=True)
        else:
            node.replace_input_with(0, x)
            node.attributes["perm"] = ir.AttrInt64s("perm", list(c))
        if not inner.outputs[0].uses() and not inner.outputs[0].is_graph_output():
            edit.graph.remove(inner, safe=True)
        count += 1
    return count


# ---- graph inputs (--layout) -----------------------------------------------------------
def absorb_input_transposes(edit: LayoutEdit) -> int:
    """With ``--layout``, a graph input read only through Transposes into that layout
    is re-declared in it: ``Transpose(x, p)`` ==> ``x'`` with ``x' = x`` transposed by p."""
    if edit.layout_perm is None or edit.graph is not edit.ctx.model.graph:
        return 0
    count = 0
    for v in list(edit.graph.inputs):
        if v.is_graph_output() or v.is_initializer() or rank(v) != len(edit.layout_perm):
            continue
        users = [u for u, _ in v.uses()]
        if not users or not all(
            u.op_type == "Transpose"
            and perm_of(u) == edit.layout_perm
            and u.graph is edit.graph
            and not u.outputs[0].is_graph_output()
            for u in users
        ):
            continue
        for user in dict.fromkeys(users):
            replace_value(user.outputs[0], v)
            edit.graph.remove(user, safe=True)
        edit.relayout_input(v, edit.layout_perm)
        count += 1
    return count


# ---- Transposes that only move axes of size 1 ------------------------------------------
def drop_unit_transposes(edit: LayoutEdit) -> int:
    """Reshape(Transpose(x, p), shape) ==> Reshape(x, shape) when the Transpose only
    moves axes of size 1 (the element order is unchanged), with the Transpose's Shape
    consumers remapped."""
    count = 0
    for node in list(edit.graph):
        if node.op_type != "Transpose" or node.graph is not edit.graph:
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
            (u.op_type == "Reshape" and i == 0 and _zero_safe(u, dims, perm))
            or u.op_type == "Shape"
            for u, i in users
        ):
            continue
        for user, i in users:
            if user.op_type == "Reshape":
                user.replace_input_with(i, x)
            else:
                edit.remap_shape(user, x, perm)
        edit.graph.remove(node, safe=True)
        count += 1
    return count


def reshape_unit_transposes(edit: LayoutEdit) -> int:
    """Transpose(Reshape(x, shape), p) ==> Reshape(x, shape') when the Transpose only
    moves axes of size 1 (Keras's squeeze-excite: the global pool's [N, C] reshaped to
    [N, 1, 1, C] on the channels-last side, then transposed to [N, C, 1, 1]): the
    element order is unchanged, so the pair is one Reshape. At most one dim of the
    result may be unknown (it becomes -1)."""
    count = 0
    for node in list(edit.graph):
        if node.op_type != "Transpose" or node.graph is not edit.graph:
            continue
        x, perm = node.inputs[0], perm_of(node)
        reshape = x.producer() if x is not None else None
        if x is None or perm is None or x.shape is None or reshape is None:
            continue
        if reshape.op_type != "Reshape" or reshape.graph is not edit.graph:
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
        shape = edit.const(np.array(target, dtype=np.int64), f"{base}_shape")
        out = edit.value(node.outputs[0].name, node.outputs[0])
        out.shape = node.outputs[0].shape
        merged = edit.node(
            "Reshape",
            [reshape.inputs[0], shape],
            outputs=[out],
            name=edit.fresh_node_name(f"{base}/Reshape"),
        )
        edit.graph.insert_before(node, merged)
        replace_value(node.outputs[0], out)
        edit.graph.remove(node, safe=True)
        edit.graph.remove(reshape, safe=True)
        count += 1
    return count


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


def optimize_layout(ctx: PassContext) -> None:
    """Per graph, sweeps (at most MAX_SWEEPS) of the four jobs until one changes nothing:
    Transpose pairs, re-declared inputs, unit Transposes, then regions."""
    for graph in list(ctx.graphs()):
        for _ in range(MAX_SWEEPS):
            edit = LayoutEdit(ctx, graph)
            pairs = compose_pairs(edit)
            inputs = absorb_input_transposes(edit)
            if inputs:
                ctx.record("input_transpose", matched=inputs, effected=inputs)
            units = drop_unit_transposes(edit) + reshape_unit_transposes(edit)
            if units:
                ctx.record("unit_transpose", matched=units, effected=units)
            if pairs:
                ctx.record("transpose_pair", matched=pairs, effected=pairs)
            regions = Regions(edit)
            regions.run()
            if not (pairs or units or inputs or regions.count):
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
