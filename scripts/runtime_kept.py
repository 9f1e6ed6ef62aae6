"""What an optimizer's output kept of what onnxruntime reads: the shape annotations
(value_info) of the values the original described, and the fused kernels onnxruntime makes
at ORT_ENABLE_ALL (read from the graph it saves), original against output.

    .venv/bin/opfuse optimize bert.onnx -o bert.opt.onnx
    .venv/bin/python scripts/runtime_kept.py bert.onnx bert.opt.onnx

prints, for instance:

    value_info: 193 of the 193 described values still in the graph keep theirs
    kernels: FusedGemm 1 -> 1, FusedMatMul 4 -> 4, LayerNormalization 1 -> 1, SkipLayerNormalization 8 -> 8
    lost: none
"""

from __future__ import annotations

import argparse

import onnx

from opfuse.model.value_info import described_kept
from opfuse.runtime.fused import lost_fusions, lost_text, runtime_kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("original")
    parser.add_argument("output")
    args = parser.parse_args()
    original, output = (
        onnx.load_model(path, load_external_data=False) for path in (args.original, args.output)
    )
    surviving, kept = described_kept(original, output)
    print(f"value_info: {kept} of the {surviving} described values still in the graph keep theirs")
    before, after = runtime_kernels(args.original), runtime_kernels(args.output)
    kinds = sorted(set(before) | set(after))
    print("kernels: " + ", ".join(f"{k} {before[k]} -> {after[k]}" for k in kinds))
    lost = lost_fusions(before, after)
    print(f"lost: {lost_text(lost) if lost else 'none'}")


if __name__ == "__main__":
    main()
