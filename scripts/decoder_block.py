"""A random-weight decoder language model with a key/value cache, as exporters name its
inputs and outputs, and samples of one decoding step: what the int4 recipe's figures in
docs/QUANTIZATION.md were measured on (no trained decoder is held here).

    .venv/bin/python scripts/decoder_block.py /tmp/dec --layers 4 --hidden 512
    .venv/bin/opfuse quantize /tmp/dec/decoder.onnx -o /tmp/dec/int4.onnx \\
        --calibration /tmp/dec/samples.npz --recipe int4 --max-drop off --write-slower \\
        --report /tmp/dec/int4.txt

Pre-LN layers (LayerNormalization; single-head attention over the past keys and values
concatenated with the new ones, masked by attention_mask; an MLP of 4x the hidden size with
Relu) -> LayerNormalization -> lm_head: inputs input_ids [1, T], attention_mask [1, P + T],
past_key_values.L.key/value [1, P, hidden]; outputs logits [1, T, vocab],
present.L.key/value [1, P + T, hidden]. The samples: --new tokens (1: one decoding step)
over a past of --past.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper


def build(layers: int, d: int, vocab: int, seed: int = 0, past: bool = True) -> onnx.ModelProto:
    """``past``: with the key/value cache (inputs past_key_values.*, outputs present.*);
    without, the keys and values of the tokens given only (a decoder without past)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(name: str, rows: int, cols: int) -> str:
        return const(name, rng.normal(0, rows**-0.5, (rows, cols)).astype(np.float32))

    nodes: list[onnx.NodeProto] = []

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> str:
        nodes.append(h.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def norm(x: str, name: str) -> str:
        gamma = const(f"{name}.weight", np.ones(d, np.float32))
        beta = const(f"{name}.bias", np.zeros(d, np.float32))
        return node("LayerNormalization", [x, gamma, beta], f"{name}.out", axis=-1)

    const("scale", np.array(d**-0.5, np.float32))
    const("one", np.array(1.0, np.float32))
    const("big", np.array(-1e4, np.float32))
    const("axis1", np.array([1], np.int64))
    embed = const("embed_tokens", rng.normal(0, 1, (vocab, d)).astype(np.float32))
    x = node("Gather", [embed, "input_ids"], "embedded")
    mask = node("Cast", ["attention_mask"], "mask_f", to=T.FLOAT)
    mask = node("Sub", ["one", mask], "mask_inv")
    mask = node("Mul", [mask, "big"], "mask_bias0")
    mask = node("Unsqueeze", [mask, "axis1"], "mask_bias_padding")
    mask = node("Add", [mask, causal(node)], "mask_bias")
    inputs = [
        h.make_tensor_value_info("input_ids", T.INT64, [1, "T"]),
        h.make_tensor_value_info("attention_mask", T.INT64, [1, "S"]),
    ]
    outputs = [h.make_tensor_value_info("logits", T.FLOAT, [1, "T", vocab])]
    for i in range(layers):
        p = f"layers.{i}"
        a = norm(x, f"{p}.ln1")
        q = node("MatMul", [a, weight(f"{p}.q", d, d)], f"{p}.q_proj")
        k = node("MatMul", [a, weight(f"{p}.k", d, d)], f"{p}.k_proj")
        v = node("MatMul", [a, weight(f"{p}.v", d, d)], f"{p}.v_proj")
        keys, values = k, v
        if past:
            keys = node("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=1)
            values = node("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=1)
        kt = node("Transpose", [keys], f"{p}.kt", perm=[0, 2, 1])
        s = node("MatMul", [q, kt], f"{p}.qk")
        s = node("Mul", [s, "scale"], f"{p}.scaled")
        s = node("Add", [s, mask], f"{p}.masked")
        s = node("Softmax", [s], f"{p}.softmax", axis=-1)
        o = node("MatMul", [s, values], f"{p}.pv")
        o = node("MatMul", [o, weight(f"{p}.o", d, d)], f"{p}.o_proj")
        x = node("Add", [x, o], f"{p}.residual1")
        m = norm(x, f"{p}.ln2")
        m = node("MatMul", [m, weight(f"{p}.fc1", d, 4 * d)], f"{p}.fc1_mm")
        m = node("Relu", [m], f"{p}.act")
        m = node("MatMul", [m, weight(f"{p}.fc2", 4 * d, d)], f"{p}.fc2_mm")
        x = node("Add", [x, m], f"{p}.residual2")
        for kind in ("key", "value") if past else ():
            inputs.append(
                h.make_tensor_value_info(f"past_key_values.{i}.{kind}", T.FLOAT, [1, "P", d])
            )
            outputs.append(h.make_tensor_value_info(f"present.{i}.{kind}", T.FLOAT, [1, "S", d]))
    x = norm(x, "final_ln")
    node("MatMul", [x, weight("lm_head", d, vocab)], "logits")
    graph = h.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def causal(node: Callable[..., str]) -> str:
    """The causal mask's bias [T, S]: 0 where new token i may attend to position j (j <=
    S - T + i: the past and the new tokens up to itself), -1e4 elsewhere (a Trilu)."""
    ids = node("Shape", ["input_ids"], "ids_shape")
    seen = node("Shape", ["attention_mask"], "mask_shape")
    t = node("Gather", [ids, "axis1"], "new_tokens")
    s = node("Gather", [seen, "axis1"], "all_tokens")
    shape = node("Concat", [t, s], "causal_shape", axis=0)
    ones = node(
        "ConstantOfShape", [shape], "causal_ones", value=h.make_tensor("v", T.FLOAT, [1], [1.0])
    )
    offset = node("Sub", [s, t], "causal_offset")
    offset = node("Squeeze", [offset], "causal_k")
    allowed = node("Trilu", [ones, offset], "causal_allowed", upper=0)
    blocked = node("Sub", ["one", allowed], "causal_blocked")
    return node("Mul", [blocked, "big"], "causal_bias")


def samples(
    layers: int, d: int, vocab: int, past: int, count: int, new: int = 1, cache: bool = True
) -> dict[str, np.ndarray]:
    """``count`` decoding steps (``new`` tokens each: 1, one generated token; more, a
    prompt's prefill) stacked on the first axis; ``cache``: with past keys and values (of
    ``past`` tokens; without, ``past`` must be 0)."""
    rng = np.random.default_rng(1)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(0, vocab, (count, new)).astype(np.int64),
        "attention_mask": np.ones((count, past + new), np.int64),
    }
    for i in range(layers):
        for kind in ("key", "value") if cache else ():
            feeds[f"past_key_values.{i}.{kind}"] = rng.normal(0, 1, (count, past, d)).astype(
                np.float32
            )
    return feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--past", type=int, default=127)
    parser.add_argument("--new", type=int, default=1, help="new tokens a step (1: decoding)")
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--no-past", action="store_true", help="no key/value cache")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build(args.layers, args.hidden, args.vocab, past=not args.no_past)
    onnx.save(model, str(args.out / "decoder.onnx"))
    past = 0 if args.no_past else args.past
    cache = not args.no_past
    feeds = samples(args.layers, args.hidden, args.vocab, past, args.samples, args.new, cache)
    np.savez(args.out / "samples.npz", **feeds)  # type: ignore[arg-type]
    print(f"{args.out / 'decoder.onnx'}, {args.out / 'samples.npz'}")


if __name__ == "__main__":
    main()
