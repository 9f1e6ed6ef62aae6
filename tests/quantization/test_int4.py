"""The weight-only int4 recipe (issue 42, item 3): onnxruntime's MatMulNBits for the
MatMuls with constant 2-D weights, everything else float; tried by ``--recipe auto`` only
on a decoder (input_ids and a key/value cache)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.errors import OpfuseError
from opfuse.quantization.conductor import quantize_file

D = 256  # weights of 256x256: their int4 bytes dwarf the scales and the graph


def _attention_block(path, d: int = D):  # type: ignore[no-untyped-def]
    """x [N, T, d] -> single-head attention (q, k, v, output projections; Q.K^T and P.V
    MatMuls of two activations) -> residual -> MLP (MatMul, Relu, MatMul) -> y: six
    MatMuls with constant d x d weights, two without."""
    rng = np.random.default_rng(42)
    names = ["wq", "wk", "wv", "wo", "w1", "w2"]
    weights = [
        numpy_helper.from_array(rng.normal(0, d**-0.5, (d, d)).astype(np.float32), n) for n in names
    ]
    scale = numpy_helper.from_array(np.array(d**-0.5, np.float32), "scale")
    nodes = [
        h.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        h.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        h.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        h.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "kt"], ["s0"], name="qk"),
        h.make_node("Mul", ["s0", "scale"], ["s"], name="scaled"),
        h.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        h.make_node("MatMul", ["p", "v"], ["a"], name="pv"),
        h.make_node("MatMul", ["a", "wo"], ["o"], name="o_proj"),
        h.make_node("Add", ["x", "o"], ["r"], name="residual"),
        h.make_node("MatMul", ["r", "w1"], ["m1"], name="fc1"),
        h.make_node("Relu", ["m1"], ["m2"], name="relu"),
        h.make_node("MatMul", ["m2", "w2"], ["m3"], name="fc2"),
        h.make_node("Add", ["r", "m3"], ["y"], name="residual2"),
    ]
    graph = h.make_graph(
        nodes,
        "block",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 8, d])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 8, d])],
        initializer=[*weights, scale],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def _block_data(tmp_path):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(43)
    x = rng.normal(0, 1, (24, 8, D)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x[:16])
    np.savez(tmp_path / "e.npz", x=x[16:])
    return tmp_path / "c.npz", tmp_path / "e.npz", x[16:]


OPTIONS = {"benchmark": False, "max_drop": "off"}
SAID = "a decoder with past key values: input_ids"  # decoder_signs


def test_int4_makes_matmulnbits_that_run_close_to_float_in_a_sixth_of_the_bytes(tmp_path):
    """``--recipe int4``: the six MatMuls with constant weights become MatMulNBits (4-bit,
    block 32, symmetric: no zero points), the attention's Q.K^T and P.V stay MatMuls, no
    Q/DQ anywhere; onnxruntime runs it, its output within a few percent of float's, and
    the file about a sixth of the float one's."""
    from opfuse.model.sessions import open_session
    from opfuse.quantization.ort_backend import INT4_BLOCK
    from opfuse.quantization.steps import int4_accuracy_level

    model = _attention_block(tmp_path / "block.onnx")
    calib, evaluation, x = _block_data(tmp_path)
    out = tmp_path / "int4.onnx"
    made = quantize_file(model, out, calib, eval=evaluation, recipe="int4", **OPTIONS)
    assert made.recipe == "int4"
    nodes = onnx.load(str(out)).graph.node
    ops = [n.op_type for n in nodes]
    assert ops.count("MatMulNBits") == 6 and ops.count("MatMul") == 2
    assert not {"QuantizeLinear", "DequantizeLinear", "MatMulInteger"} & set(ops)
    for node in (n for n in nodes if n.op_type == "MatMulNBits"):
        attrs = {a.name: a.i for a in node.attribute}
        assert attrs["bits"] == 4 and attrs["block_size"] == INT4_BLOCK == 32
        assert attrs.get("accuracy_level", 0) == int4_accuracy_level()
        assert len(node.input) == 3  # symmetric: x, the packed weight, the scales
    ref = open_session(model).run(None, {"x": x})[0]
    got = open_session(out).run(None, {"x": x})[0]
    error = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert error < 0.15, error  # 4-bit weights of a Gaussian: about 9% a layer (rounding)
    ratio = out.stat().st_size / model.stat().st_size
    assert 0.14 < ratio < 0.2, ratio  # 4 bits + a float scale per 32 weights: ~1/6.4
    [figures] = made.accuracy
    assert figures.sqnr_db > 17, figures.sqnr_db
    assert not any("nothing was quantized" in w for w in made.warnings)


