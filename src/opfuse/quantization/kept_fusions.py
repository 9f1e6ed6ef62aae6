"""Which of onnxruntime's own fusions an int8 model keeps: the fused kernels of the graph
onnxruntime saves (``optimized_model_filepath`` at ORT_ENABLE_ALL, as ``opfuse tune`` and
``optimize --benchmark`` read it: ``runtime.fused``) for the float optimized model and for
the int8 model, compared kind by kind.

A transformer's float model runs SkipLayerNormalization, BiasGelu/Gelu and FusedMatMul
(the scaled Q.K^T) kernels; dynamic int8 keeps them (the Q/K/V projections become
MatMulIntegerToFloat, the others DynamicQuantizeMatMul; a BiasGelu's bias moves into the
int8 MatMul, leaving a Gelu), static QDQ loses them (QLinearAdd before the LayerNorm,
the GELU's Erf and Muls requantized, the Q.K^T a QLinearMatMul). A quantized form of a
fused kernel (QAttention) keeps its fusion. onnxruntime's session fuses no Attention at
opset 13 or later (its AttentionFusion matches the Unsqueeze of opsets 1-11 only);
its transformers optimizer does, and on all-MiniLM-L6-v2 (docs/QUANTIZATION.md, "Dynamic
int8") its forms that keep one are slower than ``dynamic``: the Attention float (its Q/K/V
weights float) 1.46-1.50x the dynamic model's time, QAttention 1.12-1.13x
(``python -m bench.quant_attention``)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from opfuse.errors import OpfuseError
from opfuse.quantization.steps import DYNAMIC
from opfuse.runtime.fused import lost_fusions, lost_text, runtime_kernels

# the lost kinds (runtime.fused.lost_fusions' names) dynamic int8 keeps on a transformer
TRANSFORMER_KERNELS = frozenset(
    {"Attention", "FusedMatMul", "Gelu", "LayerNormalization", "SkipLayerNormalization"}
)


@dataclass(frozen=True)
class KeptFusions:
    """onnxruntime's fused kernels by kind in the float optimized and the int8 model's
    saved graphs, and the kinds lost (``runtime.fused.lost_fusions``: kind -> (float,
    int8); a BiasGelu that became a Gelu, a LayerNormalization that became a Skip one and
    an Attention that became a QAttention are kept)."""

    float_kernels: dict[str, int]
    int8_kernels: dict[str, int]
    lost: dict[str, tuple[int, int]]

    def describe(self) -> str:
        """``onnxruntime's fused kernels (its saved graph, ORT_ENABLE_ALL), float
        optimized -> int8: Gelu 1 -> 0, SkipLayerNormalization 2 -> 0; lost: ...``; empty
        where neither model has one (an MLP: nothing to say)."""
        kinds = sorted(set(self.float_kernels) | set(self.int8_kernels))
        counts = ", ".join(
            f"{k} {self.float_kernels.get(k, 0)} -> {self.int8_kernels.get(k, 0)}" for k in kinds
        )
        head = (
            "onnxruntime's fused kernels (its saved graph, ORT_ENABLE_ALL), float optimized -> int8"
        )
        if not kinds:
            return ""
        verdict = f"lost: {lost_text(self.lost)}" if self.lost else "every fusion kept"
        return f"{head}: {counts}; {verdict}"

    def lost_cause(self, recipe: str) -> str:
        """The lost kernels as a cause of slow int8: each ran the ops it holds in one
        kernel; a transformer's (SkipLayerNormalization, Gelu, Attention) dynamic int8
        keeps, where the recipe was static."""
        text = (
            f"onnxruntime fuses fewer kernels from the int8 model than from the float "
            f"optimized one ({lost_text(self.lost)}): the ops they held run one by one."
        )
        if set(self.lost) & TRANSFORMER_KERNELS and DYNAMIC not in recipe.split(","):
            text += " On a transformer, --recipe dynamic keeps them."
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "float_optimized": self.float_kernels,
            "int8": self.int8_kernels,
            "lost": {k: list(v) for k, v in self.lost.items()},
        }


def kept_fusions(
    float_path: str | os.PathLike[str],
    int8_path: str | os.PathLike[str],
    provider: str = "CPUExecutionProvider",
    float_kernels: dict[str, int] | None = None,
) -> KeptFusions | str:
    """The fused kernels onnxruntime makes of the two files, compared (``float_kernels``:
    the float model's, when already read for another int8 model); where it cannot save
    its graph (an execution provider that does not), the reason, said in a note."""
    try:
        before: Counter[str] = (
            Counter(float_kernels)
            if float_kernels is not None
            else runtime_kernels(float_path, provider)
        )
        after: Counter[str] = runtime_kernels(int8_path, provider)
    except OpfuseError as exc:
        return f"onnxruntime's fused kernels not compared: {exc}"
    return KeptFusions(
        dict(sorted(before.items())), dict(sorted(after.items())), lost_fusions(before, after)
    )
