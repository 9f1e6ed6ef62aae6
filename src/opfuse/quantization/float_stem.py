"""The stem kept in float (the ``float-stem`` step): the leading layers of a network, up to
a small share of its multiply-adds, and the element-wise ops between them stay out of
quantization.

A detector's stem runs at the highest resolutions (1/2 and 1/4 of the input) with few
channels whose ranges differ by an order of magnitude, and what it rounds reaches the map
the detector draws its boxes from. Measured on PP-OCRv4's text detector
(docs/QUANTIZATION_MEASUREMENTS.md, "Measured: where the detector's map IoU is lost"): weights are not the cause (int8 weights
with 16-bit activations keep 97.5% map IoU), the activations are, and the stem's most: its
first Conv's output alone at uint8 takes the map IoU to 67%, the stem's tensors quantized per
channel instead of per tensor take it from 73% to 94%; onnxruntime's int8 kernels take one
scale per activation tensor, so the stem's layers stay in float: 6 Conv layers, 7% of the
multiply-adds.

``stem_nodes(model, feed)``: the weighted layers (Conv, ConvTranspose, MatMul, Gemm) taken
in graph order while their multiply-adds (with the shapes of ``feed``, one sample) stay
within ``share`` of the model's, and every node the first layer not taken depends on that
comes before it in graph order (the element-wise ops between the layers: activations, the
affine blocks); node names, as ``--exclude`` takes them. Nothing (an empty list) when the
first weighted layer alone is more than ``share``, or when every one would be taken (a model
that small is the stem). Nothing of the float model changes (exact): the first quantized
layer's input is quantized at the stem's last tensor, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from opfuse.model.graphs import proto_wiring
from opfuse.quantization.kernels import compute_macs, with_input_shapes

STEM_SHARE = 0.08  # of the model's multiply-adds (PP-OCRv4's detector: 6 layers, 7.3%)
WEIGHTED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def stem_nodes(
    model: onnx.ModelProto,
    feed: Mapping[str, np.ndarray] | None = None,
    share: float = STEM_SHARE,
) -> list[str]:
    """The names of the stem's nodes in graph order (see the module's docstring)."""
    return leading_nodes(model, feed, (share,))[0]


def leading_nodes(
    model: onnx.ModelProto,
    feed: Mapping[str, np.ndarray] | None,
    shares: Sequence[float],
) -> list[list[str]]:
    """``stem_nodes`` for each of ``shares``, the multiply-adds counted once."""
    graph = model.graph
    macs = compute_macs(with_input_shapes(model, feed) if feed else model)
    layers = [(i, n) for i, n in enumerate(graph.node) if n.op_type in WEIGHTED]
    total = sum(macs.get(n.name or f"{n.op_type}#{i}", 0) for i, n in layers)
    if len(layers) < 2 or total <= 0:
        return [[] for _ in shares]
    producer, _ = proto_wiring(graph)
    index = {id(n): i for i, n in enumerate(graph.node)}
    return [_before(graph, layers, macs, share * total, producer, index) for share in shares]


def _before(
    graph: onnx.GraphProto,
    layers: list[tuple[int, onnx.NodeProto]],
    macs: Mapping[str, int],
    budget: float,
    producer: Mapping[str, onnx.NodeProto],
    index: Mapping[int, int],
) -> list[str]:
    """The nodes before the first weighted layer past ``budget`` multiply-adds that it
    depends on (nothing when that is the first layer, or no layer is past it)."""
    taken = 0
    for i, n in layers:
        taken += macs.get(n.name or f"{n.op_type}#{i}", 0)
        if taken > budget:
            boundary = i
            break
    else:
        return []
    if boundary == layers[0][0]:
        return []
    seen: set[int] = set()
    stack = [x for x in graph.node[boundary].input if x]
    while stack:
        node = producer.get(stack.pop())
        if node is None or id(node) in seen or index[id(node)] >= boundary:
            continue
        seen.add(id(node))
        stack.extend(x for x in node.input if x)
    return [n.name for i, n in enumerate(graph.node) if id(n) in seen and n.name and i < boundary]