def test_the_users_exclude_keeps_a_matmul_float_in_int4(tmp_path):
    model = _attention_block(tmp_path / "block.onnx")
    calib, evaluation, _ = _block_data(tmp_path)
    made = quantize_file(
        model, None, calib, eval=evaluation, recipe="int4", exclude=["fc2"], **OPTIONS
    )
    assert made.model is not None
    kinds = {n.name: n.op_type for n in made.model.graph.node}
    assert kinds["fc2"] == "MatMul"
    assert list(kinds.values()).count("MatMulNBits") == 5


def test_int4_is_weight_only_and_stands_apart_from_activation_steps():
    from opfuse.quantization.recipes import with_step
    from opfuse.quantization.steps import parse_recipe

    assert parse_recipe("int4") == ("int4",)  # nothing calibrated: no minmax
    assert parse_recipe("float-stem,int4") == ("float-stem", "int4")
    for other in ("mse", "dynamic", "bias-correction", "float-requant"):
        with pytest.raises(OpfuseError, match="weight-only"):
            parse_recipe(f"int4,{other}")
    assert with_step(("minmax", "dynamic"), "int4") == ("int4",)
    assert with_step(("int4",), "dynamic") == ("minmax", "dynamic")


def _decoder(path, d: int = 64, vocab: int = 100):  # type: ignore[no-untyped-def]
    """A one-layer single-head decoder with a key/value cache, as exporters name it:
    input_ids [1, T], attention_mask [1, P + T], past_key_values.0.key/value [1, P, d]
    -> logits [1, T, vocab], present.0.key/value [1, P + T, d] (the past concatenated
    with the new keys and values)."""
    rng = np.random.default_rng(44)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            rng.normal(0, shape[0] ** -0.5, shape).astype(np.float32), name
        )

    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (vocab, d)).astype(np.float32), "embed"),
        w("wq", d, d), w("wk", d, d), w("wv", d, d), w("wo", d, d), w("lm_head", d, vocab),
        numpy_helper.from_array(np.array(d**-0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "big"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]  # fmt: skip
    nodes = [
        h.make_node("Gather", ["embed", "input_ids"], ["e"], name="embed_tokens"),
        h.make_node("MatMul", ["e", "wq"], ["q"], name="q_proj"),
        h.make_node("MatMul", ["e", "wk"], ["k"], name="k_proj"),
        h.make_node("MatMul", ["e", "wv"], ["v"], name="v_proj"),
        h.make_node("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], axis=1),
        h.make_node("Concat", ["past_key_values.0.value", "v"], ["present.0.value"], axis=1),
        h.make_node("Transpose", ["present.0.key"], ["kt"], name="kt", perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "kt"], ["s0"], name="qk"),
        h.make_node("Mul", ["s0", "scale"], ["s1"], name="scaled"),
        h.make_node("Cast", ["attention_mask"], ["mf"], name="mask_f", to=T.FLOAT),
        h.make_node("Sub", ["one", "mf"], ["inv"], name="mask_inv"),
        h.make_node("Mul", ["inv", "big"], ["bias0"], name="mask_bias"),
        h.make_node("Unsqueeze", ["bias0", "axis1"], ["bias"], name="mask_unsq"),
        h.make_node("Add", ["s1", "bias"], ["s"], name="masked"),
        h.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        h.make_node("MatMul", ["p", "present.0.value"], ["a"], name="pv"),
        h.make_node("MatMul", ["a", "wo"], ["o"], name="o_proj"),
        h.make_node("Add", ["e", "o"], ["r"], name="residual"),
        h.make_node("MatMul", ["r", "lm_head"], ["logits"], name="lm_head_mm"),
    ]
    graph = h.make_graph(
        nodes,
        "decoder",
        [
            h.make_tensor_value_info("input_ids", T.INT64, [1, "T"]),
            h.make_tensor_value_info("attention_mask", T.INT64, [1, "S"]),
            h.make_tensor_value_info("past_key_values.0.key", T.FLOAT, [1, "P", d]),
            h.make_tensor_value_info("past_key_values.0.value", T.FLOAT, [1, "P", d]),
        ],
        [
            h.make_tensor_value_info("logits", T.FLOAT, [1, "T", vocab]),
            h.make_tensor_value_info("present.0.key", T.FLOAT, [1, "S", d]),
            h.make_tensor_value_info("present.0.value", T.FLOAT, [1, "S", d]),
        ],
        initializer=inits,
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def _decoder_samples(rng, count: int, d: int = 64) -> list[dict[str, np.ndarray]]:  # type: ignore[no-untyped-def]
    past, new = 6, 4
    return [
        {
            "input_ids": rng.integers(0, 100, (1, new)).astype(np.int64),
            "attention_mask": np.ones((1, past + new), np.int64),
            "past_key_values.0.key": rng.normal(0, 1, (1, past, d)).astype(np.float32),
            "past_key_values.0.value": rng.normal(0, 1, (1, past, d)).astype(np.float32),
        }
        for _ in range(count)
    ]


def test_a_decoder_is_detected_and_auto_tries_int4_there_only(tmp_path):
    """A decoder (input_ids, past key/value inputs, present outputs): ``--recipe auto``
    tries int4 and its step says why; the attention block (no input_ids) has it in
    what was not tried, with the reason."""
    from opfuse.quantization.steps import decoder_signs

    model = _decoder(tmp_path / "dec.onnx")
    signs = decoder_signs(onnx.load(str(model)))
    assert signs.startswith(SAID) and "past_key_values.0.key" in signs
    assert "present.0.key" in signs
    rng = np.random.default_rng(45)
    calib, evaluation = _decoder_samples(rng, 12), _decoder_samples(rng, 6)
    said: list[str] = []
    auto = quantize_file(model, None, calib, eval=evaluation, progress=said.append, **OPTIONS)
    tried = {str(r["recipe"]): r for r in auto.recipes}
    assert "int4" in tried, list(tried)
    steps = tried["int4"]["steps"]
    assert isinstance(steps, list)
    [detail] = [s["detail"] for s in steps if s["step"] == "int4"]
    assert detail.startswith("5 MatMuls weight-only int4") and SAID in detail
    assert any(SAID in line and "int4 tried" in line for line in said)
    assert not any(s.startswith("int4 ") for s in auto.skipped)

    block = _attention_block(tmp_path / "block.onnx", d=32)
    x = np.random.default_rng(46).normal(0, 1, (12, 8, 32)).astype(np.float32)
    plain = quantize_file(block, None, {"x": x}, **OPTIONS)
    assert "int4" not in {r["recipe"] for r in plain.recipes}
    [why] = [s for s in plain.skipped if s.startswith("int4 ")]
    assert "not a decoder" in why and "--recipe int4" in why


def test_int4_does_not_apply_to_a_cnn_and_says_why(tmp_path):
    """No MatMul with a constant 2-D weight: int4 has nothing to quantize (forced: the
    step's reason); a decoder's int4 model given again has none left either."""
    from test_quantize import small_cnn

    from opfuse.quantization.steps import STEPS
    from opfuse.quantization.workspace import Workspace

    cnn = onnx.load(str(small_cnn(tmp_path / "cnn.onnx")))
    ws = Workspace("cnn", cnn, cnn, [], [])
    int4 = STEPS["int4"]
    assert not int4.applies(ws)
    assert "no MatMul with a constant 2-D weight" in int4.reason(ws)  # type: ignore[attr-defined]
    x = np.random.default_rng(48).uniform(0, 1, (8, 3, 8, 8)).astype(np.float32)
    with pytest.raises(OpfuseError, match="--recipe int4: nothing to change: no MatMul"):
        quantize_file(tmp_path / "cnn.onnx", None, {"x": x}, recipe="int4", **OPTIONS)
    model = _attention_block(tmp_path / "block.onnx", d=32)
    x = np.random.default_rng(47).normal(0, 1, (12, 8, 32)).astype(np.float32)
    once = quantize_file(model, None, {"x": x}, recipe="int4", **OPTIONS)
    assert once.model is not None
    again = Workspace("int4", once.model, once.model, [], [])
    assert not int4.applies(again)  # idempotent: its MatMulNBits are not MatMuls


def test_accuracy_level_follows_vnni_and_an_encoder_is_no_decoder(tmp_path, monkeypatch):
    """``accuracy_level`` 4 (int8 dot products) only where the CPU has VNNI, else 0 (left
    out of the node); input_ids without a key/value cache (an encoder) is no decoder."""
    from opfuse.quantization import steps
    from opfuse.runtime.cpu import CpuFeatures

    monkeypatch.setattr(steps, "cpu_features", lambda: CpuFeatures(frozenset({"avx512_vnni"})))
    assert steps.int4_accuracy_level() == 4
    monkeypatch.setattr(steps, "cpu_features", lambda: CpuFeatures(frozenset({"avx2"})))
    assert steps.int4_accuracy_level() == 0
    model = _attention_block(tmp_path / "block.onnx", d=32)
    x = np.random.default_rng(49).normal(0, 1, (12, 8, 32)).astype(np.float32)
    made = quantize_file(model, None, {"x": x}, recipe="int4", **OPTIONS)
    assert made.model is not None
    nbits = [n for n in made.model.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and not any(a.name == "accuracy_level" for n in nbits for a in n.attribute)
    decoder = onnx.load(str(_decoder(tmp_path / "dec.onnx")))
    assert steps.decoder_signs(decoder)
    del decoder.graph.input[2:]  # input_ids and attention_mask only
    del decoder.graph.output[1:]
    assert steps.decoder_signs(decoder) == ""


def test_int8_weights_is_matmulnbits_at_8_bits_and_auto_tries_it_on_a_decoder(tmp_path):
    """``--recipe int8-weights``: the same MatMulNBits at 8 bits (weight-only int8, the
    activations float), closer to float than int4, about a third of the float file;
    weight-only like int4 (not with activation steps); tried by auto on a decoder."""
    from opfuse.model.sessions import open_session
    from opfuse.quantization.recipes import with_step
    from opfuse.quantization.steps import parse_recipe

    model = _attention_block(tmp_path / "block.onnx")
    calib, evaluation, x = _block_data(tmp_path)
    out4, out8 = tmp_path / "int4.onnx", tmp_path / "int8w.onnx"
    quantize_file(model, out4, calib, eval=evaluation, recipe="int4", **OPTIONS)
    made = quantize_file(model, out8, calib, eval=evaluation, recipe="int8-weights", **OPTIONS)
    assert made.recipe == "int8-weights"
    nodes = [n for n in onnx.load(str(out8)).graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 6 and all({a.name: a.i for a in n.attribute}["bits"] == 8 for n in nodes)
    ref = open_session(model).run(None, {"x": x})[0]

    def error(path):  # type: ignore[no-untyped-def]
        got = open_session(path).run(None, {"x": x})[0]
        return np.linalg.norm(got - ref) / np.linalg.norm(ref)

    assert error(out8) < 0.02 and error(out8) < error(out4) / 4
    assert 0.25 < out8.stat().st_size / model.stat().st_size < 0.35  # 8 bits + scales
    assert parse_recipe("int8-weights") == ("int8-weights",)
    with pytest.raises(OpfuseError, match="int8-weights is weight-only"):
        parse_recipe("int8-weights,mse")
    assert with_step(("int4",), "int8-weights") == ("int8-weights",)
    assert with_step(("int8-weights",), "dynamic") == ("minmax", "dynamic")

    dec = _decoder(tmp_path / "dec.onnx")
    rng = np.random.default_rng(45)
    calib_d, evaluation_d = _decoder_samples(rng, 12), _decoder_samples(rng, 6)
    auto = quantize_file(dec, None, calib_d, eval=evaluation_d, **OPTIONS)
    assert "int8-weights" in {str(r["recipe"]) for r in auto.recipes}
