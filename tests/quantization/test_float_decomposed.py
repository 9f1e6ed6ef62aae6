"""Written-out GELUs and LayerNorm statistics kept in float (quantization/activations.py,
the ``float-decomposed`` step): found where tf2onnx writes them (tanh-form GELU, a LayerNorm
with E[x^2] - E[x]^2 and 1/sqrt), not where a Tanh or Sqrt is something else; keeping them
out of quantization changes no float op and raises the int8 model's SQNR where the
requantized chain is what fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper as h
from onnx import numpy_helper
from recovery import build_rows as build
from recovery import ort_quantize, sqnr

from opfuse.quantization.activations import (
    decomposed_activations,
    float_decomposed,
    normalization_statistics,
)

C = 16


def gelu_nodes(x: str, out: str, p: str) -> list:
    """x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x * x * x))), as tf2onnx writes it."""
    return [
        h.make_node("Mul", ["c044", x], [f"{p}m0"], name=f"{p}Mul"),
        h.make_node("Mul", [x, f"{p}m0"], [f"{p}m1"], name=f"{p}Mul_1"),
        h.make_node("Mul", [x, f"{p}m1"], [f"{p}m2"], name=f"{p}Mul_2"),
        h.make_node("Add", [x, f"{p}m2"], [f"{p}a0"], name=f"{p}AddV2"),
        h.make_node("Mul", ["c079", f"{p}a0"], [f"{p}m3"], name=f"{p}Mul_3"),
        h.make_node("Tanh", [f"{p}m3"], [f"{p}t"], name=f"{p}Tanh"),
        h.make_node("Add", ["one", f"{p}t"], [f"{p}a1"], name=f"{p}AddV2_1"),
        h.make_node("Mul", ["half", f"{p}a1"], [f"{p}m4"], name=f"{p}Mul_4"),
        h.make_node("Mul", [x, f"{p}m4"], [out], name=f"{p}Mul_5"),
    ]


GELU_CONSTS = {"c044": 0.044715, "c079": np.sqrt(2 / np.pi), "one": 1.0, "half": 0.5}


def dense(name: str, x: str, out: str, inits: dict, seed: int) -> list:
    rng = np.random.default_rng(seed)
    inits[f"{name}_w"] = rng.standard_normal((C, C)) * 0.6
    inits[f"{name}_b"] = rng.standard_normal(C) * 0.1
    return [
        h.make_node("MatMul", [x, f"{name}_w"], [f"{name}_mm"], name=f"{name}_matmul"),
        h.make_node("Add", [f"{name}_mm", f"{name}_b"], [out], name=f"{name}_bias"),
    ]


def gelu_model(features: bool = False):
    """x -> Dense -> GELU written out -> Dense -> y; ``features``: y = |Dense| (an output
    that scores no classes: judged by its SQNR)."""
    inits = dict(GELU_CONSTS)
    nodes = [
        *dense("d0", "x", "h0", inits, 1),
        *gelu_nodes("h0", "g0", "act/"),
        *dense("d1", "g0", "d1_out" if features else "y", inits, 2),
    ]
    if features:
        nodes.append(h.make_node("Abs", ["d1_out"], ["y"], name="features"))
    return build(nodes, inits)


def layer_norm_model():
    """x -> Dense -> LayerNorm written out (variance as E[x^2] - E[x]^2) -> Dense."""
    inits = {"axes": np.array([1], np.int64), "inv_n": 1.0 / C, "eps": 1e-6, "zero": 0.0}
    inits["gamma"] = np.linspace(0.5, 1.5, C)
    inits["beta"] = np.linspace(-0.1, 0.1, C)
    inits["axes"] = np.array([1])
    nodes = [
        *dense("d0", "x", "h", inits, 3),
        h.make_node("ReduceSum", ["h", "axes64"], ["s"], name="ln/Sum", keepdims=1),
        h.make_node("Mul", ["h", "h"], ["sq"], name="ln/Square"),
        h.make_node("ReduceSum", ["sq", "axes64"], ["s2"], name="ln/Sum_1", keepdims=1),
        h.make_node("Mul", ["s2", "inv_n"], ["ex2"], name="ln/truediv_1"),
        h.make_node("Mul", ["s", "inv_n"], ["mean"], name="ln/truediv"),
        h.make_node("Mul", ["mean", "mean"], ["mean2"], name="ln/Square_1"),
        h.make_node("Sub", ["ex2", "mean2"], ["var"], name="ln/Sub"),
        h.make_node("Max", ["zero", "var"], ["varp"], name="ln/Maximum"),
        h.make_node("Add", ["varp", "eps"], ["vare"], name="ln/AddV2"),
        h.make_node("Sqrt", ["vare"], ["std"], name="ln/Rsqrt"),
        h.make_node("Reciprocal", ["std"], ["rstd"], name="ln/Rsqrt_r"),
        h.make_node("Mul", ["rstd", "gamma"], ["scale"], name="ln/Mul"),
        h.make_node("Sub", ["h", "mean"], ["centered"], name="ln/Sub_1"),
        h.make_node("Mul", ["centered", "scale"], ["normed"], name="ln/Mul_1"),
        h.make_node("Add", ["normed", "beta"], ["ln_out"], name="ln/AddV2_1"),
        *dense("d1", "ln_out", "y", inits, 4),
    ]
    model = build(nodes, {k: v for k, v in inits.items() if k != "axes"})
    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "axes64"))
    return model


def feeds(n, seed, offset=0.0, scale=1.0):
    """``offset``: rows with a large common offset (the variance is a small difference of
    two large means); ``scale``: a wide input (the cube spans +-scale^3)."""
    rng = np.random.default_rng(seed)
    return [
        {
            "x": (
                scale * rng.standard_normal((4, C)) + offset * rng.standard_normal((4, 1))
            ).astype(np.float32)
        }
        for _ in range(n)
    ]


def test_finds_the_tanh_gelu_as_tf2onnx_writes_it():
    found = decomposed_activations(gelu_model())
    assert found == [
        [
            f"act/{n}"
            for n in (
                "Mul",
                "Mul_1",
                "Mul_2",
                "AddV2",
                "Mul_3",
                "Tanh",
                "AddV2_1",
                "Mul_4",
                "Mul_5",
            )
        ]
    ]
    assert normalization_statistics(gelu_model()) == []


def test_finds_the_layer_norm_statistics_not_the_normalized_tensor():
    found = normalization_statistics(layer_norm_model())
    assert len(found) == 1
    names = set(found[0])
    assert {
        "ln/Sum",
        "ln/Square",
        "ln/Sum_1",
        "ln/Sub",
        "ln/Rsqrt",
        "ln/Rsqrt_r",
        "ln/Mul",
    } <= names
    assert {"ln/Mul_1"} <= names  # (x - mean) * scale: applies the statistics
    assert not names & {"ln/Sub_1", "ln/AddV2_1", "d0_matmul", "d0_bias", "d1_matmul"}
    assert decomposed_activations(layer_norm_model()) == []


def test_must_not_fire_on_a_plain_tanh_or_a_sqrt_of_data():
    inits = {"k": 2.0, "w": np.eye(C)}
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        h.make_node("Tanh", ["m"], ["t"], name="tanh"),  # no chain from m before it
        h.make_node("Mul", ["t", "k"], ["u"], name="scale"),  # by a constant only
        h.make_node("Abs", ["u"], ["a"], name="abs"),
        h.make_node("Sqrt", ["a"], ["y"], name="sqrt"),  # of data, not of a reduction
    ]
    model = build(nodes, inits)
    assert decomposed_activations(model) == []
    assert normalization_statistics(model) == []
    assert float_decomposed(model) == []
    # a Tanh whose chain reads a second tensor is not an activation of one x
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        h.make_node("MatMul", ["x", "w"], ["m2"], name="mm2"),
        h.make_node("Mul", ["m", "m2"], ["p"], name="prod"),
        h.make_node("Tanh", ["p"], ["t"], name="tanh"),
        h.make_node("Mul", ["t", "m"], ["y"], name="gate"),
    ]
    assert decomposed_activations(build(nodes, inits)) == []


def test_keeping_them_in_float_raises_the_int8_sqnr(tmp_path: Path):
    for model, offset, scale in ((layer_norm_model(), 30.0, 1.0), (gelu_model(), 0.0, 12.0)):
        calib, held = feeds(16, 1, offset, scale), feeds(8, 2, offset, scale)
        plain = ort_quantize(model, calib, tmp_path)
        kept = ort_quantize(model, calib, tmp_path, exclude=float_decomposed(model))
        # nothing of the float graph changes: the chain's nodes are there, unquantized
        assert {n.name for n in model.graph.node} <= {n.name for n in kept.graph.node}
        assert sqnr(model, kept, held) > sqnr(model, plain, held) + 3.0


def test_the_recipe_search_keeps_it_where_it_helps_and_tries_nothing_where_absent(tmp_path: Path):
    """--recipe auto tries float-decomposed first: on a written-out GELU with a wide input it
    is kept (measured on the validation part: the features' SQNR); on a model without one
    it is skipped, said."""
    from opfuse.quantization.conductor import quantize_file

    path = tmp_path / "gelu.onnx"
    onnx.save(gelu_model(features=True), str(path))
    np.savez(tmp_path / "c.npz", x=np.stack([f["x"] for f in feeds(24, 1, scale=12.0)]))
    result = quantize_file(path, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    names = [r["recipe"] for r in result.recipes]
    assert names[:2] == ["minmax", "float-decomposed,minmax"]
    assert result.recipe.startswith("float-decomposed")
    producers = {n.name: n for n in result.model.graph.node}
    assert {"act/Mul_2", "act/Tanh", "act/Mul_5"} <= set(producers)  # in the int8 model
    quantized = {n.input[0] for n in result.model.graph.node if n.op_type == "QuantizeLinear"}
    # the cube and the Tanh's output stay float (the chain's output is quantized for the
    # Dense that reads it, as any MatMul input)
    assert not any(o in quantized for n in ("act/Mul_2", "act/Tanh") for o in producers[n].output)
    plain = tmp_path / "plain.onnx"
    inits: dict = {}
    onnx.save(build(dense("d0", "x", "y", inits, 5), inits), str(plain))
    result = quantize_file(plain, None, tmp_path / "c.npz", benchmark=False, max_drop="off")
    assert "float-decomposed" not in " ".join(r["recipe"] for r in result.recipes)
    assert any(s.startswith("float-decomposed (nothing to change") for s in result.skipped)
