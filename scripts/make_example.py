"""Regenerate src/opfuse/examples/convnet.onnx, the small model `make demo` optimizes.

A PyTorch-style export: Conv+BatchNorm+Relu blocks (plain, depthwise and grouped),
an Identity, an inference Dropout and a no-op Reshape, then pooling and a Gemm head.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(7)
nodes: list[onnx.NodeProto] = []
inits: list[onnx.TensorProto] = []


def const(name: str, array: np.ndarray) -> str:
    inits.append(numpy_helper.from_array(array.astype(np.float32), name))
    return name


def conv_bn_relu(x: str, cin: int, cout: int, name: str, group: int = 1, bias: bool = True) -> str:
    w = const(f"{name}.weight", rng.standard_normal((cout, cin // group, 3, 3)) * 0.2)
    inputs = [x, w] + ([const(f"{name}.bias", rng.standard_normal(cout) * 0.1)] if bias else [])
    nodes.append(
        helper.make_node(
            "Conv",
            inputs,
            [f"{name}_conv"],
            name=f"{name}/Conv",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            group=group,
        )
    )
    bn = [
        const(f"{name}.bn.{k}", v)
        for k, v in (
            ("scale", rng.uniform(0.5, 1.5, cout)),
            ("bias", rng.standard_normal(cout) * 0.1),
            ("mean", rng.standard_normal(cout) * 0.1),
            ("var", rng.uniform(0.5, 1.5, cout)),
        )
    ]
    nodes.append(
        helper.make_node(
            "BatchNormalization",
            [f"{name}_conv", *bn],
            [f"{name}_bn"],
            name=f"{name}/BatchNormalization",
            epsilon=1e-5,
        )
    )
    nodes.append(helper.make_node("Relu", [f"{name}_bn"], [f"{name}_relu"], name=f"{name}/Relu"))
    return f"{name}_relu"


def main(out: Path) -> None:
    x = conv_bn_relu("input", 3, 16, "stem")
    nodes.append(helper.make_node("Identity", [x], ["stem_id"], name="stem/Identity"))
    x = conv_bn_relu("stem_id", 16, 16, "dw", group=16)
    x = conv_bn_relu(x, 16, 32, "grouped", group=4, bias=False)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="head/Pool"))
    nodes.append(
        helper.make_node(
            "Reshape",
            ["pool", const("head.shape", np.array([1, 32, 1, 1]))],
            ["pool_r"],
            name="head/Reshape",
        )
    )
    inits[-1] = numpy_helper.from_array(np.array([1, 32, 1, 1], np.int64), "head.shape")
    nodes.append(helper.make_node("Flatten", ["pool_r"], ["flat"], name="head/Flatten"))
    nodes.append(helper.make_node("Dropout", ["flat"], ["drop"], name="head/Dropout"))
    nodes.append(
        helper.make_node(
            "Gemm",
            [
                "drop",
                const("fc.weight", rng.standard_normal((10, 32)) * 0.2),
                const("fc.bias", np.zeros(10)),
            ],
            ["logits"],
            name="head/Gemm",
            transB=1,
        )
    )
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="opfuse-example"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, out)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "src/opfuse/examples/convnet.onnx"))
