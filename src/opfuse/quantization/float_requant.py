"""Requantizations onnxruntime's form can drop (the ``float-requant`` step): the
QuantizeLinear -> DequantizeLinear pairs of tensors that an element-wise or data-moving
op makes (Add, Mul, Resize, Concat, a HardSigmoid, ...) and that no Conv/ConvTranspose/
MatMul/Gemm reads. onnxruntime's QDQ fusion turns DequantizeLinear -> Conv ->
QuantizeLinear into QLinearConv; that needs the Q *after* a compute op and the Q/DQ on
its inputs, not the requantization of the element-wise ops between two compute ops. Each
such requantization is one more rounding (and one more clipping at the calibrated range):
without it the op runs in float between the DequantizeLinear of its inputs and the
QuantizeLinear of the next compute op's input.

``requantized_passthroughs(model, float_model)`` names those tensors; ``drop_requant``
returns the model without their pairs (the readers take the float tensor: no float op
changes, exact in float). A tensor whose producer onnxruntime's quantizer removed (a
Relu/Clip folded into the QuantizeLinear's saturation: the float model has it, the int8
model not, and the producer's output took its name) keeps its pair: there the pair is the
activation. So does a pair whose DequantizeLinear output is a graph output (the heads'
business, ``heads.py``).

Measured (docs/QUANTIZATION_MEASUREMENTS.md, "Measured: fewer requantizations"): magika's byte classifier 96.1%
-> 100% top-1 and 19.5 -> 31.2 dB, and faster (0.73x -> 0.60x the float model); no gain
on PP-OCRv4's recognizer and a collapse of the detector's score map (its evaluation images
drive the neck beyond the calibrated ranges, which these requantizations clipped): a
recipe step, chosen by measurement, never a default.
"""

from __future__ import annotations

import onnx

from opfuse.model.graphs import DEFAULT_DOMAINS, proto_wiring

COMPUTE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"


def requantized_passthroughs(
    model: onnx.ModelProto, float_model: onnx.ModelProto
) -> dict[str, tuple[onnx.NodeProto, list[onnx.NodeProto]]]:
    """Tensor -> (its QuantizeLinear, the DequantizeLinear nodes reading it) for each pair
    ``drop_requant`` removes from ``model`` (a QDQ model made from ``float_model``)."""
    graph = model.graph
    names = {n.name for n in graph.node}
    folded = {o for n in float_model.graph.node if n.name not in names for o in n.output}
    producer, readers = proto_wiring(graph)
    outputs = {o.name for o in graph.output}
    found: dict[str, tuple[onnx.NodeProto, list[onnx.NodeProto]]] = {}
    for q in graph.node:
        if q.op_type != QUANTIZE or not q.input or q.domain not in DEFAULT_DOMAINS:
            continue
        tensor = q.input[0]
        made_by = producer.get(tensor)
        if made_by is None or made_by.op_type in COMPUTE or made_by.op_type == DEQUANTIZE:
            continue
        if tensor in folded or tensor in found:
            continue
        dqs = readers.get(q.output[0], [])
        if not dqs or any(d.op_type != DEQUANTIZE or d.output[0] in outputs for d in dqs):
            continue
        if any(r.op_type in COMPUTE for d in dqs for r in readers.get(d.output[0], [])):
            continue
        found[tensor] = (q, dqs)
    return found


def drop_requant(
    model: onnx.ModelProto, float_model: onnx.ModelProto
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` without the pairs ``requantized_passthroughs`` names, and their
    count (the same model, a copy, and 0 when there are none)."""
    found = requantized_passthroughs(model, float_model)
    made = onnx.ModelProto()
    made.CopyFrom(model)
    if not found:
        return made, 0
    drop: set[str] = set()
    rename: dict[str, str] = {}
    for tensor, (q, dqs) in found.items():
        drop.add(q.output[0])
        for d in dqs:
            drop.add(d.output[0])
            rename[d.output[0]] = tensor
    kept = [n for n in made.graph.node if not (n.output and n.output[0] in drop)]
    gone = {name for n in made.graph.node if n.output and n.output[0] in drop for name in n.input}
    for node in kept:
        for k, name in enumerate(node.input):
            node.input[k] = rename.get(name, name)
    del made.graph.node[:]
    made.graph.node.extend(kept)
    # the scales and zero points only the removed pairs read (a subgraph's reads count)
    used = _names_read(made.graph) | {i.name for i in made.graph.input}
    inits = [t for t in made.graph.initializer if t.name not in gone or t.name in used]
    del made.graph.initializer[:]
    made.graph.initializer.extend(inits)
    return made, len(found)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of ``graph`` or of its subgraphs (If, Loop, Scan) reads."""
    found: set[str] = set()
    for node in graph.node:
        found.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                found |= _names_read(sub)
    return found
