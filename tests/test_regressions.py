"""Regression tests: one per bug the reliability work found (issue 8), each failing on
the code before its fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from opfuse import io
from opfuse.api import optimize_model
from opfuse.passes.batchnorm import scaled_weight
from opfuse.passes.cse import dedupe_initializers
from opfuse.shapes import infer_shapes

RNG = np.random.default_rng(0)


def external_model(tmp_path: Path, model: onnx.ModelProto) -> ir.Model:
    path = tmp_path / "m.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="m.data", size_threshold=0
    )
    return io.load_model(path)


def conv_bn(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"),
        helper.make_node("Conv", ["x", "w_copy"], ["y2"], name="conv_copy"),
        helper.make_node("Conv", ["x", "w_other"], ["y3"], name="conv_other"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 3, 3])
            for n in ("y", "y2", "y3")
        ],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def weights() -> dict[str, np.ndarray]:
    w = RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)
    return {
        "w": w,
        "w_copy": w.copy(),
        "w_other": RNG.standard_normal((4, 4, 1, 1)).astype(np.float32),
        **{k: RNG.uniform(0.5, 1.5, 4).astype(np.float32) for k in ("s", "b", "m", "v")},
    }


def test_duplicate_initializers_are_hashed_without_keeping_copies(tmp_path):
    """CommonSubexpressionFusionPass kept a bytes copy of every same-shape initializer it
    hashed, and left each memory-mapped weight mapped: on a 2.25 GiB model that alone
    took 1.6 GiB. Now the external weights it read are unmapped afterwards."""
    model = external_model(tmp_path, conv_bn(weights()))
    tensors = {v.name: v.const_value for v in model.graph.initializers.values()}
    assert isinstance(tensors["w"], ir.ExternalTensor)
    assert dedupe_initializers(model.graph) == 1  # w_copy merged into w
    assert "w_copy" not in model.graph.initializers
    assert all(t.raw is None for t in tensors.values() if isinstance(t, ir.ExternalTensor))


def test_dead_code_unmaps_the_weights_a_fold_replaced(tmp_path):
    """The Conv weight a BatchNormalization fold replaced stayed memory-mapped until the
    model was freed (its pages counted in the optimizer's peak memory)."""
    ws = weights()
    model = external_model(tmp_path, conv_bn(ws))
    old_w = model.graph.initializers["w_other"].const_value  # keeps its reader
    folded_w = model.graph.initializers["w"].const_value
    optimize_model(
        model, switch_table={"GraphFusion": {"ALL": False}}, enable=["ConvBatchNormFusionPass"]
    )
    assert "BatchNormalization" not in {n.op_type for n in model.graph}
    assert isinstance(folded_w, ir.ExternalTensor) and folded_w.raw is None
    assert isinstance(old_w, ir.ExternalTensor)
    assert np.array_equal(old_w.numpy(), ws["w_other"])  # a kept weight still reads


def test_blockwise_bn_scaling_equals_the_whole_computation():
    """The fold scales W in float64 blocks of output channels (no whole float64 copy of
    a large weight): the result is bit-identical to scaling it whole."""
    w = RNG.standard_normal((300, 70, 3, 3)).astype(np.float32)
    s = RNG.uniform(0.1, 3.0, 300)
    whole = (w.astype(np.float64) * s.reshape(-1, 1, 1, 1)).astype(np.float32)
    assert np.array_equal(scaled_weight(w, s, transposed=False, group=1), whole)


def test_shape_inference_fills_values_inside_subgraphs():
    """Values inside If/Loop/Scan bodies got no shapes or dtypes, so no rule needing one
    (MatMulBiasAdd, Gemm, layout) could fire inside a body."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["xt", "w"], ["mm"]),
            helper.make_node("Add", ["h", "mm"], ["h_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("xt", TensorProto.FLOAT, [2, 5]),
        ],
        [helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 3])],
    )
    graph = helper.make_graph(
        [helper.make_node("Scan", ["h0", "seq"], ["h_last"], body=body, num_scan_inputs=1)],
        "main",
        [
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("seq", TensorProto.FLOAT, [4, 2, 5]),
        ],
        [helper.make_tensor_value_info("h_last", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(RNG.standard_normal((5, 3)).astype(np.float32), "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = ir.from_proto(proto)
    infer_shapes(model)
    (sub,) = model.graph.subgraphs()
    mm = next(n for n in sub if n.op_type == "MatMul").outputs[0]
    assert mm.dtype == ir.DataType.FLOAT and mm.shape == ir.Shape([2, 3])
