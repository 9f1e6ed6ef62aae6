"""Slow: on every zoo model the default passes leave no BatchNormalization after a
linear layer (through a Transpose, identity Reshape or bias Add), and the Keras NHWC
exports keep no decomposed BatchNorm (Add/Sub/Mul/Div of a constant) after a Conv,
directly or through its Transpose; every result verifies and passes onnx.checker."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from opfuse.pipeline.conductor import optimize_file

pytestmark = pytest.mark.slow

LINEAR = ("Conv", "ConvTranspose", "Gemm", "MatMul")
KERAS = ("keras_mobilenetv3small", "keras_resnet50")
# as tests/zoo.py: OPFUSE_ZOO names the zoo where it is not ../shared/zoo (a git worktree)
ZOO = (
    Path(
        os.environ.get("OPFUSE_ZOO", Path(__file__).resolve().parents[2].parent / "shared" / "zoo")
    )
    / "models"
)
ZOO_MODELS = sorted(p.stem for p in ZOO.glob("*.onnx"))


def optimized(zoo_dir, tmp_path, name: str) -> onnx.ModelProto:
    out = tmp_path / f"{name}.onnx"
    result = optimize_file(zoo_dir / f"{name}.onnx", out)
    assert result.verify is not None and result.verify.ok, result.verify
    onnx.checker.check_model(str(out))
    return onnx.load_model(str(out), load_external_data=False)


def constants(model: onnx.ModelProto) -> set[str]:
    names = {init.name for init in model.graph.initializer}
    names |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return names


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_no_batchnorm_after_a_linear_layer(zoo_dir, tmp_path, name):
    model = optimized(zoo_dir, tmp_path, name)
    producer = {o: n for n in model.graph.node for o in n.output}
    leftover = []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        p = producer.get(node.input[0])
        while p is not None and p.op_type in ("Transpose", "Reshape", "Add"):
            p = producer.get(p.input[0])
        if p is not None and p.op_type in LINEAR:
            leftover.append(node.name)
    assert not leftover


@pytest.mark.parametrize("name", [n for n in KERAS if n in ZOO_MODELS])
def test_keras_exports_keep_no_decomposed_batchnorm_after_convs(zoo_dir, tmp_path, name):
    before = onnx.load_model(str(zoo_dir / f"{name}.onnx"), load_external_data=False)
    model = optimized(zoo_dir, tmp_path, name)
    consts = constants(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    chains = []
    for node in model.graph.node:
        if node.op_type not in ("Add", "Sub", "Mul", "Div"):
            continue
        inputs = [i for i in node.input if i not in consts]
        if len(inputs) != 1 or len(node.input) != 2:
            continue
        p = producer.get(inputs[0])
        if p is not None and p.op_type == "Transpose":
            p = producer.get(p.input[0])
        if p is not None and p.op_type in ("Conv", "ConvTranspose"):
            chains.append(node.name)
    assert not chains
    subs = sum(n.op_type == "Sub" for n in before.graph.node)
    assert subs >= 40  # the export really had the decomposed BatchNorms
