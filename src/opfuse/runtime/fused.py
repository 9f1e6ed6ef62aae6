"""The fused kernels onnxruntime makes from a model at ORT_ENABLE_ALL, read from the graph
it saves with ``optimized_model_filepath``, and the fusions an optimized model lost:
opfuse must never break what the runtime fuses (Gelu, FusedConv, LayerNormalization...)."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from opfuse.model.sessions import open_session

# onnxruntime's fused kernels (contrib ops and the ONNX ops its fusions produce)
FUSED_OPS = frozenset(
    {
        "Attention",
        "BiasAdd",
        "BiasDropout",
        "BiasGelu",
        "BiasSoftmax",
        "EmbedLayerNormalization",
        "FastGelu",
        "FusedConv",
        "FusedGemm",
        "FusedMatMul",
        "Gelu",
        "GemmFastGelu",
        "GroupNorm",
        "LayerNormalization",
        "MultiHeadAttention",
        "QuickGelu",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
    }
)
# the fused kernels' quantized forms (onnxruntime's dynamic quantizer makes QAttention of an
# Attention): an int8 model that holds one keeps the fusion
QUANTIZED_FUSED = {
    "QAttention": "Attention",
    "QEmbedLayerNormalization": "EmbedLayerNormalization",
}
# kernels that absorb one another: a model may reach the same speed through either
SAME_KERNEL = {
    **QUANTIZED_FUSED,
    "SkipLayerNormalization": "LayerNormalization",
    "SkipSimplifiedLayerNormalization": "SimplifiedLayerNormalization",
    "BiasGelu": "Gelu",
    "FastGelu": "Gelu",
    "GemmFastGelu": "Gelu",
}


def runtime_kernels(
    path: str | os.PathLike[str], provider: str = "CPUExecutionProvider"
) -> Counter[str]:
    """Fused kernels onnxruntime makes from ``path`` at ORT_ENABLE_ALL, by op type."""
    with tempfile.TemporaryDirectory(prefix="opfuse-kernels-") as tmp:
        saved = Path(tmp) / "optimized.onnx"
        open_session(
            path,
            provider=provider,
            threads=1,
            inter_threads=1,
            execution_mode="sequential",
            graph_opt="all",
            optimized_path=saved,
        )
        graph = onnx.load_model(str(saved), load_external_data=False).graph
        return Counter(kind for node in graph.node if (kind := _kernel(node)) is not None)


def _kernel(node: onnx.NodeProto) -> str | None:
    """The fused kernel a saved node is, if any (an NCHWc Conv with an activation is a
    FusedConv in another layout)."""
    if node.op_type in FUSED_OPS or node.op_type in QUANTIZED_FUSED:
        return node.op_type
    if node.op_type == "Conv" and any(a.name == "activation" for a in node.attribute):
        return "FusedConv"
    return None


# kernels that hold another op besides the one they count as (the Add of the residual):
# fewer of them is a fusion lost even where their kind is not
ABSORBING = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")


def lost_fusions(before: Counter[str], after: Counter[str]) -> dict[str, tuple[int, int]]:
    """Kernel kinds the output has fewer of than the original: kind -> (before, after).
    Kernels that absorb one another (SkipLayerNormalization holds a LayerNormalization)
    count as their kind, and SkipLayerNormalization on its own too: fewer of it means
    onnxruntime no longer fuses the Add before the LayerNormalization."""

    def kinds(counts: Counter[str]) -> Counter[str]:
        merged: Counter[str] = Counter()
        for op, n in counts.items():
            merged[SAME_KERNEL.get(op, op)] += n
        return merged

    b, a = kinds(before), kinds(after)
    lost = {op: (b[op], a[op]) for op in sorted(b) if a[op] < b[op]}
    for op in ABSORBING:
        if after[op] < before[op] and SAME_KERNEL[op] not in lost:
            lost[op] = (before[op], after[op])
    return lost


def lost_text(lost: dict[str, tuple[int, int]]) -> str:
    """``Gelu 18 -> 0, FusedConv 3 -> 1``"""
    return ", ".join(f"{op} {b} -> {a}" for op, (b, a) in lost.items())
