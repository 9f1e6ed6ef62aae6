"""Small models for the batch tests: ones that optimize, and the three that must fail in
their own way (a truncated file, a model whose run never ends, one that needs 16 GiB)."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from onnx import TensorProto as T
from onnx import helper as h

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "opfuse" / "examples" / "convnet.onnx"


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def identity_chain(path: Path) -> Path:
    """x -> Identity -> Relu -> Identity -> y: the Identities go, the Relu stays."""
    nodes = [
        h.make_node("Identity", ["x"], ["a"]),
        h.make_node("Relu", ["a"], ["b"]),
        h.make_node("Identity", ["b"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "chain",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 3])],
    )
    return _save(graph, path)


def hangs(path: Path) -> Path:
    """A Loop of 2**60 steps on the input: onnxruntime runs it (in verification) forever."""
    body = h.make_graph(
        [h.make_node("Identity", ["c"], ["co"]), h.make_node("Add", ["v", "one"], ["vo"])],
        "body",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("c", T.BOOL, []),
            h.make_tensor_value_info("v", T.FLOAT, [1]),
        ],
        [h.make_tensor_value_info("co", T.BOOL, []), h.make_tensor_value_info("vo", T.FLOAT, [1])],
        [h.make_tensor("one", T.FLOAT, [1], [1.0])],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)],
        "hang",
        [h.make_tensor_value_info("x", T.FLOAT, [1])],
        [h.make_tensor_value_info("y", T.FLOAT, [1])],
        [h.make_tensor("M", T.INT64, [], [1 << 60]), h.make_tensor("cond", T.BOOL, [], [True])],
    )
    return _save(graph, path)


def needs_16_gib(path: Path) -> Path:
    """Expand a [1, 1] input to [65536, 65536] float32 (16 GiB) when it runs."""
    graph = h.make_graph(
        [
            h.make_node("Expand", ["x", "shape"], ["e"]),
            h.make_node("ReduceSum", ["e"], ["y"], keepdims=0),
        ],
        "oom",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 1])],
        [h.make_tensor_value_info("y", T.FLOAT, [])],
        [h.make_tensor("shape", T.INT64, [2], [65536, 65536])],
    )
    return _save(graph, path)


def truncated(path: Path) -> Path:
    data = EXAMPLE.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) // 2])
    return path


def small_zoo(root: Path) -> Path:
    """convnet.onnx and nested/chain.onnx (ok), plus the three bad ones."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE, root / "convnet.onnx")
    identity_chain(root / "nested" / "chain.onnx")
    truncated(root / "broken" / "truncated.onnx")
    hangs(root / "hang.onnx")
    needs_16_gib(root / "oom.onnx")
    return root


EXPECTED = {
    "convnet.onnx": "ok",
    "nested/chain.onnx": "ok",
    "broken/truncated.onnx": "refused",
    "hang.onnx": "timeout",
    "oom.onnx": "oom",
}
