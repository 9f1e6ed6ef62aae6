"""Where a detector's score map loses its map IoU (issue 31, docs/QUANTIZATION_MEASUREMENTS.md "Measured:
where the detector's map IoU is lost"): quantize parts of the fused model only, the rest
kept in float, and score each model's map on the held-back samples (and on the calibration
samples: "calib."):

    python -m bench.quant_parts MODEL.onnx CALIB.npz EVAL.npz [--method mean-minmax]
        [--parts all,stem] [--work /tmp/quant_parts]

``all``: everything, the backbone / neck / head only (split at the first node a Resize's
branch reads and at the last Conv before the first ConvTranspose), the first Conv, the SE
blocks, the ConvTransposes, the HardSigmoids, the Sigmoid in float; ``stem``: the nodes
before the k-th Conv in float (k = 3, 5, 6, 7, 11). The quantization is opfuse's
(``ort_backend.quantize_proto``: onnxruntime's static QDQ quantizer, int8 per-channel weights,
uint8 activations) with the ranges of ``--method`` as overrides, on every calibration
sample, as ``opfuse quantize --recipe METHOD --exclude ...`` writes it; the figures are
``bench.quant.accuracy``'s (map IoU at 0.3, SQNR of the map).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench import quant as bq
from bench.quant_regions import sample_feeds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quant_parts")
    ap.add_argument("model")
    ap.add_argument("calibration")
    ap.add_argument("eval")
    ap.add_argument("--method", default="mean-minmax")
    ap.add_argument("--parts", default="all,stem")
    ap.add_argument("--work", default="/tmp/quant_parts")
    args = ap.parse_args(argv)
    from opfuse.quantization import flow, ort_backend

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    fused_path = work / "fused.onnx"
    flow.fuse(args.model, fused_path)
    fused = onnx.load(str(fused_path))
    calib, held = sample_feeds(args.calibration), sample_feeds(args.eval)
    rows = _rows(fused, args.parts.split(","))
    ref_held, ref_calib = _outputs(fused, held), _outputs(fused, calib)
    overrides = _overrides(fused, calib, args.method)
    for label, exclude in rows:
        notes: list[str] = []
        model = ort_backend.quantize_proto(
            fused,
            calib,
            flow.QuantOptions(),
            list(exclude),
            name="parts",
            notes=notes,
            overrides=overrides,
        )
        a = bq.accuracy(ref_held, _outputs(model, held), False)
        b = bq.accuracy(ref_calib, _outputs(model, calib), False)
        print(
            f"{label:55s} map IoU {a['map_iou']:.1%} / {a['sqnr_db']:.1f} dB "
            f"(calib. {b['map_iou']:.1%} / {b['sqnr_db']:.1f} dB)",
            flush=True,
        )


def _outputs(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[Any]:
    """The first output on each feed, one array per feed (as ``bench.quant.accuracy`` takes
    them)."""
    from bench.measure import session

    sess = session(model.SerializeToString(), "all")
    return [sess.run(None, f)[0] for f in feeds]


def _overrides(
    model: onnx.ModelProto, calib: list[dict[str, np.ndarray]], method: str
) -> dict[str, list[dict[str, object]]] | None:
    from opfuse.quantization import ranges

    if method == "minmax":
        return None
    found = ranges.activation_ranges(model, calib, ranges.quantized_activations(model), method)
    return ranges.to_overrides(found)


def _rows(model: onnx.ModelProto, parts: list[str]) -> list[tuple[str, list[str]]]:
    nodes = list(model.graph.node)
    names = [n.name for n in nodes]
    convs = [i for i, n in enumerate(nodes) if n.op_type == "Conv"]
    rows: list[tuple[str, list[str]]] = []
    if "all" in parts:
        resize = next(i for i, n in enumerate(nodes) if n.op_type == "Resize")
        produced = {o: i for i, n in enumerate(nodes) for o in n.output}
        # the neck starts at the first node reading a backbone tensor the Resizes' FPN uses:
        # the earliest Conv after the backbone's last stage whose input is made before it
        neck = min(i for i in convs if i < resize and produced.get(nodes[i].input[0], i) < i - 1)
        up = next(i for i, n in enumerate(nodes) if n.op_type == "ConvTranspose")
        head = max(i for i in convs if i < up)
        se: list[str] = []
        for i, n in enumerate(nodes):
            if n.op_type == "GlobalAveragePool":
                se += names[i : i + 6]
        of = {
            op: [n.name for n in nodes if n.op_type == op]
            for op in ("ConvTranspose", "HardSigmoid", "Sigmoid")
        }
        rows += [
            ("everything", []),
            ("backbone only", names[neck:]),
            ("neck only", names[:neck] + names[head:]),
            ("head only", names[:head]),
            ("all but the head", names[head:]),
            ("all but the first Conv", names[convs[0] : convs[0] + 1]),
            ("all but the SE blocks", se),
            ("all but the ConvTransposes", of["ConvTranspose"]),
            ("all but the HardSigmoids", of["HardSigmoid"]),
            ("all but the Sigmoid", of["Sigmoid"]),
        ]
    if "stem" in parts:
        for k in (3, 5, 6, 7, 11):
            if k < len(convs):
                rows.append((f"the nodes before Conv #{k + 1} in float", names[: convs[k]]))
    return rows


if __name__ == "__main__":
    main()
