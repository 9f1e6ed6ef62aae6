"""This machine's peak FLOP/s and memory bandwidth under onnxruntime, for the cpu and cuda
targets' estimates: a MatMul for the FLOP/s, a large elementwise copy for the bandwidth,
a few runs each (the best is kept: the figure is a peak). Measured once and cached per
machine, onnxruntime version, provider and thread count, in
``$OPFUSE_CACHE_DIR`` (default ``~/.cache/opfuse``) ``/calibration.json``."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MATMUL_N = 512
COPY_ELEMENTS = 8 * 1024 * 1024  # 32 MiB of float32 each way: beyond the caches
RUNS = 5


@dataclass(frozen=True)
class Peaks:
    flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    key: str  # what the figures were measured on
    cached: bool = False


# measure(provider, threads) -> (FLOP/s, bytes/s)
Measure = Callable[[str, int], tuple[float, float]]


def cache_path() -> Path:
    root = os.environ.get("OPFUSE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "opfuse"
    )
    return Path(root) / "calibration.json"


def machine_key(provider: str, threads: int) -> str:
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    return f"{cpu}; {os.cpu_count()} cpus; onnxruntime {ort.__version__}; {provider}; threads {threads}"


def machine_peaks(provider: str, threads: int, measure: Measure | None = None) -> Peaks:
    """The cached figures for this machine, or measure (about a second) and cache them."""
    key = machine_key(provider, threads)
    path = cache_path()
    cache: dict[str, dict[str, float]] = {}
    with contextlib.suppress(OSError, ValueError):
        cache = json.loads(path.read_text("utf-8"))
    hit = cache.get(key)
    if isinstance(hit, dict) and {"flops", "bandwidth"} <= set(hit):
        return Peaks(float(hit["flops"]), float(hit["bandwidth"]), key, cached=True)
    flops, bandwidth = (measure or measure_onnxruntime)(provider, threads)
    cache[key] = {"flops": flops, "bandwidth": bandwidth}
    from opfuse.errors import OpfuseError
    from opfuse.model.io import write_text

    with contextlib.suppress(OSError, OpfuseError):  # a read-only home: measure next time
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(cache, indent=1) + "\n", inputs=[], what="the calibration")
    return Peaks(flops, bandwidth, key)


def measure_onnxruntime(provider: str, threads: int) -> tuple[float, float]:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from opfuse.model.sessions import open_session

    def session(node: onnx.NodeProto, shape: list[int]) -> ort.InferenceSession:
        value = helper.make_tensor_value_info
        graph = helper.make_graph(
            [node],
            "calibration",
            [value("a", TensorProto.FLOAT, shape), value("b", TensorProto.FLOAT, shape)],
            [value("y", TensorProto.FLOAT, shape)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return open_session(
            model, provider=provider, cpu_fallback=True, threads=threads, errors="onnxruntime"
        )

    def best(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> float:
        sess.run(None, feeds)  # warm-up
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            sess.run(None, feeds)
            times.append(time.perf_counter() - start)
        return min(times)

    rng = np.random.default_rng(0)
    n = MATMUL_N
    square = {k: rng.standard_normal((n, n)).astype(np.float32) for k in "ab"}
    flops = (
        2.0 * n**3 / best(session(helper.make_node("MatMul", ["a", "b"], ["y"]), [n, n]), square)
    )
    big = {k: np.ones(COPY_ELEMENTS, np.float32) for k in "ab"}
    moved = 3.0 * COPY_ELEMENTS * 4  # read a and b, write y
    add = helper.make_node("Add", ["a", "b"], ["y"])
    bandwidth = moved / best(session(add, [COPY_ELEMENTS]), big)
    return flops, bandwidth
