"""Each activation range method and bias correction on the benchmark's trained models,
against global min/max (onnxruntime's default), accuracy on the held-back samples:

    python -m bench.quant_methods [--models ppocr_rec,ppocr_cls] [--methods minmax,...]
                                  [--work bench/out/quant]

The models and samples are bench.quant's (the same downloads, the same calibration and
held-back split); each model is fused first (opfuse's default passes, as ``opfuse quantize``
does), then quantized by onnxruntime's quantize_static (QDQ, per-channel int8 weights,
uint8 activations) with the method's ranges as TensorQuantOverrides, then (on each range
method) corrected by fast and full bias correction. Figures as bench.quant gives them:
the first output's SQNR against the float model and top-1 agreement (and top-1 over the
positions whose class is not the most common one, CTC's blank). One JSON line per result.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import quant as bq

FIGURES = ("sqnr_db", "top1", "top1_rare")


def main(argv: list[str] | None = None) -> int:
    import onnx
    from onnxruntime import quantization as q

    from opfuse.quantization import flow
    from opfuse.quantization.bias_correction import correct_bias
    from opfuse.quantization.ranges import (
        METHODS,
        activation_ranges,
        quantized_activations,
        to_overrides,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ppocr_rec,ppocr_cls")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--work", type=Path, default=bq.OUT)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="quant_methods."))

    def quantize(model: onnx.ModelProto, samples: list[dict], overrides: dict) -> onnx.ModelProto:
        out = tmp / f"q{time.time_ns()}.onnx"
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # quantize_static moves a ModelProto's weights to external data
        q.quantize_static(
            copy,
            str(out),
            bq.reader(samples),
            quant_format=q.QuantFormat.QDQ,
            per_channel=True,
            activation_type=q.QuantType.QUInt8,
            weight_type=q.QuantType.QInt8,
            extra_options={"TensorQuantOverrides": overrides},
        )
        return onnx.load(str(out))

    def score(model: onnx.ModelProto, case: Any, ref: list) -> dict[str, float]:
        path = tmp / f"s{time.time_ns()}.onnx"
        onnx.save(model, str(path))
        figures = bq.accuracy(ref, bq.outputs(path, case.evaluation), case.classes)
        return {k: round(v, 4) for k, v in figures.items() if k in FIGURES}

    for case in bq.cases(args.models.split(","), args.work):
        fused = tmp / f"{case.name}.fused.onnx"
        flow.fuse(case.path, fused)
        model = onnx.load(str(fused))
        ref = bq.outputs(fused, case.evaluation)
        tensors = quantized_activations(model)
        head = {"model": case.name, "calibration": len(case.calibration)}
        head["held_back"] = len(case.evaluation)
        for method in args.methods.split(","):
            start = time.time()
            ranges = activation_ranges(model, case.calibration, tensors, method)
            took = round(time.time() - start, 1)
            qdq = quantize(model, case.calibration, to_overrides(ranges))
            print(json.dumps({**head, "ranges": method, "s": took, **score(qdq, case, ref)}))
            for full in (False, True):
                start = time.time()
                corrected, layers = correct_bias(model, qdq, case.calibration, full=full)
                took = round(time.time() - start, 1)
                line = {**head, "ranges": method, "bias_correction": "full" if full else "fast"}
                line.update(layers=layers, s=took, **score(corrected, case, ref))
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
