"""The transformer benchmark's harness (bench/quant_transformers.py, its text and graph
modules) without downloads: the
WordPiece tokenizer on a tiny vocabulary, the pooling, cosine and neighbour figures on
arrays, the safetensors reader on bytes made here, the BERT graph builder on tiny random
weights against a numpy BERT written here, and the docs section replaced in place."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import quant_transformers as qt  # noqa: E402
from bench import transformer_models as tm  # noqa: E402
from bench import transformer_text as tt  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cafe", "un", "##aff", "##able", ",", "!",
         "hello", "world", "##s", "run"]  # fmt: skip


def test_basic_tokenizer_lowers_strips_accents_and_splits_punctuation() -> None:
    tok = tt.WordPiece(VOCAB)
    assert tok.basic("Hello, Wörld!\tCafé\x00") == ["hello", ",", "world", "!", "cafe"]
    assert tok.basic("a\u4e2db") == ["a", "\u4e2d", "b"]  # CJK characters stand alone


def test_wordpiece_longest_match_and_unknown() -> None:
    tok = tt.WordPiece(VOCAB)
    assert tok.pieces("unaffable") == ["un", "##aff", "##able"]
    assert tok.pieces("runs") == ["run", "##s"]
    assert tok.pieces("unx") == ["[UNK]"]  # one unmatched rest: the whole word is unknown
    assert tt.WordPiece(VOCAB, max_word=3).pieces("runs") == ["[UNK]"]


def test_encode_pads_truncates_and_masks() -> None:
    tok = tt.WordPiece(VOCAB)
    feeds = tok.encode(["Hello, world!", "the unaffable cafe runs the run"], length=6)
    ids = {t: i for i, t in enumerate(VOCAB)}
    assert feeds["input_ids"][0].tolist() == [
        ids[t] for t in ("[CLS]", "hello", ",", "world", "!", "[SEP]")
    ]
    row = ["[CLS]", "the", "un", "##aff", "##able", "[SEP]"]  # truncated to 6 with [SEP]
    assert feeds["input_ids"][1].tolist() == [ids[t] for t in row]
    short = tok.encode(["the"], length=5)
    assert short["input_ids"][0].tolist() == [2, 4, 3, 0, 0]
    assert short["attention_mask"][0].tolist() == [1, 1, 1, 0, 0]
    assert short["token_type_ids"].dtype == np.int64 and not short["token_type_ids"].any()


def test_mean_pooling_ignores_masked_tokens_and_normalises() -> None:
    hidden = np.array([[[3.0, 0.0], [1.0, 4.0], [100.0, -100.0]]])
    mask = np.array([[1, 1, 0]])
    pooled = qt.mean_pooled(hidden, mask)
    assert pooled[0] == pytest.approx(np.array([2.0, 2.0]) / math.sqrt(8))


def test_embedding_figures_by_hand() -> None:
    ref = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    # row 0 turned, rows 1 and 2 kept: float neighbours 0->1, 1->0 or 2 (0.8 vs 0.6: 0),
    # 2->1; int8 row 0 = (0.6, 0.8): 0->1 (0.96), 1->0 (0.96 > 0.6), 2->0 (0.8 > 0.6)
    got = np.array([[0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
    assert qt.nearest(ref).tolist() == [1, 0, 1]
    assert qt.nearest(got).tolist() == [1, 0, 0]
    fig = qt.embedding_figures(ref, got)
    assert fig["cosine_mean"] == pytest.approx((0.6 + 1.0 + 1.0) / 3)
    assert fig["cosine_min"] == pytest.approx(0.6)
    assert fig["same_neighbour"] == pytest.approx(2 / 3)


def test_read_safetensors() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[0, 1, 2]], dtype=np.int64)
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "I64", "shape": [1, 3], "data_offsets": [24, 48]}}  # fmt: skip
    head = json.dumps(header).encode()
    raw = len(head).to_bytes(8, "little") + head + a.tobytes() + b.tobytes()
    got = tm.read_safetensors(raw)
    assert set(got) == {"a", "b"}
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)


CONFIG: dict[str, Any] = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 12, "vocab_size": 11, "max_position_embeddings": 10,
          "type_vocab_size": 2, "layer_norm_eps": 1e-12}  # fmt: skip


def tiny_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, f = CONFIG["hidden_size"], CONFIG["intermediate_size"]

    def r(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": r(CONFIG["vocab_size"], h),
         "embeddings.position_embeddings.weight": r(CONFIG["max_position_embeddings"], h),
         "embeddings.token_type_embeddings.weight": r(2, h),
         "embeddings.LayerNorm.weight": 1 + r(h), "embeddings.LayerNorm.bias": r(h)}  # fmt: skip
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, out, inp in (("attention.self.query", h, h), ("attention.self.key", h, h),
                               ("attention.self.value", h, h), ("attention.output.dense", h, h),
                               ("intermediate.dense", f, h), ("output.dense", h, f)):  # fmt: skip
            w[p + name + ".weight"], w[p + name + ".bias"] = r(out, inp), r(out)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = 1 + r(h), r(h)
    return w


def numpy_bert(
    w: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray, types: np.ndarray
) -> np.ndarray:
    """Hugging Face BertModel's last_hidden_state, written out in float64."""
    heads, eps = CONFIG["num_attention_heads"], CONFIG["layer_norm_eps"]
    w = {k: v.astype(np.float64) for k, v in w.items()}
    erf = np.vectorize(math.erf)

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x: np.ndarray, p: str) -> np.ndarray:
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    b, s = ids.shape
    e = "embeddings."
    x = w[e + "word_embeddings.weight"][ids] + w[e + "token_type_embeddings.weight"][types]
    x = ln(x + w[e + "position_embeddings.weight"][np.arange(s)][None], e + "LayerNorm")
    add_mask = (1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(b, s, heads, -1).transpose(0, 2, 1, 3)

        q, k, v = (split(lin(x, p + "attention.self." + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]) + add_mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)
        a = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        f = lin(a, p + "intermediate.dense")
        g = 0.5 * f * (1 + erf(f / math.sqrt(2)))
        x = ln(lin(g, p + "output.dense") + a, p + "output.LayerNorm")
    return x


def test_bert_graph_matches_numpy_bert_in_onnxruntime() -> None:
    import onnx
    from bench.measure import session

    rng = np.random.default_rng(0)
    w = tiny_weights(rng)
    model = tm.bert_graph(w, CONFIG)
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    ops = {n.op_type for n in model.graph.node}
    assert {"LayerNormalization", "Erf", "Softmax", "MatMul"} <= ops
    ids = rng.integers(0, CONFIG["vocab_size"], (2, 7)).astype(np.int64)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int64)
    types = np.zeros_like(ids)
    for level in ("off", "all"):
        sess = session(model.SerializeToString(), level)
        (got,) = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        assert got.shape == (2, 7, CONFIG["hidden_size"])
        np.testing.assert_allclose(got, numpy_bert(w, ids, mask, types), atol=2e-4, rtol=1e-4)
    # the padding is masked: the second sentence's first 4 tokens as if alone
    (alone,) = session(model.SerializeToString(), "off").run(
        None,
        {"input_ids": ids[1:, :4], "attention_mask": mask[1:, :4], "token_type_ids": types[1:, :4]},
    )
    np.testing.assert_allclose(alone[0], got[1, :4], atol=1e-5)
    onnx.checker.check_model(model)


