"""A model with more than 2 GB of external weights (generated into tmp, never committed):
it loads without reading the weights, optimizes (the BatchNormalization folds touch only
their Conv's tensors), saves with external data and verifies. The optimizing process's
peak memory (VmHWM) is measured against the weights' size and printed.

Run with ``pytest -m slow tests/test_large_model.py -s``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

C = 8192  # 1x1 Convs C -> C on a 1x1 map: 256 MiB of weights each, little compute
CONVS = 9  # 2.25 GiB of weights in all
BN_AFTER = (2, 6)  # the Convs followed by a BatchNormalization
WEIGHTS = "weights.bin"


def make_large_model(folder: Path) -> tuple[Path, int]:
    """Write model.onnx + weights.bin (sparse-fast: each weight is one random block
    tiled through a memmap) and return the model path and the weights' size."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    block = (rng.uniform(-1, 1, 1 << 20) * np.sqrt(3.0 / C)).astype(np.float32)
    layout: list[tuple[str, tuple[int, ...], np.ndarray | None]] = []
    nodes, x = [], "x"
    for i in range(CONVS):
        w, b, y = f"w{i}", f"b{i}", f"c{i}"
        layout += [(w, (C, C, 1, 1), None), (b, (C,), rng.uniform(-0.1, 0.1, C))]
        nodes.append(helper.make_node("Conv", [x, w, b], [y], name=f"conv{i}"))
        x = y
        if i in BN_AFTER:
            names = [f"bn{i}_{p}" for p in ("g", "b", "m", "v")]
            layout += [
                (names[0], (C,), rng.uniform(0.5, 1.5, C)),
                (names[1], (C,), rng.uniform(-0.1, 0.1, C)),
                (names[2], (C,), rng.uniform(-0.1, 0.1, C)),
                (names[3], (C,), rng.uniform(0.5, 2.0, C)),
            ]
            nodes.append(helper.make_node("BatchNormalization", [x, *names], [f"n{i}"]))
            x = f"n{i}"
        nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    total = sum(int(np.prod(shape)) * 4 for _, shape, _ in layout)
    data = np.memmap(folder / WEIGHTS, dtype=np.float32, mode="w+", shape=(total // 4,))
    inits, offset = [], 0
    for name, shape, values in layout:
        count = int(np.prod(shape))
        view = data[offset // 4 : offset // 4 + count]
        if values is None:  # the block, shifted per tensor: no two weights are equal
            shifted = np.roll(block, len(inits) * 7919)
            for start in range(0, count, block.size):
                view[start : start + block.size] = shifted[: count - start]
        else:
            view[:] = values
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", WEIGHTS), ("offset", offset), ("length", count * 4)):
            tensor.external_data.add(key=key, value=str(value))
        inits.append(tensor)
        offset += count * 4
    data.flush()
    del data
    graph = helper.make_graph(
        nodes,
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 1, 1])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, C, 1, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save_model(model, str(path))
    return path, total


# Runs in a child process, so that its peak memory is the optimizer's alone.
OPTIMIZE = textwrap.dedent(
    """
    import json, sys, time
    import onnx_ir as ir
    from opfuse.model import io
    from opfuse.pipeline.conductor import optimize_model

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    src, out = sys.argv[1], sys.argv[2]
    start = time.perf_counter()
    model = io.load_model(src)
    loaded = status("VmRSS")
    result = optimize_model(model)
    materialized = sorted(
        v.name for v in result.model.graph.initializers.values()
        if not isinstance(v.const_value, ir.ExternalTensor) and v.const_value.nbytes > 1 << 20
    )
    optimized = status("VmHWM")
    io.save_model(result.model, out, input_path=src)
    print(json.dumps({
        "rss_after_load": loaded,
        "hwm_after_optimize": optimized,
        "hwm": status("VmHWM"),
        "materialized": materialized,
        "effected": {s.pass_name: s.effected for s in result.log if s.effected},
        "seconds": time.perf_counter() - start,
    }))
    """
)

VERIFY = textwrap.dedent(
    """
    import json, sys
    from opfuse.verification.compare import compare_files
    report = compare_files(sys.argv[1], sys.argv[2])
    hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")]
    print(json.dumps({"ok": report.ok, "failure": report.failure(), "hwm": hwm[0]}))
    """
)


def child(script: str, *args: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_model_over_2gb_optimizes_saves_and_verifies(tmp_path):
    src, weights = make_large_model(tmp_path / "in")
    assert weights > 2**31
    out = tmp_path / "out" / "model.opt.onnx"
    out.parent.mkdir()
    stats = child(OPTIMIZE, src, out)
    gib = 2**30
    print(
        f"\nweights {weights / gib:.2f} GiB; optimizer RSS after load "
        f"{stats['rss_after_load'] / gib:.2f} GiB, peak after optimize "
        f"{stats['hwm_after_optimize'] / gib:.2f} GiB, peak with save {stats['hwm'] / gib:.2f} "
        f"GiB ({stats['hwm'] / weights:.0%} of the weights); {stats['seconds']:.1f} s; "
        f"{stats['effected']}"
    )
    assert stats["rss_after_load"] < 512 * 2**20  # the weights were not read at load
    # only the two Convs the BatchNormalizations folded into were materialized
    assert 0 < len(stats["materialized"]) <= 2 * len(BN_AFTER), stats["materialized"]
    assert stats["effected"].get("ConvBatchNormFusionPass") == len(BN_AFTER)
    saved = onnx.load_model(str(out), load_external_data=False)
    assert [n.op_type for n in saved.graph.node].count("BatchNormalization") == 0
    assert all(t.data_location == TensorProto.EXTERNAL for t in saved.graph.initializer)
    onnx.checker.check_model(str(out))
    assert stats["hwm"] <= weights / 2, f"peak {stats['hwm']} bytes > half of {weights}"
    verified = child(VERIFY, src, out)
    print(f"verify: {verified}")
    assert verified["ok"], verified["failure"]
