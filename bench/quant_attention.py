"""Dynamic int8 forms of a trained encoder and onnxruntime's fused kernels (issue 42, item
2): does a form that keeps onnxruntime's Attention beat opfuse's ``dynamic``?

    python -m bench.quant_attention [--seconds 60] [--reverse] [--work DIR]

The encoder is bench.quant_transformers' all-MiniLM-L6-v2 (downloaded into its ignored
folder, never committed; the forms go into ``attention/`` there), 128 tokens, timed on its first held-out sentence. The forms:
- ``opfuse-dynamic``: ``opfuse.quantize(..., recipe="minmax,dynamic")`` (the Q/K/V
  projections MatMulIntegerToFloat, the other MatMuls DynamicQuantizeMatMul);
- ``ort-attention-float``: onnxruntime's transformers optimizer (bert: Attention,
  SkipLayerNormalization, EmbedLayerNormalization, BiasGelu), then ``quantize_dynamic``
  of the MatMuls only, per channel, symmetric (the Attention and its Q/K/V weights float);
- ``ort-qattention``: the same optimizer, then ``quantize_dynamic`` of MatMul and
  Attention, per tensor (Attention becomes QAttention);
- ``ort-no-attention``: the optimizer with its Attention fusion off, then the MatMuls as in
  ``ort-attention-float``;
- ``ort-fused-float``: the optimizer's float model.

Printed: per form the fused kernels of onnxruntime's saved graph (ORT_ENABLE_ALL), the
embedding figures on the held-out sentences against the float model, and the latency
against the float original and against ``opfuse-dynamic`` (paired, interleaved by
``opfuse.tuning.measure``, one thread, the original twice for the noise), with the load
before and after. ``--reverse`` runs the schedule in the other order (a confirmation)."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.quant_transformers import OUT, embedding_figures, embeddings, loadavg, prepare

ENCODER = "minilm_l6"
OPFUSE = "opfuse-dynamic"
KERNELS = ("Attention", "QAttention", "SkipLayerNormalization", "LayerNormalization",
           "EmbedLayerNormalization", "BiasGelu", "Gelu", "FusedMatMul",
           "DynamicQuantizeMatMul", "MatMulIntegerToFloat")  # fmt: skip


def ort_forms(src: Path, work: Path, config: dict[str, Any]) -> dict[str, Path]:
    """The onnxruntime transformers optimizer's forms (its Python fusions: opt_level 0;
    its symbolic shape inference before quantize_dynamic, which needs the contrib ops'
    output types)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    def optimized(name: str, attention: bool) -> Path:
        options = FusionOptions("bert")
        options.enable_attention = attention
        opt = optimize_model(str(src), model_type="bert", opt_level=0,
                             num_heads=config["num_attention_heads"],
                             hidden_size=config["hidden_size"], optimization_options=options)  # fmt: skip
        path = work / f"{name}.onnx"
        opt.save_model_to_file(str(path))
        shaped = SymbolicShapeInference.infer_shapes(onnx.load(str(path)), auto_merge=True)
        onnx.save(shaped, str(path))
        return path

    def dynamic(src: Path, name: str, per_channel: bool, ops: list[str]) -> Path:
        out = work / f"{name}.onnx"
        extra = {"MatMulConstBOnly": True, "WeightSymmetric": True}
        quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=per_channel,
                         op_types_to_quantize=ops, extra_options=extra)  # fmt: skip
        return out

    fused, plain = optimized("ort-fused-float", True), optimized("ort-no-attention-float", False)
    return {
        "ort-attention-float": dynamic(fused, "ort-attention-float", True, ["MatMul"]),
        "ort-qattention": dynamic(fused, "ort-qattention", False, ["MatMul", "Attention"]),
        "ort-no-attention": dynamic(plain, "ort-no-attention", True, ["MatMul"]),
        "ort-fused-float": fused,
    }


def opfuse_dynamic(src: Path, out: Path, calibration: list[dict[str, np.ndarray]]) -> Path:
    import opfuse

    opfuse.quantize(src, out, calibration=calibration, recipe="minmax,dynamic", benchmark=False,
                    max_drop="off")  # fmt: skip
    return out


def kernels(path: Path) -> dict[str, int]:
    """The op types of onnxruntime's saved graph (ORT_ENABLE_ALL) among KERNELS."""
    import tempfile

    import onnx

    from opfuse.model.sessions import open_session

    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "saved.onnx"
        open_session(path, graph_opt="all", optimized_path=saved)
        ops = Counter(n.op_type for n in onnx.load(str(saved), load_external_data=False).graph.node)
    return {k: ops[k] for k in KERNELS if ops[k]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import measure

    src, calibration, held, config = prepare(ENCODER, Path(args.work))
    work = Path(args.work) / "attention"
    work.mkdir(parents=True, exist_ok=True)
    forms = {OPFUSE: opfuse_dynamic(src, work / f"{OPFUSE}.onnx", calibration)}
    forms.update(ort_forms(src, work, config))
    reference = embeddings(src, held)
    load_before = loadavg()
    m = measure(src, {k: str(v) for k, v in forms.items()}, get_runtime("onnxruntime", threads=1),
                seconds=args.seconds, feeds=held[0], reverse=args.reverse)  # fmt: skip
    rows = {
        label: {
            "kernels": kernels(path),
            "figures": embedding_figures(reference, embeddings(path, held)),
            "latency_vs_float": m.ratio(label),
            "latency_vs_opfuse_dynamic": m.ratio(label, OPFUSE),
        }
        for label, path in forms.items()
    }
    return {"runtime": m.runtime, "rounds": m.rounds, "noise": m.noise,
            "float_ms": m.original_s * 1000, "load": [load_before, loadavg()], "forms": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--reverse", action="store_true")
    p.add_argument("--work", default=str(OUT / ENCODER), help="bench.quant_transformers' folder")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    result = run(args)
    print(f"{result['runtime']}; {result['rounds']} rounds, noise +-{result['noise']:.1%}, "
          f"float {result['float_ms']:.1f} ms; load {result['load'][0]} -> {result['load'][1]}")  # fmt: skip
    for label, row in result["forms"].items():
        fig = row["figures"]
        print(f"{label}: {row['latency_vs_float']:.3f}x float, "
              f"{row['latency_vs_opfuse_dynamic']:.3f}x {OPFUSE}; cosine {fig['cosine_mean']:.4f}"
              f" / {fig['cosine_min']:.4f}, same neighbour {fig['same_neighbour']:.1%}; "
              + ", ".join(f"{k} {n}" for k, n in row["kernels"].items()))  # fmt: skip
    (Path(args.work) / "attention" / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