def test_text_split_is_disjoint_and_full() -> None:
    cal, held = tt.texts()
    assert len(cal) == tt.CALIBRATION and len(held) == tt.HELD_OUT
    assert not set(cal) & set(held)
    assert all(6 <= len(s.split()) <= 80 and ">>>" not in s for s in cal + held)


def test_table_and_docs_section_replaced(tmp_path: Path) -> None:
    results = {
        "cpus": 2, "load_before": "1 1 1", "load_after": "2 2 2", "onnxruntime": "1.32.0",
        "encoders": {"e": {"note": "an encoder", "calibration": 64, "held_out": 160,
                           "latency": {"runtime": "ort", "float_ms": 30.0, "noise": 0.01, "rounds": 9,
                                       "ratio": {"ort-dynamic": 0.5}},
                           "rows": {"float": {"cosine_mean": 1.0, "cosine_min": 1.0, "same_neighbour": 1.0, "size": 9e7},
                                    "ort-dynamic": {"cosine_mean": 0.96, "cosine_min": 0.91, "same_neighbour": 0.82,
                                                    "seconds": 1.2, "size": 5.8e7},
                                    "opfuse": {"error": "exit 1: gate", "default_exit": 1, "passed": False,
                                               "int8_pays": True, "recipe": "x", "seconds": 90.0}}}},
    }  # fmt: skip
    section = qt.table(results, "python -m bench.quant_transformers")
    assert (
        "| onnxruntime `quantize_dynamic` QInt8, per tensor | 0.960 / 0.910 | 82% | 0.50 |  | 1 | 58.0 |"
        in section
    )
    assert "without --write-slower: exit 1 (passed False" in section
    doc = tmp_path / "B.md"
    doc.write_text("# B\n\nbefore\n", encoding="utf-8")
    qt.write_docs(doc, section)
    qt.write_docs(doc, section.replace("0.960", "0.970"))
    text = doc.read_text(encoding="utf-8")
    assert text.count(qt.MARK_BEGIN) == 1 and "0.970 / 0.910" in text and "before" in text


def test_goal_text_judges_against_the_best_peer_and_the_noise() -> None:
    row = {"cosine_mean": 0.995, "cosine_min": 0.98, "same_neighbour": 0.9}
    enc: dict[str, Any] = {"rows": {"opfuse": row,
                    "ort-dynamic": {**row, "same_neighbour": 0.8},
                    "ort-dynamic-channel": {**row, "same_neighbour": 0.95}},
           "latency": {"noise": 0.01, "ratio": {"opfuse": 0.43, "ort-dynamic": 0.42,
                                                "ort-dynamic-channel": 0.428}}}  # fmt: skip
    text = qt.goal_text(enc)
    assert "cosine mean 0.995 met" in text
    assert (
        "90% against the best peer's 95% (onnxruntime `quantize_dynamic` QInt8, per channel): missed"
        in text
    )
    assert (
        "against the best peer's 0.420 (onnxruntime `quantize_dynamic` QInt8, per tensor): missed by 2.4%"
        in text
    )
    enc["latency"]["ratio"]["opfuse"] = 0.424  # within the noise of 0.42
    assert qt.goal_text(enc).endswith("per tensor): met.")
    assert qt.goal_text({"rows": {"opfuse": {"error": "x"}}}) == ""
