"""Figures of one model file: node count and size (in the harness), and, each in a child
process so that a model that crashes onnxruntime costs only its own row:

    python -m bench.measure reference ORIGINAL WORKDIR
        seeded inputs (batch 1, 32 for other dynamic dims) and the original's outputs
        (onnxruntime optimizations off) into WORKDIR/inputs.npz and WORKDIR/reference.npz
    python -m bench.measure check MODEL WORKDIR RESULT_JSON
        max absolute and relative error vs the reference, session creation times, and
        polygraphy's default comparison (rtol 1e-5, atol 1e-5, every element) of the
        outputs at ORT_ENABLE_ALL against the original's there (``polygraphy run --onnxrt``)
    python -m bench.measure latency RESULT_JSON BUDGET_S INPUTS_NPZ MODEL...
        median latency of every MODEL at ORT_DISABLE_ALL and ORT_ENABLE_ALL, one thread,
        batch 1, after a warm-up, with the runs of all models interleaved, and its ratio to
        the first MODEL's: the median of the per-round ratios
    python -m bench.measure openvino RESULT_JSON BUDGET_S INPUTS_NPZ ORIGINAL MODEL...
        median OpenVINO CPU latency of each, through opfuse.tuning.measure (paired, interleaved,
        the original twice for the noise), one thread
The harness measures onnxruntime on its own, on purpose: its sessions (``session``, the one
place bench/ opens onnxruntime), its seeded inputs and its interleaved latency loop are
written here, not taken from opfuse (``opfuse.model.sessions``, ``opfuse.verification``,
``opfuse.tuning.measure``), so that a change to the system under test cannot bias the
figures that judge it; opfuse and the other tools' outputs are measured alike. What it
takes from opfuse: the input permutation a model re-declared with ``--layout`` records in
its metadata (to feed it), and, in the OpenVINO mode, opfuse's runtime layer.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

BATCH = 1
DIM = 32  # sequence length and any other dynamic dim
SEED = 0
WARMUP = 3
MIN_RUNS, MAX_RUNS = 5, 200
LEVELS = ("off", "all")

ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def node_count(path: str | os.PathLike[str]) -> int:
    """Nodes of the main graph and of every subgraph."""
    import onnx

    def count(graph: onnx.GraphProto) -> int:
        total = len(graph.node)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    total += count(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    total += sum(count(g) for g in attr.graphs)
        return total

    return count(onnx.load_model(str(path), load_external_data=False).graph)


def file_bytes(path: str | os.PathLike[str]) -> int:
    """The model file plus the external-data files it names."""
    import onnx

    path = Path(path)
    total = path.stat().st_size
    model = onnx.load_model(str(path), load_external_data=False)
    seen: set[str] = set()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if onnx.external_data_helper.uses_external_data(tensor):
            loc = {e.key: e.value for e in tensor.external_data}.get("location", "")
            if loc and loc not in seen and (path.parent / loc).exists():
                seen.add(loc)
                total += (path.parent / loc).stat().st_size
    return total


def session(
    model: str | bytes | Any,
    level: str,
    threads: int = 1,
    optimized_path: str | None = None,
    inter_threads: int | None = 1,
):
    """A CPU session on ``model`` (a path, serialized bytes or a ModelProto) at ``level``
    (``off``, ``basic``, ``all``), ``threads`` intra-op threads (0: onnxruntime's default),
    onnxruntime's log at errors only; ``optimized_path``: it saves the graph it runs there.
    Every session bench/ opens is opened here."""
    import onnxruntime as ort

    levels = {
        "off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    opts = ort.SessionOptions()
    opts.graph_optimization_level = levels[level]
    opts.intra_op_num_threads = threads
    if inter_threads is not None:
        opts.inter_op_num_threads = inter_threads
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    if optimized_path is not None:
        opts.optimized_model_filepath = optimized_path
    source = model if isinstance(model, str | bytes) else model.SerializeToString()
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def make_inputs(sess) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats; integers in {0, 1} so indices and masks stay valid."""
    rng = np.random.default_rng(SEED)
    feeds: dict[str, np.ndarray] = {}
    for spec in sess.get_inputs():
        dtype = ORT_DTYPES.get(spec.type)
        if dtype is None:
            raise ValueError(f"input {spec.name!r} has type {spec.type}, which bench cannot feed")
        shape = [
            d if isinstance(d, int) and d >= 0 else (BATCH if i == 0 else DIM)
            for i, d in enumerate(spec.shape)
        ]
        if np.issubdtype(dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def errors(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[float, float]:
    """Max absolute error over all outputs, and max relative error, each output's error
    divided by its largest reference magnitude (element-wise ratios blow up near zero)."""
    max_abs = max_rel = 0.0
    for name, r in ref.items():
        g = got[name]
        if r.shape != g.shape:
            return float("inf"), float("inf")
        if r.size == 0:
            continue
        r64, g64 = r.astype(np.float64), g.astype(np.float64)
        if not np.array_equal(np.isnan(r64), np.isnan(g64)):
            return float("inf"), float("inf")
        finite = np.isfinite(r64)
        if not finite.any():
            continue
        diff = float(np.max(np.abs(r64[finite] - g64[finite])))
        scale = float(np.max(np.abs(r64[finite])))
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")))
    return max_abs, max_rel


def _warm_onnxruntime() -> None:
    """Pay onnxruntime's one-time setup on a tiny model, so it is not in the first
    measured session's creation time."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "warm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = session(model, "all", threads=0, inter_threads=None)
    sess.run(None, {"x": np.zeros(1, np.float32)})


def reference(original: str, workdir: str) -> None:
    sess = session(original, "off")
    feeds = make_inputs(sess)
    outs = sess.run(None, feeds)
    named: dict[str, Any] = {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
    np.savez(Path(workdir) / "inputs.npz", **cast(dict[str, Any], feeds))
    np.savez(Path(workdir) / "reference.npz", **named)
    sess = session(original, "all")
    outs = sess.run(None, feeds)
    named = {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
    np.savez(Path(workdir) / "reference_all.npz", **named)


def polygraphy_default(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> bool | None:
    """Whether polygraphy's default comparison (``CompareFunc.simple()``: every element
    within atol 1e-5 + rtol 1e-5 * |ref|) passes; None when polygraphy is not installed."""
    try:
        from polygraphy.comparator import compare
        from polygraphy.comparator.struct import IterationResult
        from polygraphy.logger import G_LOGGER
    except ImportError:
        return None
    G_LOGGER.module_severity = G_LOGGER.CRITICAL
    if set(got) != set(ref):
        return False
    if hasattr(compare, "SimpleCompareFunc"):  # polygraphy run's default (0.50 and later)
        func = compare.SimpleCompareFunc()
    else:
        func = compare.CompareFunc.simple()
    results = func(
        IterationResult(ref, runner_name="original"), IterationResult(got, runner_name="tool")
    )
    return bool(results) and all(bool(r) for r in results.values())


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _laid_out(model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs in the layout a model re-declared with ``--layout`` (opfuse tune may)."""
    from opfuse.verification.compare import input_permutations

    perms = input_permutations(model)
    return {
        k: np.ascontiguousarray(v.transpose(perms[k])) if k in perms else v
        for k, v in feeds.items()
    }


def check(model: str, workdir: str, result: str) -> None:
    """Errors at optimizations off, and creation time of a session at both levels."""
    feeds = _laid_out(model, _load(Path(workdir) / "inputs.npz"))
    ref = _load(Path(workdir) / "reference.npz")
    ref_all = _load(Path(workdir) / "reference_all.npz")
    _warm_onnxruntime()
    figures: dict[str, object] = {}
    for level in LEVELS:
        start = time.perf_counter()
        sess = session(model, level)
        figures[f"session_{level}_s"] = time.perf_counter() - start
        names = [i.name for i in sess.get_inputs()]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ValueError(f"has input {missing[0]!r} that the original does not")
        outs = sess.run(None, {n: feeds[n] for n in names})
        if level == "off":
            out_names = [o.name for o in sess.get_outputs()]
            if set(out_names) != set(ref):
                if len(out_names) != len(ref):
                    raise ValueError(f"outputs {out_names} differ from the original's {list(ref)}")
                out_names = list(ref)  # renamed outputs: compare by position
            got = dict(zip(out_names, outs, strict=True))
            figures["max_abs_err"], figures["max_rel_err"] = errors(ref, got)
        else:
            got = {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
            figures["polygraphy"] = polygraphy_default(ref_all, got)
    Path(result).write_text(json.dumps(figures))


def latency(result: str, budget_s: float, inputs: str, models: list[str]) -> None:
    """Median seconds per run of each model at each level, runs interleaved round-robin;
    as many rounds as fit in ``budget_s`` (at least MIN_RUNS)."""
    feeds = _load(Path(inputs))
    sessions = {(model, level): session(model, level) for level in LEVELS for model in models}
    laid_out = {model: _laid_out(model, feeds) for model in models}
    feed_sets = {
        key: {i.name: laid_out[key[0]][i.name] for i in sess.get_inputs()}
        for key, sess in sessions.items()
    }
    round_s = 0.0  # warm-up, and the cost of one round from its last run
    for key, sess in sessions.items():
        took = 0.0
        for _ in range(WARMUP):
            start = time.perf_counter()
            sess.run(None, feed_sets[key])
            took = time.perf_counter() - start
        round_s += took
    runs = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / max(round_s, 1e-6))))
    times: dict[tuple[str, str], list[float]] = {key: [] for key in sessions}
    for _ in range(runs):
        for key, sess in sessions.items():
            start = time.perf_counter()
            sess.run(None, feed_sets[key])
            times[key].append(time.perf_counter() - start)
    # ratios are paired: the median of per-round ratios to the first model (the original)
    out = {
        model: {
            **{f"latency_{lv}_s": statistics.median(times[(model, lv)]) for lv in LEVELS},
            **{
                f"latency_{lv}_ratio": statistics.median(
                    a / b for a, b in zip(times[(model, lv)], times[(models[0], lv)], strict=True)
                )
                for lv in LEVELS
            },
        }
        for model in models
    }
    Path(result).write_text(json.dumps({"runs": runs, "models": out}))


def openvino_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def openvino(result: str, budget_s: float, inputs: str, models: list[str]) -> None:
    from opfuse.runtime import get_runtime
    from opfuse.tuning.measure import ORIGINAL, measure

    labels = {f"model{i}": m for i, m in enumerate(models[1:])}
    found = measure(
        models[0], labels, get_runtime("openvino", threads=1), seconds=budget_s,
        feeds=_load(Path(inputs)),
    )  # fmt: skip
    medians = [found.medians[ORIGINAL]] + [found.medians[k] for k in labels]
    ratios = [1.0] + [found.ratio(k) for k in labels]
    doc = {"runtime": found.runtime, "noise": found.noise, "medians_s": medians, "ratios": ratios}
    Path(result).write_text(json.dumps(doc))


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "reference":
        reference(*args)
    elif mode == "check":
        check(*args)
    elif mode == "latency":
        result, budget, inputs, *models = args
        latency(result, float(budget), inputs, models)
    elif mode == "openvino":
        result, budget, inputs, *models = args
        openvino(result, float(budget), inputs, models)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
