"""Which parts of a quantized model to try keeping in float, worst first.

Two measures, both the SQNR in dB of one rounding at one tensor (lower: more error), so
that one list ranks them (``fallback.py``):

- a weighted layer (Conv, MatMul, Gemm): its weight's int8 rounding at its own output,
  on the float model's values (``weight_candidates``: one float run for all of them);
- an activation tensor: the SQNR of the tensor against its own quantize-dequantize with the
  scale and zero point the quantizer chose, on the float model's values (one float run for
  all of them, as onnxruntime's ``qdq_loss_debug`` compares activations). A tensor with
  outliers (attention scores, a Softmax's input, an Add of two branches of different
  ranges) scores low. Keeping it in float means keeping its producer and its readers in
  float: the quantizer puts a QuantizeLinear on a tensor that any of them reads or writes.

On PP-OCR's recognizer most of the error is in ops without weights (236 Add, Mul, MatMul,
Softmax... run between DequantizeLinear and QuantizeLinear), which the first measure
never sees. (Until this release a layer was measured by the model's output SQNR with only
that layer quantized: one quantization per layer, minutes on the recognizer.)"""

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
    fused: str | os.PathLike[str] | onnx.ModelProto,
    qdq: str | os.PathLike[str] | onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
) -> list[Candidate]:
    """Every activation tensor ``qdq`` quantizes, with the SQNR of its own rounding on the
    float model ``fused`` run on ``samples``, worst first."""
    quantized = _quantized_activations(_proto(qdq))
    float_model = onnx.ModelProto()
    float_model.CopyFrom(_proto(fused))  # tensor_session adds outputs to it
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


def weight_candidates(
    model: onnx.ModelProto,
    layers: Sequence[str],
    samples: Sequence[dict[str, np.ndarray]],
    per_channel: bool = True,
) -> list[Candidate]:
    """Each weighted layer in ``layers`` by the SQNR, at its own output, of its weight's
    int8 rounding (symmetric, per output channel or per tensor, as the quantizer does it),
    on the float model's values: the layer is linear in its weight, so the error is the
    layer applied to (W - round(W)) without its bias; one clone per layer computes it, and
    one float run (up to MAX_SAMPLES samples) ranks them all. Worst first."""
    made = onnx.ModelProto()
    made.CopyFrom(model)
    graph = made.graph
    inits = {t.name: t for t in graph.initializer}
    pairs: dict[str, tuple[str, str]] = {}  # layer -> (its output, its error's)
    for node in list(graph.node):
        if node.name not in layers or len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        if w.size == 0 or w.dtype.kind != "f":
            continue
        delta = w - _rounded(w.astype(np.float64), _channel_axis(node), per_channel).astype(w.dtype)
        if not np.any(delta):
            continue
        # the delta and the error apart even where a node is named as its output (SmolLM2)
        err_w, err_out = f"{node.name}__weight_delta", f"{node.output[0]}__weight_error"
        graph.initializer.append(numpy_helper.from_array(delta, err_w))
        clone = onnx.NodeProto()
        clone.CopyFrom(node)
        clone.name = f"{node.name}__weight_error"
        del clone.input[2:]  # no bias: the error of the weight alone
        clone.input[1] = err_w
        del clone.output[:]
        clone.output.append(err_out)
        graph.node.append(clone)
        pairs[node.name] = (node.output[0], err_out)
    if not pairs:
        return []
    names = [n for pair in pairs.values() for n in pair]
    sess = tensor_session(made, names)
    signal = dict.fromkeys(pairs, 0.0)
    noise = dict.fromkeys(pairs, 0.0)
    for sample in samples[:MAX_SAMPLES]:
        values = dict(zip(names, sess.run(names, sample), strict=True))
        for layer, (out, err) in pairs.items():
            signal[layer] += float(np.sum(np.asarray(values[out], np.float64) ** 2))
            noise[layer] += float(np.sum(np.asarray(values[err], np.float64) ** 2))
    found = [
        Candidate(layer, (layer,), sqnr_db(signal[layer], noise[layer]), "weight rounding")
        for layer in pairs
        if noise[layer] > 0
    ]
    return sorted(found, key=lambda c: c.sqnr_db)


def _channel_axis(node: onnx.NodeProto) -> int:
    """The weight's output-channel axis: Conv 0, ConvTranspose 1, MatMul the last, Gemm
    0 with transB else 1."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        return 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
    return 1 if node.op_type == "ConvTranspose" else -1


def _rounded(w: np.ndarray, axis: int, per_channel: bool) -> np.ndarray:
    """Symmetric int8 quantize-dequantize of a weight."""
    if per_channel and w.ndim >= 2:
        moved = np.moveaxis(w, axis, 0)
        peak = np.max(np.abs(moved.reshape(moved.shape[0], -1)), axis=1)
        shape = [1] * w.ndim
        shape[axis] = -1
        scale = (peak / 127.0).reshape(shape)
    else:
        scale = np.asarray(np.max(np.abs(w)) / 127.0)
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(w / scale), -127, 127) * scale


def _proto(model: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load_model(str(model))
