"""Where an int8 model's disagreements with the float model come from (issue 31): the
float model's top-1 margin at the rows (steps) that differ, and the figures with a region
of the fused graph kept in float:

    python -m bench.quant_regions MODEL --calibration C.npz --eval E.npz [--recipe minmax]
        [--regions backbone=FIRST..LAST,head=FIRST..LAST] [--ctc-blank 0]

``opfuse.quantize`` makes each model (the recipe forced, ``--max-drop off``, no benchmark);
a region is the nodes of the fused model from FIRST to LAST in graph order (node names),
given to it as ``exclude``. Figures on the ``--eval`` samples against the float original:
top-1 agreement of the first output (rows: samples x steps), its SQNR, the rows that differ
and how many of them are near-ties in the float model (its top-1 minus top-2 below 0.01,
0.05, 0.1: of probabilities when the output is a Softmax's); with ``--ctc-blank`` also
the windows whose CTC greedy decoding (repeats collapsed, the blank dropped) differs and
the differing rows where one side is the blank. One JSON line per model.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from opfuse.quantization.accuracy import sqnr_db

TIES = (0.01, 0.05, 0.1)


def decode(ids: np.ndarray, blank: int) -> list[int]:
    """CTC greedy decoding: repeats collapsed, the blank dropped."""
    out, prev = [], -1
    for i in ids.tolist():
        if i != prev and i != blank:
            out.append(i)
        prev = i
    return out


def figures(ref: np.ndarray, got: np.ndarray, blank: int | None) -> dict[str, Any]:
    """``ref``/``got``: N x T x C (or N x C) scores of the float and the int8 model."""
    r2, g2 = ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1])
    top, top_got = r2.argmax(1), g2.argmax(1)
    ordered = np.sort(r2, axis=1)
    margin = ordered[:, -1] - ordered[:, -2]
    differ = np.nonzero(top != top_got)[0]
    out: dict[str, Any] = {
        "top1": round(float(np.mean(top == top_got)), 4),
        "sqnr_db": round(sqnr_db(ref, got), 2),
        "rows": len(top),
        "differ": len(differ),
        "differ_margins": sorted(round(float(margin[i]), 3) for i in differ),
        "all_margins_percentiles": {
            p: round(float(np.percentile(margin, p)), 3) for p in (1, 5, 10, 50)
        },
    }
    for tie in TIES:
        out[f"differ_margin_below_{tie:g}"] = int(np.sum(margin[differ] < tie))
        out[f"rows_margin_below_{tie:g}"] = int(np.sum(margin < tie))
    if blank is not None and ref.ndim == 3:
        out["differ_blank_vs_class"] = int(
            np.sum((top[differ] == blank) != (top_got[differ] == blank))
        )
        out["windows_decoded_differ"] = sum(
            decode(ref[k].argmax(-1), blank) != decode(got[k].argmax(-1), blank)
            for k in range(len(ref))
        )
        out["windows"] = len(ref)
    return out


def region(order: list[str], spec: str) -> list[str]:
    first, _, last = spec.partition("..")
    if first not in order or last not in order:
        raise SystemExit(f"--regions {spec}: node names of the fused model (first..last)")
    return order[order.index(first) : order.index(last) + 1]


def sample_feeds(path: str | Path) -> list[dict[str, np.ndarray]]:
    """An .npz of N samples (arrays named after the inputs, samples on axis 0) as N feeds."""
    data = dict(np.load(path))
    count = len(next(iter(data.values())))
    return [{k: v[i] for k, v in data.items()} for i in range(count)]


def first_outputs(model: Any, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The first output of ``model`` (a path or a ModelProto) on each feed, concatenated
    (bench.measure's session: one thread, onnxruntime's optimizations on)."""
    from bench.measure import session

    sess = session(model if isinstance(model, str | bytes) else model.SerializeToString(), "all")
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def fused_float(model: Path, calibration: Path) -> Any:
    """``model`` through opfuse's float fusions (verified on the first calibration sample),
    as a ModelProto: the graph whose node names ``--exclude`` and the int8 model carry."""
    import onnx

    from opfuse.quantization import flow

    with tempfile.TemporaryDirectory(prefix="quant_diagnosis.") as tmp:
        sample = Path(tmp) / "sample.npz"
        np.savez(sample, **sample_feeds(calibration)[0])
        flow.fuse(model, Path(tmp) / "fused.onnx", verify_inputs=sample)
        return onnx.load(str(Path(tmp) / "fused.onnx"))


def diagnosis_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a diagnosis of one model's int8 error (this module, quant_gptq): the
    model, its calibration and evaluation samples, the recipe, the CTC blank."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("model", type=Path)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--eval", type=Path, required=True)
    parser.add_argument("--recipe", default="minmax")
    parser.add_argument("--ctc-blank", type=int, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    from opfuse.quantization.conductor import quantize_file

    parser = diagnosis_parser(__doc__ or "")
    parser.add_argument("--regions", default="", help="NAME=FIRST..LAST[,NAME=FIRST..LAST]")
    args = parser.parse_args(argv)
    feeds = sample_feeds(args.eval)
    ref = first_outputs(str(args.model), feeds)
    fused = fused_float(args.model, args.calibration)
    order = [n.name for n in fused.graph.node if n.name and n.op_type != "Constant"]
    regions = {"none": []} | {
        name: region(order, spec)
        for name, _, spec in (r.partition("=") for r in args.regions.split(",") if r)
    }
    for name, nodes in regions.items():
        result = quantize_file(
            args.model,
            None,
            str(args.calibration),
            eval=str(args.eval),
            exclude=nodes,
            max_drop="off",
            benchmark=False,
            recipe=args.recipe,
        )
        assert result.model is not None
        line = {"model": args.model.name, "recipe": args.recipe, "in_float": name}
        got = first_outputs(result.model, feeds)
        line |= {"nodes_in_float": len(nodes)} | figures(ref, got, args.ctc_blank)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
