"""Zoo acceptance for constant folding and the arithmetic passes (slow): every model
optimizes with folding on, verifies, passes onnx.checker and does not grow on disk; the
transformers keep no Shape arithmetic on static dims; node counts are at or below
onnxslim's and onnxsim's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from opfuse.pipeline.conductor import optimize_file
from zoo import ZOO_MODELS

MODELS = ZOO_MODELS
TRANSFORMERS = ["transformer_tiny", "tx100", "bert_small"]
SHAPE_OPS = ("Shape", "Gather", "Slice", "Unsqueeze", "Squeeze", "Concat", "Cast", "Identity")


def node_count(model: onnx.ModelProto) -> int:
    def walk(graph: onnx.GraphProto) -> int:
        total = 0
        for node in graph.node:
            total += 1
            for a in node.attribute:
                total += sum(walk(g) for g in ([a.g] if a.HasField("g") else [*a.graphs]))
        return total

    return walk(model.graph)


Elements = list  # a shape vector's elements: an int where static, None where run-time


def _shape_vector(
    node: onnx.NodeProto, known: dict[str, tuple[Elements, bool]], dims, consts
) -> tuple[Elements, bool] | None:
    """The elements a shape-arithmetic node computes (and whether it is a scalar), from
    the static dims of the tensors it measures; None when not shape arithmetic."""
    op = node.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if op == "Shape":
        x = dims.get(node.input[0])
        if x is None:
            return None
        return list(x)[slice(attrs.get("start", 0), attrs.get("end"))], False
    if not node.input or node.input[0] not in known:
        return None
    data, _ = known[node.input[0]]
    if op in ("Cast", "Identity", "Squeeze"):
        return known[node.input[0]] if op != "Squeeze" else (data, len(data) == 1)
    if op == "Unsqueeze":
        return data, False
    if op == "Gather" and attrs.get("axis", 0) == 0 and node.input[1] in consts:
        idx = consts[node.input[1]]
        return [data[int(i)] for i in np.atleast_1d(idx)], idx.ndim == 0
    if op == "Slice" and all(i in consts for i in node.input[1:] if i):
        starts, ends, *rest = (consts[i].reshape(-1) for i in node.input[1:] if i)
        step = int(rest[1][0]) if len(rest) > 1 else 1
        return data[slice(int(starts[0]), int(ends[0]), step)], False
    if op == "Concat" and all(i in known for i in node.input):
        return [e for i in node.input for e in known[i][0]], False
    return None


def static_shape_arithmetic(model: onnx.ModelProto) -> list[str]:
    """Shape arithmetic whose result is fully static, folding's misses: Shape, and
    Gather/Slice/Unsqueeze/Squeeze/Concat/Cast of shape vectors and small integer
    constants, where every element is a static dim or a constant."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    dims = {
        v.name: [
            d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim
        ]
        for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
        if v.type.tensor_type.HasField("shape")
    }
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in inferred.graph.initializer}
    known: dict[str, tuple[Elements, bool]] = {
        name: ([int(v) for v in a.reshape(-1)], a.ndim == 0)
        for name, a in consts.items()
        if a.dtype.kind == "i" and a.ndim <= 1 and a.size <= 16
    }
    missed = []
    for node in inferred.graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            a = onnx.numpy_helper.to_array(node.attribute[0].t)
            consts[node.output[0]] = a
            if a.dtype.kind == "i" and a.ndim <= 1 and a.size <= 16:
                known[node.output[0]] = ([int(v) for v in a.reshape(-1)], a.ndim == 0)
        if node.op_type not in SHAPE_OPS:
            continue
        result = _shape_vector(node, known, dims, consts)
        if result is None:
            continue
        known[node.output[0]] = result
        if all(e is not None for e in result[0]):
            missed.append(f"{node.op_type} {node.name}")
    return missed


def test_static_shape_arithmetic_finds_every_kind_of_miss():
    helper = onnx.helper
    k = onnx.numpy_helper.from_array
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["g"], name="gather_static"),
        helper.make_node("Gather", ["s", "i0"], ["g0"], name="gather_dynamic"),
        helper.make_node("Slice", ["s", "one", "three"], ["sl"], name="slice_static"),
        helper.make_node("Unsqueeze", ["g", "zero"], ["u"], name="unsqueeze_static"),
        helper.make_node("Unsqueeze", ["g0", "zero"], ["u0"], name="unsqueeze_dynamic"),
        helper.make_node("Concat", ["u", "sl"], ["c"], axis=0, name="concat_static"),
        helper.make_node("Concat", ["u0", "sl"], ["c0"], axis=0, name="concat_dynamic"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, None) for n in ("c", "c0")],
        [
            k(np.array(1, np.int64), "i1"),
            k(np.array(0, np.int64), "i0"),
            k(np.array([1], np.int64), "one"),
            k(np.array([3], np.int64), "three"),
            k(np.array([0], np.int64), "zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert static_shape_arithmetic(model) == [
        "Gather gather_static",
        "Slice slice_static",
        "Unsqueeze unsqueeze_static",
        "Concat concat_static",
    ]


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
