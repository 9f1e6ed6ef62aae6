"""Small float transformer blocks built with onnx.helper, in the forms torch's exporters
write: a BERT encoder as the dynamo exporter writes it (a value_info for every value, the
sizes of its Reshapes computed from Shape ops at run time) and GPT-2's MLP with its
tanh-approximation GELU (``x^3`` as a Pow). Seeded, random weights."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS = 32, 4


class _Graph:
    """Nodes and initializers of one graph, named as they are added."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, name: str, *shape: int, scale: float = 0.2) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], out: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x: str, name: str, n_in: int, n_out: int) -> str:
        mm = self.op("MatMul", [x, self.weight(f"{name}.weight", n_in, n_out)], f"{name}/mm")
        return self.op("Add", [mm, self.weight(f"{name}.bias", n_out)], name)


def _layer_norm(g: _Graph, x: str, name: str) -> str:
    scale = g.const(f"{name}.weight", np.ones(HIDDEN, np.float32))
    bias = g.const(f"{name}.bias", np.zeros(HIDDEN, np.float32))
    return g.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=1e-12)


def _attention(g: _Graph, x: str, i: int, sizes: tuple[str, str]) -> str:
    """Multi-head self-attention; the heads split and joined by Reshapes whose shape is a
    Concat of the input's sizes (as the dynamo exporter writes ``view``)."""
    batch, seq = sizes
    dh = HIDDEN // HEADS
    split = g.op(
        "Concat", [batch, seq, g.const(f"l{i}.heads", np.array([HEADS, dh]))], f"l{i}/split", axis=0
    )
    heads = {}
    for part in ("q", "k", "v"):
        y = g.linear(x, f"l{i}.{part}", HIDDEN, HIDDEN)
        r = g.op("Reshape", [y, split], f"l{i}/{part}/view", allowzero=1)
        heads[part] = g.op("Transpose", [r], f"l{i}/{part}/heads", perm=[0, 2, 1, 3])
    kt = g.op("Transpose", [heads["k"]], f"l{i}/kt", perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [heads["q"], kt], f"l{i}/scores")
    scale = g.const(f"l{i}.scale", np.array(1 / math.sqrt(dh), np.float32))
    scaled = g.op("Mul", [scores, scale], f"l{i}/scaled")
    probs = g.op("Softmax", [scaled], f"l{i}/probs", axis=-1)
    context = g.op("MatMul", [probs, heads["v"]], f"l{i}/context")
    joined = g.op("Transpose", [context], f"l{i}/joined", perm=[0, 2, 1, 3])
    shape = g.op(
        "Concat", [batch, seq, g.const(f"l{i}.hidden", np.array([HIDDEN]))], f"l{i}/join", axis=0
    )
    view = g.op("Reshape", [joined, shape], f"l{i}/view", allowzero=1)
    return g.linear(view, f"l{i}.out", HIDDEN, HIDDEN)


def _erf_gelu(g: _Graph, x: str, i: int) -> str:
    div = g.op("Div", [x, g.const(f"l{i}.sqrt2", np.array(math.sqrt(2), np.float32))], f"l{i}/d")
    erf = g.op("Erf", [div], f"l{i}/erf")
    plus = g.op("Add", [erf, g.const(f"l{i}.one", np.array(1.0, np.float32))], f"l{i}/plus")
    half = g.op("Mul", [x, g.const(f"l{i}.half", np.array(0.5, np.float32))], f"l{i}/half")
    return g.op("Mul", [half, plus], f"l{i}/gelu")


def dynamo_bert(layers: int = 2, seed: int = 0) -> onnx.ModelProto:
    """x[batch, seq, HIDDEN] -> ``layers`` post-LN BERT layers -> y; every value described
    by a value_info (shape inference with data propagation: the Reshapes' symbolic sizes),
    as the dynamo exporter describes them. Without that value_info onnxruntime cannot tell
    the residual Add's inputs have the same shape, and does not make SkipLayerNormalization
    (two per layer with it)."""
    g = _Graph(seed)
    batch = g.op("Shape", ["x"], "batch", start=0, end=1)
    seq = g.op("Shape", ["x"], "seq", start=1, end=2)
    h = _layer_norm(g, "x", "embeddings.norm")
    for i in range(layers):
        attended = _attention(g, h, i, (batch, seq))
        h = _layer_norm(g, g.op("Add", [attended, h], f"l{i}/residual1"), f"l{i}.norm1")
        inner = g.linear(h, f"l{i}.ffn1", HIDDEN, 4 * HIDDEN)
        out = g.linear(_erf_gelu(g, inner, i), f"l{i}.ffn2", 4 * HIDDEN, HIDDEN)
        h = _layer_norm(g, g.op("Add", [out, h], f"l{i}/residual2"), f"l{i}.norm2")
    g.op("Identity", [h], "y")
    dims = ["batch", "seq", HIDDEN]
    graph = helper.make_graph(
        g.nodes,
        "dynamo_bert",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def node_output_value_info(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The value_info of the main graph's node outputs, by name."""
    outputs = {out for node in model.graph.node for out in node.output}
    return {v.name: v.type for v in model.graph.value_info if v.name in outputs}


def gpt2_mlp(blocks: int = 1, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """x[batch, seq, HIDDEN] -> ``blocks`` x (Linear -> tanh GELU as GPT-2 writes it,
    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))`` -> Linear) -> y,
    and a lone ``pow(y, 3)`` after them, which is no GELU's (output ``cube``)."""
    g = _Graph(seed)
    h = "x"
    for i in range(blocks):
        x = g.linear(h, f"b{i}.fc", HIDDEN, 4 * HIDDEN)
        three = g.const(f"b{i}.three", np.array(3.0, np.float32))
        cube = g.op("Pow", [x, three], f"b{i}/pow")
        term = g.op("Mul", [g.const(f"b{i}.c", np.array(0.044715, np.float32)), cube], f"b{i}/t")
        inner = g.op("Add", [x, term], f"b{i}/inner")
        root = g.const(f"b{i}.s", np.array(math.sqrt(2 / math.pi), np.float32))
        tanh = g.op("Tanh", [g.op("Mul", [root, inner], f"b{i}/scaled")], f"b{i}/tanh")
        plus = g.op("Add", [g.const(f"b{i}.one", np.array(1.0, np.float32)), tanh], f"b{i}/plus")
        half = g.op("Mul", [g.const(f"b{i}.half", np.array(0.5, np.float32)), x], f"b{i}/half")
        gelu = g.op("Mul", [half, plus], f"b{i}/gelu")
        h = g.linear(gelu, f"b{i}.proj", 4 * HIDDEN, HIDDEN)
    g.op("Identity", [h], "y")
    g.op("Pow", ["y", g.const("three", np.array(3.0, np.float32))], "cube")
    dims = ["batch", "seq", HIDDEN]
    graph = helper.make_graph(
        g.nodes,
        "gpt2_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, dims),
            helper.make_tensor_value_info("cube", TensorProto.FLOAT, dims),
        ],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model
