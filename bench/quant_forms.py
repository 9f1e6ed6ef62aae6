"""onnxruntime's QDQ form with selected requantizations removed (issue 31), against opfuse's
default: accuracy on the held-back samples and the int8 latency ratio on onnxruntime CPU:

    python -m bench.quant_forms ppocr_det --recipe mean-minmax,bias-correction \\
        [--forms add-out,noncompute] [--seconds 20] [--work /tmp/quant_forms]

The model and samples are bench.quant's. ``opfuse.quantize`` writes the int8 model with
the recipe given (``--max-drop off``), its clean-up held back; each form removes the
QuantizeLinear -> DequantizeLinear pairs of the tensors its rule picks from that model
(the readers take the float tensor: a removal changes no float op), then the clean-up
runs on every model. A tensor whose producer is a Relu/Clip onnxruntime's quantizer folded
into the QuantizeLinear's saturation (the float model has it, the int8 model not) keeps its
pair. Figures: bench.quant's (``figures_of``) and the latency ratios of ``bench.quant.latency``
(every model against the float original, paired and interleaved, the original twice).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import quant as bq

COMPUTE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
Rule = Callable[[Any, list[Any]], bool]  # (producer, readers) -> remove the pair


def _plain(readers: list[Any]) -> bool:
    return all(r.op_type not in COMPUTE for r in readers)


FORMS: dict[str, Rule] = {
    # a tensor an Add makes, read by no Conv/MatMul/Gemm (a residual sum)
    "add-out": lambda p, rd: p.op_type == "Add" and _plain(rd),
    "mul-out": lambda p, rd: p.op_type == "Mul" and _plain(rd),
    "hardsigmoid-out": lambda p, rd: p.op_type == "HardSigmoid" and _plain(rd),
    "resize-out": lambda p, rd: p.op_type == "Resize" and _plain(rd),
    # a tensor a MatMul makes, read by no compute op (MatMulIntegerToFloat)
    "matmul-out": lambda p, rd: p.op_type == "MatMul" and _plain(rd),
    # any tensor a non-compute op makes, read by no compute op (QLinearConv keeps its Q):
    # the rule of the float-requant step (opfuse.quantization.float_requant)
    "noncompute": lambda p, rd: p.op_type not in COMPUTE and _plain(rd),
    "noncompute+matmul": lambda p, rd: (
        (p.op_type not in COMPUTE or p.op_type == "MatMul") and _plain(rd)
    ),
}


def free_pairs(model: Any, float_model: Any, rule: Rule) -> int:
    """Remove (in place) the Q -> DQ pairs of the tensors ``rule`` picks; their count."""
    g = model.graph
    names = {n.name for n in g.node}
    folded = {o for n in float_model.graph.node if n.name not in names for o in n.output}
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    drop: set[int] = set()
    rename: dict[str, str] = {}
    for q in g.node:
        t = q.input[0] if q.op_type == "QuantizeLinear" else ""
        p = producer.get(t)
        if p is None or p.op_type == "DequantizeLinear" or t in folded:
            continue
        dqs = readers.get(q.output[0], [])
        if not dqs or any(d.op_type != "DequantizeLinear" or d.output[0] in outputs for d in dqs):
            continue
        if rule(p, [r for d in dqs for r in readers.get(d.output[0], [])]):
            drop.update(id(n) for n in (q, *dqs))
            rename.update({d.output[0]: t for d in dqs})
    kept = [n for n in g.node if id(n) not in drop]
    for n in kept:
        for k, i in enumerate(n.input):
            n.input[k] = rename.get(i, i)
    del g.node[:]
    g.node.extend(kept)
    return len(rename)


def main(argv: list[str] | None = None) -> int:
    import onnx

    from opfuse.quantization import flow

    ap = argparse.ArgumentParser(prog="python -m bench.quant_forms", description=__doc__)
    ap.add_argument("model", choices=bq.ALL_MODELS)
    ap.add_argument("--recipe", default="auto")
    ap.add_argument("--forms", default="add-out,noncompute")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/quant_forms"))
    args = ap.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        ap.error(f"unknown form(s) {', '.join(unknown)}; known: {', '.join(FORMS)}")
    work = args.work / args.model
    work.mkdir(parents=True, exist_ok=True)
    case = next(bq.cases([args.model], bq.OUT))
    raw, fused = work / "raw.onnx", work / "fused.onnx"
    clean_up = flow.clean_up_proto
    flow.clean_up_proto = lambda m, *a, **k: m  # type: ignore[assignment]  # held back
    try:
        bq.opfuse_quantize(case, raw, work, recipe=args.recipe)
    finally:
        flow.clean_up_proto = clean_up  # type: ignore[assignment]
    flow.fuse(case.path, fused)
    float_model = onnx.load_model(str(fused))
    paths: dict[str, Path] = {}
    pairs: dict[str, int] = {}
    for form in ["default", *forms]:
        model = onnx.load_model(str(raw))
        pairs[form] = 0 if form == "default" else free_pairs(model, float_model, FORMS[form])
        paths[form] = work / f"{form}.onnx"
        onnx.save_model(clean_up(model, case.calibration[0]), str(paths[form]))
    ref = bq.outputs(case.path, case.evaluation, every=case.metric == "boxes")
    result: dict[str, Any] = {"model": args.model, "recipe": args.recipe, "forms": {}}
    for form, path in paths.items():
        cell = bq.figures_of(case, path, ref)
        cell["pairs_removed"] = pairs[form]
        result["forms"][form] = cell
    result["load_before"] = os.getloadavg()
    lat = bq.latency(case, paths, "onnxruntime", args.seconds)
    result["load_after"] = os.getloadavg()
    result["latency"] = {k: lat[k] for k in ("runtime", "noise", "rounds", "float_ms", "ratio")}
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
