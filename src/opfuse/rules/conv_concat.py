"""Horizontal Conv fusion (CANN's ConvConcatFusionPass), as in Inception/GoogLeNet branches.

Sibling Convs that read the same input with the same kernel size, strides, pads,
dilations and group 1 become one Conv whose weights are theirs stacked along the output
channels. Its output is Split back into the siblings' outputs, or, when the siblings
feed one Concat on the channel axis at consecutive positions, takes their place in it:

    Conv(x, W1, b1), Conv(x, W2, b2)  ==>  Split(Conv(x, [W1; W2], [b1; b2]), [m1, m2], axis=1)

Every output channel is computed from the same products as before (a bias that only
some siblings have is zero in the others), though the runtime may sum them in another
order for a wider Conv: results can differ in the last ulp.

A function pass, not a rule: it runs after the rule passes before it reached their
fixpoint, so BatchNormalization is folded into each sibling before they are merged.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import PassContext
from opfuse.rewrite.builder import NameScope
from opfuse.rewrite.edit import add_initializer, replace_value
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import DEFAULT_DOMAINS, attr

PATTERN = "conv_concat"
DIFFER = "sibling Convs differ in kernel, strides, pads or dilations"


def conv_key(conv: ir.Node, w: np.ndarray) -> tuple:
    """What must be equal for two Convs on one input to merge."""
    k = w.ndim - 2
    return (
        tuple(w.shape[1:]),
        w.dtype,
        tuple(attr(conv, "strides", None) or [1] * k),
        tuple(attr(conv, "pads", None) or [0] * (2 * k)),
        tuple(attr(conv, "dilations", None) or [1] * k),
        attr(conv, "auto_pad", "NOTSET"),
    )


def mergeable(conv: ir.Node) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """The constant weight and bias of a Conv that may merge, or why it may not."""
    if attr(conv, "group", 1) != 1:
        return None, None, "Conv is grouped"
    w = const_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None:
        return None, None, "Conv weight is not constant"
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    b = const_array(bias) if bias is not None else None
    if bias is not None and b is None:
        return None, None, "Conv bias is not constant"
    return w, b, None


def concat_slot(convs: list[ir.Node], rank: int) -> tuple[ir.Node, int, list[ir.Node]] | None:
    """The Concat on the channel axis that reads exactly these Convs' outputs at
    consecutive positions, its first such position, and the Convs in that order."""
    users = [list(c.outputs[0].uses()) for c in convs]
    if any(
        len(u) != 1 or c.outputs[0].is_graph_output() for c, u in zip(convs, users, strict=True)
    ):
        return None
    concat = users[0][0][0]
    if concat.op_type != "Concat" or any(u[0][0] is not concat for u in users):
        return None
    if attr(concat, "axis") not in (1, 1 - rank):
        return None
    slots = sorted((u[0][1], c) for c, u in zip(convs, users, strict=True))
    first = slots[0][0]
    if [s for s, _ in slots] != list(range(first, first + len(convs))):
        return None
    return concat, first, [c for _, c in slots]


class Merger:
    def __init__(self, ctx: PassContext) -> None:
        self.ctx = ctx
        self.names = NameScope(ctx.graphs())

    def const(self, graph: ir.Graph, array: np.ndarray, base: str) -> ir.Value:
        return add_initializer(graph, self.names, array, base)

    def merge(self, graph: ir.Graph, convs: list[ir.Node], weights: dict) -> None:
        first = convs[0]  # in graph order: the merged Conv goes where the first one was
        slot = concat_slot(convs, weights[id(first)][0].ndim)
        if slot is not None:
            convs = slot[2]
        ws = [weights[id(c)][0] for c in convs]
        has_bias = any(weights[id(c)][1] is not None for c in convs)
        base = first.name or "conv"
        inputs: list[ir.Value | None] = [
            first.inputs[0],
            self.const(graph, np.concatenate(ws, axis=0), f"{base}.weight_concat"),
        ]
        if has_bias:
            biases = [
                b if b is not None else np.zeros(w.shape[0], w.dtype)
                for w, (_, b) in zip(ws, (weights[id(c)] for c in convs), strict=True)
            ]
            inputs.append(self.const(graph, np.concatenate(biases), f"{base}.bias_concat"))
        attrs = {k: a for k, a in first.attributes.items() if k != "kernel_shape"}
        attrs["kernel_shape"] = ir.AttrInt64s("kernel_shape", list(ws[0].shape[2:]))
        merged = ir.node("Conv", inputs, attrs, name=self.names.node(f"{base}_concat"))
        merged.outputs[0].name = self.names.value(f"{base}_concat_out")
        new_nodes = [merged]
        sizes = [int(w.shape[0]) for w in ws]
        if slot is not None:
            concat, pos = slot[0], slot[1]
            ins = list(concat.inputs)
            ins[pos : pos + len(convs)] = [merged.outputs[0]]
            new_concat = ir.node("Concat", ins, dict(concat.attributes), name=concat.name)
            graph.insert_before(first, new_nodes)
            graph.insert_before(concat, [new_concat])
            replace_value(concat.outputs[0], new_concat.outputs[0])
            graph.remove(concat, safe=True)
        else:
            if self.ctx.opset >= 13:
                split_sizes = self.const(graph, np.array(sizes, np.int64), f"{base}.split")
                split = ir.node(
                    "Split",
                    [merged.outputs[0], split_sizes],
                    {"axis": 1},
                    num_outputs=len(convs),
                    name=self.names.node(f"{base}_split"),
                )
            else:
                split = ir.node(
                    "Split",
                    [merged.outputs[0]],
                    {"axis": 1, "split": sizes},
                    num_outputs=len(convs),
                    name=self.names.node(f"{base}_split"),
                )
            for conv, out in zip(convs, split.outputs, strict=True):
                out.name = self.names.value(f"{conv.outputs[0].name or base}_split")
            new_nodes.append(split)
            graph.insert_before(first, new_nodes)
            for conv, out in zip(convs, split.outputs, strict=True):
                replace_value(conv.outputs[0], out)
        for conv in convs:
            graph.remove(conv, safe=True)
            self.names.forget_node(conv.name)


def fuse_sibling_convs(ctx: PassContext) -> None:
    merger = Merger(ctx)
    ctx.record(PATTERN)
    for graph in list(ctx.graphs()):
        siblings: dict[int, list[ir.Node]] = defaultdict(list)
        for node in graph:
            if node.op_type == "Conv" and node.domain in DEFAULT_DOMAINS and node.inputs[0]:
                siblings[id(node.inputs[0])].append(node)
        for convs in siblings.values():
            if len(convs) < 2:
                continue
            ctx.record(PATTERN, matched=1)
            weights: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
            by_key: dict[tuple, list[ir.Node]] = defaultdict(list)
            for conv in convs:
                w, b, reason = mergeable(conv)
                if reason or w is None:
                    ctx.reason(PATTERN, reason or "", conv)
                    continue
                weights[id(conv)] = (w, b)
                by_key[conv_key(conv, w)].append(conv)
            groups = [g for g in by_key.values() if len(g) > 1]
            if len(weights) > 1:  # each mergeable Conv that no sibling matches
                for alone in (g[0] for g in by_key.values() if len(g) == 1):
                    ctx.reason(PATTERN, DIFFER, alone)
            for group in groups:
                merger.merge(graph, group, weights)
                ctx.record(PATTERN, effected=1)


register(
    PassInfo(
        "ConvConcatFusionPass",
        "Merge sibling Convs on one input (same kernel, strides, pads, dilations) into one "
        "Conv, split back or feeding their Concat",
        run=fuse_sibling_convs,
        default=False,
        note="off by default: exact, but on onnxruntime CPU the extra Split made googlenet "
        "1-9% and keras_resnet50 5% slower (scripts/latency.py, ORT_ENABLE_ALL); it pays on "
        "accelerators with wide matrix units, as CANN's pass of the same name does",
    )
)
