"""The requantizations onnxruntime's QDQ fusion does not need, dropped (quantization/
requant.py, the ``float-requant`` step): the pair of a tensor an element-wise op makes and
no compute op reads goes; the pair in front of a MatMul, of a Relu folded into the
QuantizeLinear's saturation stays; only pairs go (the model without
any Q/DQ is the same graph); and where the requantization rounds a tensor far off zero
(uint8's range always holds 0), dropping it raises the SQNR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as h
from recovery import build_rows as build
from recovery import ort_quantize, run, sqnr

from opfuse.errors import OpfuseError
from opfuse.quantization.float_requant import drop_requant, requantized_passthroughs
from opfuse.quantization.steps import parse_recipe

C = 16


def offset_model(relu: bool = False):
    """x -> MatMul -> m (about +-1); r = m + 100; s = r - 100 (-> Relu); MatMul -> y. The
    uint8 range of r holds 0, so its step is about 0.4 for values within +-1 of 100."""
    rng = np.random.default_rng(0)
    inits = {
        "w0": rng.standard_normal((C, C)) * 0.25,
        "w1": rng.standard_normal((C, C)) * 0.25,
        "hundred": np.full(C, 100.0),
        "minus_hundred": np.full(C, -100.0),
    }
    nodes = [
        h.make_node("MatMul", ["x", "w0"], ["m"], name="mm0"),
        h.make_node("Add", ["m", "hundred"], ["r"], name="shift"),
        h.make_node("Add", ["r", "minus_hundred"], ["s"], name="unshift"),
    ]
    if relu:
        nodes.append(h.make_node("Relu", ["s"], ["s_relu"], name="relu"))
    nodes.append(h.make_node("MatMul", ["s_relu" if relu else "s", "w1"], ["y"], name="mm1"))
    return build(nodes, inits)


def feeds(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, C)).astype(np.float32)} for _ in range(n)]


def without_activation_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every QuantizeLinear -> DequantizeLinear pair of an activation
    removed (the readers take the float tensor): its float graph."""
    made = onnx.ModelProto()
    made.CopyFrom(model)
    graph = made.graph
    consts = {t.name for t in graph.initializer}
    quant = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    quant = {k: v for k, v in quant.items() if v not in consts}
    rename = {
        n.output[0]: quant[n.input[0]]
        for n in graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in quant
    }
    kept = [n for n in graph.node if n.output[0] not in quant and n.output[0] not in rename]
    for n in kept:
        for k, name in enumerate(n.input):
            n.input[k] = rename.get(name, name)
    for out in graph.output:  # an output a DequantizeLinear made: its float tensor
        if out.name in rename:
            kept.append(h.make_node("Identity", [rename[out.name]], [out.name]))
    del graph.node[:]
    graph.node.extend(kept)
    return made


def quantized(model: onnx.ModelProto) -> set[str]:
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}


def test_drops_the_requantization_no_compute_op_needs_and_raises_the_sqnr(tmp_path: Path):
    model = offset_model()
    calib, held = feeds(16, 1), feeds(8, 2)
    qdq = ort_quantize(model, calib, tmp_path)
    assert {"r", "s"} <= quantized(qdq)  # onnxruntime requantizes both
    assert set(requantized_passthroughs(qdq, model)) == {"r"}
    dropped, count = drop_requant(qdq, model)
    assert count == 1
    # r's pair went; s (read by the MatMul: its QLinearMatMul needs it) keeps its pair
    assert "r" not in quantized(dropped) and "s" in quantized(dropped)
    assert len(dropped.graph.node) == len(qdq.graph.node) - 2
    inits = {t.name for t in dropped.graph.initializer}
    assert "r_scale" in {t.name for t in qdq.graph.initializer} and "r_scale" not in inits
    assert "s_scale" in inits  # the kept pair's
    # only a pair went: the float graphs are the same, output for output
    for a, b in zip(
        run(without_activation_qdq(qdq), held),
        run(without_activation_qdq(dropped), held),
        strict=True,
    ):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    # r = m + 100 rounded at a step of about 0.4, then 100 taken off: most of s's error
    assert sqnr(model, dropped, held) > sqnr(model, qdq, held) + 10.0
    again, more = drop_requant(dropped, model)  # idempotent
    assert more == 0 and len(again.graph.node) == len(dropped.graph.node)


def test_must_not_fire_in_front_of_a_compute_op_or_on_a_folded_relu(tmp_path: Path):
    calib = feeds(16, 1)
    # the Relu after the Sub: onnxruntime's quantizer folds it into the Sub's
    # QuantizeLinear (its saturation at 0 is the Relu): that pair is the activation
    model = offset_model(relu=True)
    qdq = ort_quantize(model, calib, tmp_path)
    assert "relu" not in {n.name for n in qdq.graph.node}  # folded: the case under test
    found = requantized_passthroughs(qdq, model)
    assert "s_relu" not in found and "s" not in found
    assert set(found) == {"r"}
    # an element-wise op read only by a MatMul
    rng = np.random.default_rng(3)
    inits = {"w0": rng.standard_normal((C, C)), "w1": rng.standard_normal((C, C))}
    nodes = [
        h.make_node("MatMul", ["x", "w0"], ["m"], name="mm0"),
        h.make_node("Mul", ["m", "m"], ["sq"], name="square"),
        h.make_node("MatMul", ["sq", "w1"], ["z"], name="mm1"),
        h.make_node("Add", ["z", "m"], ["y"], name="residual"),  # the output
    ]
    plain = build(nodes, inits)
    qdq = ort_quantize(plain, calib, tmp_path)
    assert "sq" in quantized(qdq)
    dropped, count = drop_requant(qdq, plain)
    assert count == 0
    assert [n.name for n in dropped.graph.node] == [n.name for n in qdq.graph.node]


def test_the_step_runs_before_a_bias_correction_and_one_bias_correction_only():
    assert parse_recipe("bias-correction,float-requant") == (
        "minmax",
        "float-requant",
        "bias-correction",
    )
    assert parse_recipe("float-decomposed,float-requant,mse") == (
        "float-decomposed",
        "mse",
        "float-requant",
    )
    with pytest.raises(OpfuseError, match="not both"):
        parse_recipe("bias-correction,bias-correction-full,float-requant")


def test_quantize_with_the_step_forced(tmp_path: Path):
    """``--recipe float-requant`` through the conductor: the step runs after the
    quantization and is reported; the model written keeps no pair it would drop."""
    from opfuse.quantization.conductor import quantize_file

    path = tmp_path / "offset.onnx"
    onnx.save(offset_model(), str(path))
    np.savez(tmp_path / "c.npz", x=np.stack([f["x"] for f in feeds(24, 1)]))
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off",
                           recipe="float-requant")  # fmt: skip
    assert result.recipe == "minmax,float-requant"
    kept = [r for r in result.recipes if r["kept"]]
    steps = [s["step"] for s in kept[0]["steps"]]  # type: ignore[index,union-attr]
    assert steps == ["minmax", "float-requant"]
    assert not requantized_passthroughs(result.model, without_activation_qdq(result.model))
