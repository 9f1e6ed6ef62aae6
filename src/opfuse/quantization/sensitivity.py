"""Which parts of a quantized model to try keeping in float, worst first.

Two measures, both in dB (lower: more error), so that one list ranks them:

- a weighted layer (Conv, MatMul, Gemm) quantized *alone*: the output SQNR of the model
  with only that layer's weights quantized (``run._quantize_gated`` measures it: one
  quantization per layer);
- an activation tensor: the SQNR of the tensor against its own quantize-dequantize with the
  scale and zero point the quantizer chose, on the float model's values (one float run for
  all of them, as onnxruntime's ``qdq_loss_debug`` compares activations). A tensor with
  outliers (attention scores, a Softmax's input, an Add of two branches of different
  ranges) scores low. Keeping it in float means keeping its producer and its readers in
  float: the quantizer puts a QuantizeLinear on a tensor that any of them reads or writes.

On PP-OCR's recognizer most of the error is in ops without weights (236 Add, Mul, MatMul,
Softmax... run between DequantizeLinear and QuantizeLinear), which the first measure
never sees."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from opfuse.quantization.trace import MAX_SAMPLES, sqnr_db, tensor_session


@dataclass(frozen=True)
class Candidate:
    """Nodes to keep in float together, and why they were picked."""

    label: str  # a node name, or "tensor NAME"
    nodes: tuple[str, ...]
    sqnr_db: float
    how: str  # "alone" (the layer quantized alone) or "own rounding" (the tensor's Q/DQ)


def activation_candidates(
    fused: str | os.PathLike[str],
    qdq: str | os.PathLike[str],
    samples: Sequence[dict[str, np.ndarray]],
) -> list[Candidate]:
    """Every activation tensor ``qdq`` quantizes, with the SQNR of its own rounding on the
    float model ``fused`` run on ``samples``, worst first."""
    quantized = _quantized_activations(onnx.load_model(str(qdq)))
    float_model = onnx.load_model(str(fused))
    graph = float_model.graph
    producer = {o: n.name for n in graph.node for o in n.output if n.name}
    readers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            if n.name:
                readers.setdefault(i, []).append(n.name)
    inputs = {i.name for i in graph.input}
    names = [t for t in quantized if t in producer or t in inputs]
    if not names:
        return []
    sess = tensor_session(float_model, names)
    wanted = [o.name for o in sess.get_outputs()]
    signal = dict.fromkeys(names, 0.0)
    noise = dict.fromkeys(names, 0.0)
    for sample in samples[:MAX_SAMPLES]:
        values = dict(zip(wanted, sess.run(wanted, sample), strict=True))
        for t in names:
            x = np.asarray(values[t], dtype=np.float64)
            scale, zero, low, high = quantized[t]
            rounded = (np.clip(np.round(x / scale) + zero, low, high) - zero) * scale
            signal[t] += float(np.sum(x**2))
            noise[t] += float(np.sum((x - rounded) ** 2))
    out = []
    for t in names:
        nodes = tuple(
            dict.fromkeys([*([producer[t]] if t in producer else []), *readers.get(t, [])])
        )
        if not nodes or noise[t] == 0:
            continue
        out.append(Candidate(f"tensor {t}", nodes, sqnr_db(signal[t], noise[t]), "own rounding"))
    return sorted(out, key=lambda c: c.sqnr_db)


def _quantized_activations(model: onnx.ModelProto) -> dict[str, tuple[float, float, int, int]]:
    """Tensor -> (scale, zero point, lowest, highest integer) of every per-tensor
    QuantizeLinear of an activation (not of a weight) in a QDQ model."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, tuple[float, float, int, int]] = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in inits or len(node.input) < 2:
            continue
        scale = inits.get(node.input[1])
        zero = inits.get(node.input[2]) if len(node.input) > 2 else None
        if scale is None or zero is None:
            continue
        s, z = numpy_helper.to_array(scale), numpy_helper.to_array(zero)
        if s.size != 1 or z.size != 1 or z.dtype.kind not in "iu":
            continue
        info = np.iinfo(z.dtype)
        out[node.input[0]] = (float(s.ravel()[0]), float(z.ravel()[0]), info.min, info.max)
    return out
