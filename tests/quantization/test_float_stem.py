"""The stem kept in float (quantization/float_stem.py, the ``float-stem`` step): the leading
layers up to 8% of the multiply-adds and the ops between them, found with the sample's
shapes (a symbolic height and width); nothing where the first layer alone is more than
that share; kept out of quantization, the stem's nodes run in float on onnxruntime and the
int8 model's SQNR rises where the stem's channels differ in range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as h
from recovery import ort_quantize, sqnr

from opfuse.quantization.float_stem import stem_nodes
from opfuse.quantization.steps import STEPS, parse_recipe
from opfuse.quantization.workspace import Workspace


def conv(name: str, x: str, out: str, cin: int, cout: int, k: int, inits: dict, **attrs):
    rng = np.random.default_rng(len(inits))
    inits[f"{name}_w"] = rng.standard_normal((cout, cin // attrs.get("group", 1), k, k)) * 0.3
    inits[f"{name}_b"] = rng.standard_normal(cout) * 0.1
    pads = [k // 2] * 4
    return h.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [out], name=name, pads=pads, **attrs)


def model_of(nodes: list, inits: dict, channels_out: int, dynamic: bool = True):
    hw: list[int | str] = ["h", "w"] if dynamic else [32, 32]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *hw])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def detector_like(dynamic: bool = True) -> onnx.ModelProto:
    """A stem at full resolution (3 -> 4 -> 4 channels, 1.3% of the multiply-adds), a
    stride-2 layer (2.3%), then the body (96%): HardSigmoid-gated activations between."""
    inits: dict = {}
    nodes = [
        conv("stem0", "x", "s0", 3, 4, 3, inits),
        h.make_node("HardSigmoid", ["s0"], ["g0"], name="stem0_gate"),
        h.make_node("Mul", ["s0", "g0"], ["a0"], name="stem0_act"),
        conv("stem1", "a0", "s1", 4, 4, 1, inits),
        h.make_node("Relu", ["s1"], ["a1"], name="stem1_relu"),
        conv("down", "a1", "d", 4, 64, 3, inits, strides=[2, 2]),
        h.make_node("Relu", ["d"], ["a2"], name="down_relu"),
        conv("body", "a2", "b", 64, 128, 3, inits),
        h.make_node("Relu", ["b"], ["a3"], name="body_relu"),
        conv("head", "a3", "y", 128, 1, 1, inits),
    ]
    return model_of(nodes, inits, 1, dynamic)


def feed(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def test_the_leading_layers_and_the_ops_between_them():
    names = stem_nodes(detector_like(), feed())
    assert names == [
        "stem0",
        "stem0_gate",
        "stem0_act",
        "stem1",
        "stem1_relu",
        "down",
        "down_relu",
    ]
    # the sample's shapes decide (a symbolic height and width would count as 1 pixel)
    assert stem_nodes(detector_like(dynamic=False)) == names
    # a smaller share: only the full-resolution layers
    assert stem_nodes(detector_like(), feed(), share=0.02) == [
        "stem0",
        "stem0_gate",
        "stem0_act",
        "stem1",
        "stem1_relu",
    ]


def test_must_not_fire_where_the_first_layer_is_most_of_the_model_or_all_fits():
    inits: dict = {}
    nodes = [
        conv("big", "x", "b", 3, 64, 3, inits),
        h.make_node("Relu", ["b"], ["a"], name="relu"),
        conv("small", "a", "y", 64, 1, 1, inits),
    ]
    assert stem_nodes(model_of(nodes, inits, 1), feed()) == []  # "big" alone is 96%
    inits = {}
    one = [conv("only", "x", "y", 3, 4, 3, inits)]
    assert stem_nodes(model_of(one, inits, 4), feed()) == []  # one layer: no stem
    assert stem_nodes(detector_like(), feed(), share=1.0) == []  # every layer fits


def test_the_step_applies_and_keeps_its_nodes_out_of_quantization():
    assert parse_recipe("float-stem") == ("float-stem", "minmax")
    step = STEPS["float-stem"]
    model = detector_like()
    ws = Workspace(name="m", fused_model=model, float_model=model, calib=[feed(1)], valid=[feed(2)])
    assert step.applies(ws)
    report = step.run(ws)
    assert ws.exclude[:2] == ["stem0", "stem0_gate"] and "body" not in ws.exclude
    assert report.changed == 7 and "(3 layers)" in report.detail


def outlier_stem() -> onnx.ModelProto:
    """A stem whose channels differ 1000x in range (the second layer scales them back):
    one uint8 scale per tensor leaves the small channels a few steps."""
    inits: dict = {}
    nodes = [
        conv("stem0", "x", "s0", 3, 8, 3, inits),
        conv("stem1", "s0", "s1", 8, 8, 1, inits),
        h.make_node("Relu", ["s1"], ["a1"], name="stem1_relu"),
        conv("body", "a1", "b", 8, 32, 3, inits),
        h.make_node("Relu", ["b"], ["a2"], name="body_relu"),
        conv("head", "a2", "y", 32, 96, 3, inits),
    ]
    spread = np.logspace(0, 3, 8)
    inits["stem0_w"] = inits["stem0_w"] * spread[:, None, None, None]
    inits["stem0_b"] = inits["stem0_b"] * spread
    inits["stem1_w"] = inits["stem1_w"] / spread[None, :, None, None]
    return model_of(nodes, inits, 96)


def test_kept_in_float_on_onnxruntime_it_raises_the_int8_sqnr(tmp_path: Path):
    model = outlier_stem()
    calib, held = [feed(s) for s in range(8)], [feed(s) for s in range(10, 14)]
    names = stem_nodes(model, calib[0])
    assert names == ["stem0", "stem1", "stem1_relu"]
    plain = ort_quantize(model, calib, tmp_path)
    kept = ort_quantize(model, calib, tmp_path, exclude=names)
    producer = {o: n for n in kept.graph.node for o in n.output}
    by_name = {n.name: n for n in kept.graph.node}
    # the stem's Convs read their float weights and no quantized tensor; the body's do not
    for name in ("stem0", "stem1"):
        node = by_name[name]
        assert all(
            producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in node.input
        )
    assert producer[by_name["body"].input[1]].op_type == "DequantizeLinear"
    assert sqnr(model, kept, held) > sqnr(model, plain, held) + 10.0


def test_multiply_adds_of_a_conv_transpose_and_with_the_sample_shapes():
    """A ConvTranspose's multiply-adds are its input pixels x its weight (not its output
    pixels: 4x too many at stride 2); a symbolic height and width count once the sample's
    shapes are given."""
    from opfuse.quantization.kernels import compute_macs, with_input_shapes

    rng = np.random.default_rng(0)
    graph = h.make_graph(
        [h.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2])],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "h", "w"])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((4, 2, 2, 2)).astype(np.float32), "w")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    sample = {"x": np.zeros((1, 4, 8, 8), np.float32)}
    assert compute_macs(with_input_shapes(model, sample)) == {"up": 64 * 4 * 2 * 2 * 2}
    assert compute_macs(model) == {"up": 4 * 2 * 2 * 2}  # h, w unknown: 1 pixel
