"""The faster twins of onnxruntime's quantizer helpers (quantization/ort_speedups.py):
the same int8 model byte for byte, put back after, and left out where onnxruntime's own
code is not the one they were written against."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.quantization import flow, ort_backend, ort_speedups


def branching_mlp() -> onnx.ModelProto:
    """x -> MatMul -> Relu, read by two MatMuls (a tensor with two readers) -> Add -> y."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}")
        for i in range(3)
    ]
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
            h.make_node("Relu", ["a"], ["r"], name="relu"),
            h.make_node("MatMul", ["r", "w1"], ["b"], name="mm1"),
            h.make_node("MatMul", ["r", "w2"], ["c"], name="mm2"),
            h.make_node("Add", ["b", "c"], ["y"], name="add"),
        ],
        "branching",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
        weights,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def quantized_bytes(tmp_path: Path, name: str, faster: bool) -> bytes:
    from onnxruntime import quantization as q

    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}.int8.onnx"
    onnx.save_model(branching_mlp(), str(src))
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.it, None)

    args = (q, src, out, Reader(), flow.QuantOptions(), [], {}, None)
    if faster:
        with ort_speedups.faster_quantizer() as replaced:
            assert replaced == ["find_by_name", "replace_input_of_all_nodes"]
            ort_backend._quantize_static(*args)
    else:
        ort_backend._quantize_static(*args)
    return onnx.load_model(str(out)).SerializeToString()


def test_the_twins_make_the_same_int8_model(tmp_path):
    assert quantized_bytes(tmp_path, "own", False) == quantized_bytes(tmp_path, "twins", True)


def test_onnxruntime_gets_its_own_functions_back():
    from onnxruntime.quantization import qdq_quantizer, quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    own = (ONNXModel.replace_input_of_all_nodes, quant_utils.find_by_name)
    with ort_speedups.faster_quantizer():
        assert qdq_quantizer.find_by_name is ort_speedups.find_by_name
    assert (ONNXModel.replace_input_of_all_nodes, quant_utils.find_by_name) == own
    assert qdq_quantizer.find_by_name is own[1]


def test_other_onnxruntime_code_keeps_its_own(monkeypatch):
    """A newer onnxruntime whose functions read otherwise: nothing replaced."""
    from onnxruntime.quantization import quant_utils

    monkeypatch.setattr(
        ort_speedups, "KNOWN_SOURCES", dict.fromkeys(ort_speedups.KNOWN_SOURCES, "0" * 16)
    )
    with ort_speedups.faster_quantizer() as replaced:
        assert replaced == [] and quant_utils.find_by_name is not ort_speedups.find_by_name


def test_the_twins_do_what_onnxruntimes_do():
    """find_by_name: the first match, else None; replace_input_of_all_nodes: every input
    of that name of every node, nothing else."""
    items = [onnx.TensorProto(name="a"), onnx.TensorProto(name="b"), onnx.TensorProto(name="a")]
    items[2].dims.append(3)
    assert ort_speedups.find_by_name("a", items) is items[0]
    assert ort_speedups.find_by_name("z", items) is None
    from onnxruntime.quantization.onnx_model import ONNXModel

    model = ONNXModel(branching_mlp())
    ort_speedups.replace_input_of_all_nodes(model, "r", "r_dq")
    inputs = [list(n.input) for n in model.model.graph.node]
    assert inputs == [["x", "w0"], ["a"], ["r_dq", "w1"], ["r_dq", "w2"], ["b", "c"]]
