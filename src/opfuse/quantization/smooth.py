"""SmoothQuant (Xiao et al. 2023) on the float model before quantization: an activation with
outlier channels, read by MatMul/Gemm layers with constant weights, is divided per channel by
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and the weights' input rows j multiplied by s_j,
so one per-tensor int8 scale of X no longer spends its range on a few channels; the weights,
quantized per channel or at least with room to spare, take the difference.

X / s is folded into X's producer where that is exact (a LayerNormalization's scale and
bias; a Mul, Div or Add by a constant, through to the tensor before it; a MatMul/Gemm with a
constant weight: its output columns). Only a tensor whose every reader is a smoothable layer
is folded into its producer, and only through tensors read by one node that are not graph
outputs. Elsewhere, with ``insert_mul``, a Mul by 1 / s is inserted before the readers that
are smoothed (X stays as it was for any other reader); it is off by default because
onnxruntime's QDQ quantizer quantizes that Mul's input X too, outliers and all, so the int8
model gains little or loses (measured: a Gemm on a graph input with 4 outlier channels of 32,
per-tensor SQNR 10.5 -> 11.0 dB; the zoo's mobilenet_v2 classifier Gemm after Flatten,
32.6 -> 15.1 dB, the weights' rows having taken the spread). An activation is smoothed when max_j max|X_j| >= min_outlier_ratio x
the median over channels (statistics of the calibration samples, one sample at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opfuse.model.graphs import DEFAULT_DOMAINS
from opfuse.quantization._stats import Feed
from opfuse.quantization.equalize import (
    Graph,
    Layer,
    as_layer,
    attr_int,
    channel_stats,
)

SCALE_LIMIT = 1e5


def readers_of(g: Graph, node: onnx.NodeProto) -> Layer | None:
    """``node`` as a layer whose input rows may be scaled (X is its input A, channels last)."""
    if node.op_type not in ("MatMul", "Gemm"):
        return None
    layer = as_layer(g, node)
    if layer is None or (node.op_type == "Gemm" and attr_int(node, "transA", 0)):
        return None
    return layer


@dataclass
class Edit:
    """One constant to rewrite: input ``slot`` of ``node`` becomes ``value``."""

    node: onnx.NodeProto
    slot: int
    value: np.ndarray


def fold_plan(g: Graph, tensor: str, s: np.ndarray, depth: int = 0) -> list[Edit] | None:
    """The constant edits that make ``tensor`` come out divided by ``s`` (per last-axis
    channel) exactly, or None where its producer cannot take it."""
    node = g.producer.get(tensor)
    if node is None or depth > 8 or node.domain not in DEFAULT_DOMAINS:
        return None
    op = node.op_type
    k = len(s)
    if op == "LayerNormalization" and node.output[0] == tensor:
        axis = attr_int(node, "axis", -1)
        scale = g.const(node.input[1])
        if axis != -1 or scale is None or scale.shape != (k,):
            return None
        edits = [Edit(node, 1, scale / s)]
        if len(node.input) > 2 and node.input[2]:
            bias = g.const(node.input[2])
            if bias is None or bias.shape != (k,):
                return None
            edits.append(Edit(node, 2, bias / s))
        return edits
    if op in ("Mul", "Div", "Add") and len(node.input) == 2:
        consts = [g.const(name) for name in node.input]
        slot = next((i for i, c in enumerate(consts) if c is not None), None)
        if slot is None or consts[1 - slot] is not None:
            return None
        c = consts[slot]
        assert c is not None
        if c.ndim >= 1 and c.shape[-1] not in (1, k):
            return None
        if op == "Mul":
            return [Edit(node, slot, c / s)]
        if op == "Div":
            return [Edit(node, slot, c * s)] if slot == 1 else None
        before = node.input[1 - slot]  # Add: (y + c) / s = y / s + c / s
        if not g.single_use(before, node):
            return None
        rest = fold_plan(g, before, s, depth + 1)
        return None if rest is None else [Edit(node, slot, c / s), *rest]
    if op in ("MatMul", "Gemm") and node.output[0] == tensor:
        layer = as_layer(g, node)  # the weight only: an Add after it was handled above
        if layer is None:
            return None
        w = layer.weight(g)
        if layer.out_channels(w) != k:
            return None
        shape = [1, 1]
        shape[layer.out_axis()] = -1
        edits = [Edit(node, layer.w_slot, w / s.reshape(shape))]
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            c = g.const(node.input[2])
            assert c is not None  # as_layer checked it
            edits.append(Edit(node, 2, c / s))
        return edits
    return None


def _groups(g: Graph) -> dict[str, list[Layer]]:
    """Activation tensor -> the MatMul/Gemm layers reading it that smoothing can scale."""
    groups: dict[str, list[Layer]] = {}
    for node in g.nodes:
        layer = readers_of(g, node)
        if layer is None or not node.input[0] or node.input[0] in node.input[1:]:
            continue
        if layer.in_channels(layer.weight(g)) < 2:
            continue
        groups.setdefault(node.input[0], []).append(layer)
    return groups


def _foldable(g: Graph, tensor: str, layers: list[Layer]) -> bool:
    """Every reader of ``tensor`` is one of ``layers`` and it is not a graph output."""
    readers = g.consumers.get(tensor, [])
    return (
        tensor not in g.outputs
        and len(readers) == len(layers)
        and g.uses.get(tensor) == len(layers)
    )


def smoothable(model: onnx.ModelProto, *, insert_mul: bool = False) -> list[str]:
    """The activations ``smooth`` could smooth if the samples show outliers (cheap: no
    session; for a step's ``applies``)."""
    g = Graph(model)
    found = []
    for tensor, layers in _groups(g).items():
        k = layers[0].in_channels(layers[0].weight(g))
        if insert_mul or (
            _foldable(g, tensor, layers) and fold_plan(g, tensor, np.ones(k)) is not None
        ):
            found.append(tensor)
    return found


def smooth(
    model: onnx.ModelProto,
    samples: Sequence[Feed],
    *,
    alpha: float = 0.5,
    min_outlier_ratio: float = 4.0,
    insert_mul: bool = False,
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every activation that has outlier channels smoothed into the
    weights of the MatMul/Gemm layers reading it (see the module); and how many layers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = Graph(out)
    groups = _groups(g)
    if not groups or not samples:
        return out, 0
    stats = channel_stats(model, samples, dict.fromkeys(groups, -1))
    count = 0
    inserted: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []  # (new Mul, before this node)
    for tensor, layers in groups.items():
        st = stats.get(tensor)
        if st is None:
            continue
        amax = st.max_abs
        ws = [layer.weight(g) for layer in layers]
        if any(layer.in_channels(w) != len(amax) for layer, w in zip(layers, ws, strict=True)):
            continue
        median = float(np.median(amax))
        peak = float(amax.max())
        if peak <= 0 or (median > 0 and peak < min_outlier_ratio * median):
            continue
        wmax = np.max([layer.in_range(w) for layer, w in zip(layers, ws, strict=True)], axis=0)
        s = np.ones_like(amax)
        ok = (amax > 0) & (wmax > 0)
        s[ok] = amax[ok] ** alpha / wmax[ok].astype(np.float64) ** (1 - alpha)
        s = np.clip(s, 1 / SCALE_LIMIT, SCALE_LIMIT)
        plan = fold_plan(g, tensor, s) if _foldable(g, tensor, layers) else None
        if plan is not None:
            for edit in plan:
                g.write(edit.node, edit.slot, edit.value)
        elif not insert_mul:
            continue
        else:
            first = min(layers, key=lambda layer: g.nodes.index(layer.node)).node
            inserted.append((_insert_mul(g, tensor, s, layers), first))
        for layer in layers:
            layer.scale_in(g, s.astype(np.float32))
        count += len(layers)
    if inserted:
        nodes = list(out.graph.node)
        for mul, before in inserted:
            nodes.insert(nodes.index(before), mul)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
    g.commit()
    return out, count


def _insert_mul(g: Graph, tensor: str, s: np.ndarray, layers: list[Layer]) -> onnx.NodeProto:
    """Mul(tensor, 1 / s) feeding ``layers`` in place of ``tensor``."""
    const = g.fresh(f"{tensor}_smooth_scale")
    smoothed = g.fresh(f"{tensor}_smoothed")
    name = g.fresh(f"{layers[0].node.name or tensor}_smooth")
    g.node_names.add(name)
    g.model.graph.initializer.append(numpy_helper.from_array((1 / s).astype(np.float32), const))
    g.uses[const] = 1
    for layer in layers:
        layer.node.input[0] = smoothed
    return helper.make_node("Mul", [tensor, const], [smoothed], name=name)
