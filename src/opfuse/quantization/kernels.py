"""How much of a quantized model onnxruntime actually runs in integer kernels: a
machine-independent measure read from the graph onnxruntime saves after its load-time
QDQ fusion (``optimized_model_filepath`` at ORT_ENABLE_EXTENDED), where a Conv between
DequantizeLinear and QuantizeLinear became a QLinearConv, a MatMul a QLinearMatMul or
MatMulInteger, and what it could not fuse stays a float op between DQ and Q.

``integer_fraction`` weighs the model's Conv/MatMul/Gemm nodes (and the integer compute
ops it already holds) by their multiply-adds and gives the share that runs in integer
kernels: a model that quantized 90% of its nodes but left its largest layer in float
(excluded, or an op the runtime could not fuse) says so."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from opfuse.model.sessions import open_session
from opfuse.model.shapes import infer_proto

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
COMPUTE_OPS = frozenset({"Conv", "MatMul", "Gemm", "ConvTranspose"})
# integer kernels of the weighted ops (what a quantized Conv/MatMul/Gemm becomes)
INTEGER_COMPUTE_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearConvTranspose",
        "ConvInteger",
        "QGemm",
        "QLinearMatMul",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QAttention",
        "MatMulNBits",  # weight-only int4 (its products in int8 at accuracy_level 4)
    }
)
# every integer kernel onnxruntime has (QLinear* are matched by prefix)
INTEGER_OPS = INTEGER_COMPUTE_OPS | {
    "DynamicQuantizeLinear",
    "DynamicQuantizeLSTM",
    "QEmbedLayerNormalization",
    "QOrderedMatMul",
}


def is_integer_op(op_type: str) -> bool:
    return op_type in INTEGER_OPS or op_type.startswith("QLinear")


@dataclass
class KernelCoverage:
    """Integer kernels and float ops between DQ and Q in onnxruntime's fused graph."""

    integer_ops: dict[str, int] = field(default_factory=dict)
    float_between_qdq: dict[str, int] = field(default_factory=dict)
    integer_fraction: float = 0.0  # share of the Conv/MatMul/Gemm multiply-adds in int8
    total_macs: int = 0
    float_nodes: list[str] = field(default_factory=list)  # names of float ops between DQ and Q

    def describe(self) -> str:
        if not self.total_macs and not self.integer_ops:
            return "no quantized Conv/MatMul/Gemm: nothing runs in integer kernels"
        ints = ", ".join(f"{op} {n}" for op, n in sorted(self.integer_ops.items())) or "none"
        floats = ", ".join(f"{op} {n}" for op, n in sorted(self.float_between_qdq.items()))
        text = (
            f"{self.integer_fraction:.0%} of the Conv/MatMul/Gemm multiply-adds run "
            f"in integer kernels (integer kernels: {ints})"
        )
        if floats:
            text += f"; float ops left between DequantizeLinear and QuantizeLinear: {floats}"
        return text


def integer_coverage(
    model: onnx.ModelProto,
    providers: Sequence[str] | None = None,
    feed: Mapping[str, np.ndarray] | None = None,
) -> KernelCoverage:
    """Load ``model`` in onnxruntime (level extended: its QDQ fusions, not the layout
    changes of ``all``), read the graph it saves and count its integer kernels. Compute
    nodes are matched by name (onnxruntime's QDQ fusions keep the float node's name).
    ``feed``: a sample whose shapes count the multiply-adds (a symbolic height and width
    would count as 1 pixel: every layer by its weight's size alone)."""
    fused = fused_graph(model, providers)
    macs = compute_macs(with_input_shapes(model, feed) if feed else model)
    integer_names = {n.name for n in fused.node if n.op_type in INTEGER_COMPUTE_OPS and n.name}
    total = sum(macs.values())
    in_int = sum(m for name, m in macs.items() if name in integer_names)
    floats = float_between_qdq(fused)
    return KernelCoverage(
        integer_ops=dict(Counter(n.op_type for n in fused.node if is_integer_op(n.op_type))),
        float_between_qdq=dict(Counter(n.op_type for n in floats)),
        integer_fraction=in_int / total if total else 0.0,
        total_macs=total,
        float_nodes=[n.name for n in floats],
    )


