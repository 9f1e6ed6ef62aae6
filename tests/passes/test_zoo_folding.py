"""Zoo acceptance for constant folding and the arithmetic passes (slow): every model
optimizes with folding on, verifies, passes onnx.checker and does not grow on disk; the
transformers keep no Shape arithmetic on static dims; node counts are at or below
onnxslim's and onnxsim's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from opfuse.api import optimize_file

ZOO = Path(__file__).resolve().parents[3] / "shared" / "zoo"
MODELS = sorted(p.stem for p in (ZOO / "models").glob("*.onnx")) if ZOO.exists() else []
TRANSFORMERS = ["transformer_tiny", "tx100", "bert_small"]


def node_count(model: onnx.ModelProto) -> int:
    def walk(graph: onnx.GraphProto) -> int:
        total = 0
        for node in graph.node:
            total += 1
            for a in node.attribute:
                total += sum(walk(g) for g in ([a.g] if a.HasField("g") else [*a.graphs]))
        return total

    return walk(model.graph)


def static_shape_arithmetic(model: onnx.ModelProto) -> list[str]:
    """Shape nodes (and Gather/Slice of them) whose dims are all static: folding's misses."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    dims = {
        v.name: [
            d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim
        ]
        for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
        if v.type.tensor_type.HasField("shape")
    }
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in inferred.graph.initializer}
    shapes = {n.output[0]: n for n in inferred.graph.node if n.op_type == "Shape"}
    missed = []
    for node in inferred.graph.node:
        if node.op_type == "Shape":
            x = dims.get(node.input[0])
            if x is not None and all(d is not None for d in x):
                missed.append(node.name)
        elif node.op_type == "Gather" and node.input[0] in shapes:
            x = dims.get(shapes[node.input[0]].input[0])
            idx = consts.get(node.input[1])
            static = x is not None and idx is not None
            if static and all(x[int(i)] is not None for i in np.atleast_1d(idx)):
                missed.append(node.name)
    return missed


@pytest.fixture(scope="module")
def optimized(zoo_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("folded")
    cache = {}

    def get(name):
        if name not in cache:
            out = out_dir / f"{name}.onnx"
            cache[name] = (optimize_file(zoo_dir / f"{name}.onnx", out), out)
        return cache[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_folds_verifies_and_does_not_grow(optimized, zoo_dir, name):
    result, out = optimized(name)
    assert result.verify is not None and result.verify.ok, result.verify
    onnx.checker.check_model(str(out), full_check=True)
    assert result.output_bytes <= result.input_bytes
    assert result.after.get("Constant", 0) == 0  # all became initializers


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in TRANSFORMERS if m in MODELS])
def test_transformers_keep_no_shape_arithmetic_on_static_dims(optimized, name):
    _, out = optimized(name)
    assert static_shape_arithmetic(onnx.load(str(out))) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_node_count_at_or_below_onnxslim_and_onnxsim(optimized, zoo_dir, name):
    onnxslim = pytest.importorskip("onnxslim")
    onnxsim = pytest.importorskip("onnxsim")
    _, out = optimized(name)
    ours = node_count(onnx.load(str(out), load_external_data=False))
    src = str(zoo_dir / f"{name}.onnx")
    slim = node_count(onnxslim.slim(src))
    simplified, _ = onnxsim.simplify(onnx.load(src))
    assert ours <= slim, f"opfuse {ours} nodes, onnxslim {slim}"
    assert ours <= node_count(simplified), f"opfuse {ours}, onnxsim {node_count(simplified)}"
