"""The model's kind, read from the graph and said once (issue 42, item 4), and a
decoder's logits judged by next-token agreement and the perplexity change, on the
decoders scripts/decoder_block.py builds (random weights, no downloads)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.quantization import model_kind as mk
from opfuse.quantization.accuracy import compare_outputs
from opfuse.quantization.conductor import quantize_file
from opfuse.quantization.gate import Gate
from opfuse.quantization.steps import decoder_signs

ROOT = Path(__file__).resolve().parents[2]
LAYERS, D, VOCAB = 2, 64, 300


def _block():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "decoder_block", ROOT / "scripts/decoder_block.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _decoder(past: bool) -> onnx.ModelProto:
    return _block().build(LAYERS, D, VOCAB, past=past)  # type: ignore[no-any-return]


def _samples(count: int, new: int, past: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` samples of ``new`` tokens each over ``past`` cached ones (0: no cache)."""
    feeds = _block().samples(LAYERS, D, VOCAB, past, count, new, cache=past > 0)
    rng = np.random.default_rng(seed)
    feeds["input_ids"] = rng.integers(0, VOCAB, feeds["input_ids"].shape).astype(np.int64)
    return [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(count)]


def _tiny(path: Path, nodes: list[onnx.NodeProto], inputs, outputs, inits) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = h.make_graph(nodes, "m", inputs, outputs, initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _vit_and_cnn() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A patch embedding (Conv 4x4 stride 4) then self-attention: a vision transformer;
    the same Conv with stride 1 and no attention: a CNN."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (8, 3, 4, 4)).astype(np.float32), "w")
    x = [h.make_tensor_value_info("pixel_values", T.FLOAT, [1, 3, 16, 16])]
    y = [h.make_tensor_value_info("y", T.FLOAT, None)]
    shape = numpy_helper.from_array(np.array([1, 8, 16], np.int64), "shape")
    vit = _tiny(Path(), [
        h.make_node("Conv", ["pixel_values", "w"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
        h.make_node("Reshape", ["p", "shape"], ["tokens"]),
        h.make_node("Transpose", ["tokens"], ["kt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["kt", "tokens"], ["y"]),
    ], x, y, [w, shape])  # fmt: skip
    cnn = _tiny(Path(), [
        h.make_node("Conv", ["pixel_values", "w"], ["y"], kernel_shape=[4, 4], strides=[1, 1]),
    ], x, y, [w])  # fmt: skip
    return vit, cnn


def test_the_kind_is_read_from_the_graph():
    """Each kind on a built model; a decoder without past is one only with its causal mask
    (without the Trilu the same graph is an encoder with an attention mask)."""
    past, plain = mk.model_kind(_decoder(True)), mk.model_kind(_decoder(False))
    assert past.kind == mk.DECODER_PAST and past.logits == ("logits",)
    assert "past_key_values.0.key" in past.signs and "present.0.key" in past.signs
    assert plain.kind == mk.DECODER and "Trilu" in plain.signs and plain.logits == ("logits",)
    # --recipe auto tries int4 on both kinds of decoder (recipes._Search.decoder)
    assert decoder_signs(_decoder(False)).startswith("a decoder without past: input_ids")
    no_causal = _decoder(False)
    trilu = next(n for n in no_causal.graph.node if n.op_type == "Trilu")
    trilu.op_type = "Identity"
    del trilu.input[1:]
    del trilu.attribute[:]
    assert mk.model_kind(no_causal).kind == mk.ENCODER
    assert decoder_signs(no_causal) == ""
    vit, cnn = _vit_and_cnn()
    assert mk.model_kind(vit).kind == mk.VIT
    assert mk.model_kind(cnn).kind == mk.CNN
    del vit.graph.node[0]  # attention without a patch embedding, no mask
    assert mk.model_kind(vit).kind == mk.OTHER


def test_a_causal_mask_constant_makes_a_decoder_without_past():
    """GPT-2's exported lower-triangular ``bias`` buffer is a causal mask; a full square
    (all ones) or an upper-triangular one is not."""
    model = _decoder(False)
    for values, causal in ((np.tril(np.ones((8, 8))), True), (np.ones((8, 8)), False),
                           (np.triu(np.ones((8, 8))), False)):  # fmt: skip
        m = onnx.ModelProto()
        m.CopyFrom(model)
        trilu = next(n for n in m.graph.node if n.op_type == "Trilu")
        trilu.op_type = "Identity"
        del trilu.input[1:]
        del trilu.attribute[:]
        m.graph.initializer.append(numpy_helper.from_array(values.astype(np.uint8), "bias"))
        assert (mk.model_kind(m).kind == mk.DECODER) == causal, values


def _nll(logits: np.ndarray, ids: np.ndarray, keep: np.ndarray) -> tuple[float, int]:
    """The summed NLL of ids[t + 1] under logits[t] where both positions are kept: a
    loop, apart from the code under test."""
    total, count = 0.0, 0
    for t in range(ids.shape[1] - 1):
        if keep[0, t] and keep[0, t + 1]:
            row = logits[0, t].astype(np.float64)
            total += math.log(np.exp(row - row.max()).sum()) + row.max() - row[ids[0, t + 1]]
            count += 1
    return total, count


def test_perplexity_and_next_token_agreement_on_given_logits():
    """The figures against a direct computation, padding left out; the gate's ``ppl=``
    ceiling is off by default and misses when the increase exceeds it."""
    rng = np.random.default_rng(3)
    ids = [rng.integers(0, 20, (1, 6)) for _ in range(3)]
    masks = [np.ones((1, 6), np.int64) for _ in range(3)]
    masks[1][0, 4:] = 0
    ref = [[rng.normal(0, 2, (1, 6, 20)).astype(np.float32)] for _ in range(3)]
    got = [[r[0] + rng.normal(0, 1.0, r[0].shape).astype(np.float32)] for r in ref]
    [o] = compare_outputs(["logits"], ref, got, {"logits"}, (), logits={"logits"},
                          token_ids=ids, masks=masks)  # fmt: skip
    sums = [_nll(r[0], i, m) for r, i, m in zip(ref, ids, masks, strict=True)]
    want = math.exp(sum(s for s, _ in sums) / sum(c for _, c in sums))
    assert o.perplexity_float == pytest.approx(want, rel=1e-9)
    sums = [_nll(g[0], i, m) for g, i, m in zip(got, ids, masks, strict=True)]
    assert o.perplexity == pytest.approx(math.exp(sum(s for s, _ in sums) / 13), rel=1e-9)
    assert o.tokens == 5 + 3 + 5  # padding after position 3 of the second sample
    top = [np.mean(r[0].argmax(-1) == g[0].argmax(-1)) for r, g in zip(ref, got, strict=True)]
    assert o.top1 == pytest.approx(np.mean(top)) and o.measure == "next_token"
    assert "next-token agreement" in o.line() and "perplexity" in o.line()
    change = o.perplexity_change
    assert change is not None and change > 0.01
    assert Gate.parse("top1=50%").misses([o]) == []  # perplexity reported, not checked
    assert Gate.parse(f"top1=50%,ppl={change * 100 + 1:.2f}%").misses([o]) == []
    [missed] = Gate.parse(f"top1=50%,ppl={change * 100 - 1:.2f}%").misses([o])
    assert missed.startswith("logits: perplexity +") and "float model's" in missed
    assert Gate.parse("ppl=5%").option() == "top1=99%,ppl=5%"
    plain = compare_outputs(["logits"], ref, got, {"logits"}, ())[0]  # not a decoder's
    assert plain.measure == "top1" and plain.perplexity is None


def _run(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The logits under onnxruntime with its optimizations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [s.run(["logits"], f)[0] for f in samples]


@pytest.mark.parametrize("recipe", ["int4", "dynamic"])
def test_quantize_says_the_kind_and_judges_a_decoder_by_its_next_tokens(tmp_path, recipe):
    """A decoder without past, 8 tokens a sample: the kind said once in the progress, in
    the summary and in the JSON; the logits judged by next-token agreement and by the
    perplexity under each model, as onnxruntime computes them."""
    path = tmp_path / "dec.onnx"
    onnx.save(_decoder(False), str(path))
    calib, held = _samples(8, 8, 0, seed=5), _samples(6, 8, 0, seed=6)
    said: list[str] = []
    result = quantize_file(path, None, calib, eval=held, recipe=recipe, benchmark=False,
                           max_drop="off", progress=said.append)  # fmt: skip
    assert sum("the model: decoder without past (input_ids, logits" in s for s in said) == 1
    assert result.summary().startswith("the model: decoder without past (")
    report = json.loads(json.dumps(result.to_json()))
    assert report["model_kind"]["kind"] == mk.DECODER
    [o] = result.accuracy
    assert o.measure == "next_token" and report["accuracy"][0]["measure"] == "next_token"
    assert result.model is not None
    ref, got = _run(onnx.load(str(path)), held), _run(result.model, held)
    keep = np.ones((1, 8), bool)
    want = [sum(_nll(x, f["input_ids"], keep)[0] for x, f in zip(run, held, strict=True))
            for run in (ref, got)]  # fmt: skip
    assert o.tokens == 6 * 7
    assert o.perplexity_float == pytest.approx(math.exp(want[0] / 42), rel=1e-4)
    assert o.perplexity == pytest.approx(math.exp(want[1] / 42), rel=1e-4)
    agree = np.mean([np.mean(r.argmax(-1) == g.argmax(-1)) for r, g in zip(ref, got, strict=True)])
    assert o.top1 == pytest.approx(agree)
    ppl = report["accuracy"][0]["perplexity"]
    assert ppl["float"] == o.perplexity_float and ppl["change"] == o.perplexity_change
    assert "gate" in report and "next-token" not in report["gate"]  # the gate is off


def test_a_decoders_cache_is_no_embedding_and_one_token_has_no_next(tmp_path):
    """With past key values and one new token a sample (a decoding step): the present
    outputs are judged by their SQNR, not as embeddings of a model with a mask (before:
    every rank-3 output was); the logits have no next token, said so; the default gate
    names next-token agreement."""
    path = tmp_path / "dec.onnx"
    onnx.save(_decoder(True), str(path))
    calib, held = _samples(8, 1, 6, seed=7), _samples(4, 1, 6, seed=8)
    result = quantize_file(path, None, calib, eval=held, recipe="dynamic", benchmark=False,
                           write_slower=True)  # fmt: skip
    kinds = {o.name: o.measure for o in result.accuracy}
    assert kinds["logits"] == "next_token"
    assert {kinds[f"present.{i}.{k}"] for i in range(LAYERS) for k in ("key", "value")} == {"sqnr"}
    [logits] = [o for o in result.accuracy if o.name == "logits"]
    assert logits.perplexity is None and "no next token" in logits.line()
    assert "next-token agreement >= 99% on a decoder's logits" in result.summary()


def test_a_decoders_figures_in_brief_say_next_token_agreement():
    from opfuse.quantization.accuracy import OutputAccuracy, brief

    logits = OutputAccuracy("logits", 30.0, 0.99, 0.1, top1=0.977, rows=512, next_token=True)
    label = OutputAccuracy("label", 40.0, 0.99, 0.1, top1=0.99, rows=10)
    assert brief([logits]) == "next-token agreement 97.7%, SQNR 30.0 dB"
    assert brief([logits, label]).startswith("next-token agreement 97.7%, top-1 99.0%")
