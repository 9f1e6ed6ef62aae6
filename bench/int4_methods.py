"""onnxruntime's weight-only int4 methods on the trained MiniLM encoder (issue 42, item 3):

    python -m bench.int4_methods [--methods rtn-sym,rtn-asym,...] [--out DIR]

Each method of ``onnxruntime.quantization.matmul_nbits_quantizer`` in blocks of 32 on every
MatMul with a constant weight, judged as bench.quant_transformers judges the encoder (the
cosine of the mean-pooled embeddings to the float model's, mean and lowest, and the share
of held-out sentences whose nearest neighbour is unchanged), with the file's size:
``rtn-sym`` (its DEFAULT: what ``opfuse quantize --recipe int4`` makes), ``rtn-sym0`` (the
same with accuracy_level 0: float dot products), ``rtn-asym`` (zero points), ``inc-rtn``
(Intel Neural Compressor's RTN, vendored in onnxruntime), ``k_quant`` (data-free),
``hqq`` (data-free, imports torch), ``gptq`` (data-aware on the calibration sentences,
imports torch). A method that cannot run here (torch missing) is reported as its error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.quant_decoder import SampleReader
from bench.quant_transformers import OUT, embedding_figures, embeddings, prepare

METHODS = ("rtn-sym", "rtn-sym0", "rtn-asym", "inc-rtn", "k_quant", "hqq", "gptq")


def config(method: str, calibration: list[dict[str, np.ndarray]]) -> tuple[Any, dict[str, Any]]:
    """The quantizer's algorithm config and its own arguments for ``method``."""
    from onnxruntime.quantization import matmul_nbits_quantizer as nb

    symmetric = method != "rtn-asym"
    level = 0 if method == "rtn-sym0" else 4
    kwargs = {"block_size": 32, "is_symmetric": symmetric, "accuracy_level": level}
    if method.startswith("rtn-"):
        made = nb.DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=symmetric, accuracy_level=level, bits=4
        )
        return made, kwargs
    if method == "inc-rtn":
        return nb.RTNWeightOnlyQuantConfig(), kwargs
    if method == "k_quant":
        return nb.KQuantWeightOnlyQuantConfig(), kwargs
    if method == "hqq":
        return nb.HQQWeightOnlyQuantConfig(block_size=32), kwargs
    reader = SampleReader(calibration[:32])
    return nb.GPTQWeightOnlyQuantConfig(calibration_data_reader=reader), kwargs


def run(methods: list[str], work: Path) -> dict[str, Any]:
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nb

    path, calibration, held, _config = prepare("minilm_l6", work)
    ref = embeddings(path, held)
    rows: dict[str, Any] = {}
    for method in methods:
        started = time.perf_counter()
        try:
            algo, kwargs = config(method, calibration)
            quantizer = nb.MatMulNBitsQuantizer(str(path), algo_config=algo, **kwargs)
            quantizer.process()
            out = work / "models" / f"int4-{method}.onnx"
            onnx.save(quantizer.model.model, str(out))
        except Exception as exc:  # torch missing, for hqq and gptq
            rows[method] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        rows[method] = {
            **embedding_figures(ref, embeddings(out, held)),
            "file_mb": out.stat().st_size / 1e6,
            "seconds": time.perf_counter() - started,
        }
        print(method, json.dumps(rows[method]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        print(f"bench.int4_methods: expected methods among {METHODS}", file=sys.stderr)
        return 2
    rows = run(methods, args.out)
    (args.out / "int4_methods.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