def fused_graph(model: onnx.ModelProto, providers: Sequence[str] | None = None) -> onnx.GraphProto:
    """The main graph onnxruntime runs after its load-time fusions (level extended)."""
    with tempfile.TemporaryDirectory(prefix="opfuse-int8-") as tmp:
        source, saved = Path(tmp) / "model.onnx", Path(tmp) / "fused.onnx"
        onnx.save_model(model, str(source))
        open_session(
            source,
            provider=list(providers or ["CPUExecutionProvider"]),
            threads=1,
            inter_threads=1,
            execution_mode="sequential",
            graph_opt="extended",
            optimized_path=saved,
            name="",  # a staged copy: its path says nothing
        )
        return onnx.load_model(str(saved), load_external_data=False).graph


def quantized_compute(graph: onnx.GraphProto) -> list[str]:
    """Names of the Conv/MatMul/Gemm nodes a DequantizeLinear feeds, and of the
    integer compute ops the model already holds (QOperator or dynamic quantization)."""
    dq_outputs = {out for n in graph.node if n.op_type == DEQUANTIZE for out in n.output}
    names = []
    for node in graph.node:
        if node.op_type in INTEGER_COMPUTE_OPS or (
            node.op_type in COMPUTE_OPS and any(i in dq_outputs for i in node.input)
        ):
            names.append(node.name)
    return names


def float_between_qdq(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes other than Q/DQ with an input from a DequantizeLinear of an activation (not
    of a constant weight) and an output into a QuantizeLinear: float work the runtime
    left between a dequantize and a quantize."""
    constants = {t.name for t in graph.initializer}
    dq_act = {
        n.output[0]
        for n in graph.node
        if n.op_type == DEQUANTIZE and n.input and n.input[0] not in constants
    }
    q_inputs = {n.input[0] for n in graph.node if n.op_type == QUANTIZE and n.input}
    return [
        n
        for n in graph.node
        if n.op_type not in (QUANTIZE, DEQUANTIZE)
        and any(i in dq_act for i in n.input)
        and any(o in q_inputs for o in n.output)
    ]


def compute_macs(model: onnx.ModelProto) -> dict[str, int]:
    """Multiply-adds of each Conv/MatMul/Gemm (and integer compute op) by node name, from
    the inferred shapes; an unknown (symbolic) dim counts as 1."""
    inferred = infer_proto(model)
    graph = inferred.graph
    shapes: dict[str, list[int]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
    for t in graph.initializer:
        shapes[t.name] = list(t.dims)
    # a weight behind a DequantizeLinear has the shape of the DQ's input
    for n in graph.node:
        if n.op_type == DEQUANTIZE and n.input and n.input[0] in shapes:
            shapes.setdefault(n.output[0], shapes[n.input[0]])
    macs = {}
    for i, node in enumerate(graph.node):
        if node.op_type not in COMPUTE_OPS and node.op_type not in INTEGER_COMPUTE_OPS:
            continue
        macs[node.name or f"{node.op_type}#{i}"] = _node_macs(node, shapes)
    return macs


def _node_macs(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    # the weight is input 1 (Conv, MatMul, Gemm, ConvInteger, MatMulInteger) or input 3
    # (QLinearConv, QLinearMatMul, QGemm: x, x_scale, x_zero_point, w, ...)
    w_index = 3 if node.op_type.startswith("QLinear") or node.op_type == "QGemm" else 1
    out = shapes.get(node.output[0]) if node.output else None
    weight = shapes.get(node.input[w_index]) if len(node.input) > w_index else None
    if not weight:
        return 0
    if node.op_type == "ConvTranspose":  # every input pixel meets Cout/group x kernel weights
        x = shapes.get(node.input[0]) if node.input else None
        if x and len(x) >= 2:
            return math.prod(x[:1] + x[2:]) * math.prod(weight)
        return math.prod(weight)
    if node.op_type in ("Conv", "ConvInteger", "QLinearConv"):
        cout = weight[0]
        per_out = math.prod(weight) // max(cout, 1)  # Cin/group x kernel
        return math.prod(out) * per_out if out else math.prod(weight)
    # MatMul-like: output elements x the reduced dim (K = the weight's second-to-last dim;
    # a Gemm with transB=1 has it last)
    trans_b = any(a.name == "transB" and a.i for a in node.attribute)
    k = weight[-1] if trans_b else (weight[-2] if len(weight) >= 2 else weight[0])
    return math.prod(out) * k if out else math.prod(weight)


def with_input_shapes(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have the shapes of ``feed``'s arrays (a
    symbolic height and width would count as 1 in the multiply-adds)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        value = feed.get(vi.name)
        if value is None or not vi.type.HasField("tensor_type"):
            continue
        shape = vi.type.tensor_type.shape
        if len(shape.dim) != np.ndim(value):
            continue
        for dim, size in zip(shape.dim, np.shape(value), strict=True):
            dim.Clear()
            dim.dim_value = int(size)
    return fixed
