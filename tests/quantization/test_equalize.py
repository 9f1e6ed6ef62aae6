"""Cross-layer equalization (quantization/equalize.py): exact in float, a higher per-tensor
int8 SQNR where channel ranges are spread, and no change where it must not fire."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from recovery import deviations, int8_sqnr, run

from opfuse.quantization.equalize import equalizable_pairs, equalize

RNG = np.random.default_rng(0)


def build(nodes, inits, x_shape, y_shape=None, *, opset=17, extra_inputs=()):
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, x_shape), *extra_inputs],
        [h.make_tensor_value_info("y", T.FLOAT, y_shape)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def feeds(shape, n=8, seed=1, low=-1.0, high=1.0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(low, high, shape).astype(np.float32)} for _ in range(n)]


def spread(channels, ratio=100.0):
    """Per-channel factors from 1/sqrt(ratio) to sqrt(ratio), shuffled."""
    f = np.logspace(-0.5, 0.5, channels) ** np.log10(ratio)
    return RNG.permutation(f).astype(np.float32)


def conv_pair(act="Relu", act_inputs=(), act_attrs=None, ratio=100.0, pads2=0, cin=8, mid=16):
    """x[1,cin,10,10] -> Conv 3x3 "c1" (mid channels, ranges spread ``ratio``) -> act ->
    Conv k "c2" -> y. c2's inputs are spread the other way, so every channel matters as
    much to y (as in a trained network whose BatchNorm folding spread c1's channels)."""
    f = spread(mid, ratio)
    w1 = RNG.standard_normal((mid, cin, 3, 3)) * 0.3 * f[:, None, None, None]
    k = 1 + 2 * pads2
    w2 = RNG.standard_normal((cin, mid, k, k)) * 0.3 / f[None, :, None, None]
    inits = {"w1": w1, "b1": RNG.standard_normal(mid) * 0.2, "w2": w2, "b2": np.zeros(cin)}
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["t"], name="c1", pads=[1, 1, 1, 1])]
    if act:
        nodes.append(h.make_node(act, ["t", *act_inputs], ["a"], name="act", **(act_attrs or {})))
    nodes.append(
        h.make_node("Conv", ["a" if act else "t", "w2", "b2"], ["y"], name="c2", pads=[pads2] * 4)
    )
    return build(nodes, inits, [1, cin, 10, 10])


def depthwise_block(ratio=100.0):
    """MobileNet's block with Relu: 1x1 "expand" -> Relu -> 3x3 depthwise "dw" (pads 1,
    ranges spread ``ratio`` as BatchNorm folding leaves them) -> Relu -> 1x1 "project"."""
    c, e = 8, 32
    f = spread(e, ratio)
    inits = {
        "we": RNG.standard_normal((e, c, 1, 1)) * 0.4,
        "be": RNG.standard_normal(e) * 0.1,
        "wd": RNG.standard_normal((e, 1, 3, 3)) * 0.3 * f[:, None, None, None],
        "bd": RNG.standard_normal(e) * 0.1 * f,
        "wp": RNG.standard_normal((c, e, 1, 1)) * 0.3 / f[None, :, None, None],
        "bp": np.zeros(c),
    }
    nodes = [
        h.make_node("Conv", ["x", "we", "be"], ["e"], name="expand"),
        h.make_node("Relu", ["e"], ["er"], name="relu1"),
        h.make_node("Conv", ["er", "wd", "bd"], ["d"], name="dw", group=e, pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["d"], ["dr"], name="relu2"),
        h.make_node("Conv", ["dr", "wp", "bp"], ["y"], name="project"),
    ]
    return build(nodes, inits, [1, c, 12, 12])


def weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def unchanged(before, after):
    return before.SerializeToString() == after.SerializeToString()


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(
    "make",
    [
        lambda: conv_pair("Relu"),
        lambda: conv_pair(None),
        lambda: conv_pair("LeakyRelu", act_attrs={"alpha": 0.1}),
        lambda: conv_pair("PRelu", act_inputs=("slope",)),
        lambda: conv_pair("MaxPool", act_attrs={"kernel_shape": [2, 2]}),
        depthwise_block,
    ],
    ids=["relu", "none", "leakyrelu", "prelu", "maxpool", "depthwise"],
)
def test_equalized_model_gives_the_same_outputs(make):
    model = make()
    if any(n.op_type == "PRelu" for n in model.graph.node):
        slope = np.linspace(0.05, 0.5, 16).reshape(16, 1, 1).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(slope, "slope"))
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    data = feeds(x_shape)
    out, count = equalize(model)
    assert count >= 1
    assert [n.name for n in out.graph.node] == [n.name for n in model.graph.node]
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert deviations(model, out, feeds(x_shape, seed=7)) == []  # any input
    before, after = weights(model), weights(out)
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    # bias absorption is exact on the calibration samples (see the module)
    absorbed, again = equalize(model, data, absorb_bias=True)
    assert again == count and deviations(model, absorbed, data) == []


def test_depthwise_chain_ranges_are_equalized():
    model = depthwise_block()
    assert equalizable_pairs(model) == [("expand", "dw"), ("dw", "project")]
    out, count = equalize(model)
    assert count == 2  # expand->dw, dw->project
    w = weights(out)
    r_dw = np.abs(w["wd"]).reshape(32, -1).max(1)
    r_dw0 = np.abs(weights(model)["wd"]).reshape(32, -1).max(1)
    assert r_dw.max() / r_dw.min() < (r_dw0.max() / r_dw0.min()) / 5
    # after the chain converged, layer 1's output ranges equal layer 2's input ranges
    r_e = np.abs(w["we"]).reshape(32, -1).max(1)
    np.testing.assert_allclose(r_e, r_dw, rtol=0.02)


def test_dense_pairs_gemm_and_matmul():
    k, m, n = 16, 24, 8
    scale = spread(m)
    inits = {
        "w1": RNG.standard_normal((m, k)) * 0.3 * scale[:, None],  # transB: (N, K)
        "c1": RNG.standard_normal(m) * 0.1,
        "w2": RNG.standard_normal((m, m)) * 0.3 * scale[None, :],  # MatMul (K, N)
        "b2": RNG.standard_normal((1, m)) * 0.1,
        "w3": RNG.standard_normal((m, n)) * 0.3,
    }
    nodes = [
        h.make_node("Gemm", ["x", "w1", "c1"], ["g1"], name="fc1", transB=1, alpha=0.5, beta=2.0),
        h.make_node("Relu", ["g1"], ["r1"], name="relu1"),
        h.make_node("MatMul", ["r1", "w2"], ["m2"], name="mm2"),
        h.make_node("Add", ["m2", "b2"], ["a2"], name="bias2"),
        h.make_node("LeakyRelu", ["a2"], ["r2"], name="relu2", alpha=0.2),
        h.make_node("MatMul", ["r2", "w3"], ["y"], name="mm3"),
    ]
    model = build(nodes, inits, [4, k])
    data = feeds([4, k], low=0, high=2)
    out, count = equalize(model)
    assert count == 2
    assert deviations(model, out, feeds([4, k], seed=3)) == []
    absorbed, count = equalize(model, data, absorb_bias=True)
    assert count == 2 and deviations(model, absorbed, data) == []
    assert not np.array_equal(weights(absorbed)["c1"], weights(out)["c1"])


def test_conv_transpose_pairs():
    inits = {
        "w1": RNG.standard_normal((16, 4, 3, 3)) * 0.3 * spread(16)[:, None, None, None],
        "b1": RNG.standard_normal(16) * 0.1,
        "wt": RNG.standard_normal((16, 6, 2, 2)) * 0.3 * spread(6)[None, :, None, None],
        "bt": RNG.standard_normal(6) * 0.1,
        "w3": RNG.standard_normal((4, 6, 3, 3)) * 0.3,
    }
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["t"], name="c1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["t"], ["a"], name="r1"),
        h.make_node("ConvTranspose", ["a", "wt", "bt"], ["u"], name="up", strides=[2, 2]),
        h.make_node("Relu", ["u"], ["ur"], name="r2"),
        h.make_node("Conv", ["ur", "w3"], ["y"], name="c3"),
    ]
    model = build(nodes, inits, [1, 4, 6, 6])
    out, count = equalize(model)
    assert count == 2
    assert deviations(model, out, feeds([1, 4, 6, 6], seed=5)) == []


def test_grouped_conv_pairs():
    inits = {
        "w1": RNG.standard_normal((16, 4, 3, 3)) * 0.3 * spread(16)[:, None, None, None],
        "w2": RNG.standard_normal((8, 8, 1, 1)) * 0.3,  # group 2: 8 inputs per group
        "w3": RNG.standard_normal((4, 4, 1, 1)) * 0.3,  # group 2 again
    }
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["t"], name="c1", pads=[1, 1, 1, 1], group=2),
        h.make_node("Relu", ["t"], ["a"], name="r1"),
        h.make_node("Conv", ["a", "w2"], ["u"], name="c2", group=2),
        h.make_node("Conv", ["u", "w3"], ["y"], name="c3", group=2),
    ]
    model = build(nodes, inits, [1, 8, 6, 6])
    out, count = equalize(model)
    assert count == 2
    assert deviations(model, out, feeds([1, 8, 6, 6])) == []


# --------------------------------------------------------------------------- it helps


@pytest.mark.parametrize("make", [conv_pair, depthwise_block], ids=["conv-relu-conv", "depthwise"])
def test_per_tensor_int8_sqnr_rises(make, tmp_path: Path):
    model = make()
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    calib, held = feeds(x_shape, n=16), feeds(x_shape, n=8, seed=9)
    out, count = equalize(model, calib, absorb_bias=True)
    assert count >= 1
    before = int8_sqnr(model, model, calib, held, tmp_path / "before")
    after = int8_sqnr(out, model, calib, held, tmp_path / "after")
    assert after > before + 10.0, (before, after)  # measured: 10.7 -> 37.6, 8.4 -> 35.5 dB


# ------------------------------------------------------------------------- must not fire


@pytest.mark.parametrize(
    "act, inputs, attrs",
    [
        ("Sigmoid", (), {}),
        ("HardSwish", (), {}),
        ("PRelu", ("slope",), {}),
        ("Clip", ("zero", "six"), {}),
        ("Clip", ("minus", ""), {}),
        ("LeakyRelu", (), {"alpha": -0.1}),
    ],
    ids=["sigmoid", "hardswish", "prelu-negative", "relu6", "clip-negative-min", "leaky-negative"],
)
def test_not_across_a_non_homogeneous_activation(act, inputs, attrs):
    model = conv_pair(act, act_inputs=inputs, act_attrs=attrs)
    slope = np.full((16, 1, 1), 0.2, np.float32)
    slope[3] = -0.1
    for name, value in {"slope": slope, "zero": 0.0, "six": 6.0, "minus": -1.0}.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
    out, count = equalize(model, feeds([1, 8, 10, 10]), absorb_bias=True)
    assert count == 0 and unchanged(model, out)
    assert equalizable_pairs(model) == []


def test_clip_with_min_zero_and_no_max_is_relu():
    model = conv_pair("Clip", act_inputs=("zero",))
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(0.0, np.float32), "zero"))
    out, count = equalize(model, feeds([1, 8, 10, 10]), absorb_bias=True)
    assert count == 1
    assert deviations(model, out, feeds([1, 8, 10, 10], seed=2)) == []


def test_not_when_the_tensor_between_has_another_reader():
    model = conv_pair("Relu")
    extra = h.make_tensor_value_info("t", T.FLOAT, None)
    model.graph.output.append(extra)  # the pre-activation is a graph output
    out, count = equalize(model)
    assert count == 0 and unchanged(model, out)
    model = conv_pair("Relu")
    model.graph.node.append(h.make_node("Relu", ["a"], ["side"], name="side"))
    model.graph.output.append(h.make_tensor_value_info("side", T.FLOAT, None))
    out, count = equalize(model)
    assert count == 0 and unchanged(model, out)


def test_not_with_non_constant_weights():
    model = conv_pair("Relu")
    w2 = next(t for t in model.graph.initializer if t.name == "w2")
    model.graph.input.append(h.make_tensor_value_info("w2", T.FLOAT, list(w2.dims)))
    out, count = equalize(model)  # w2 is an initializer a caller may override
    assert count == 0 and unchanged(model, out)


def test_not_where_channel_axes_do_not_line_up():
    # a channel shuffle (Reshape, Transpose, Reshape) between two grouped convs
    inits = {
        "w1": RNG.standard_normal((8, 2, 1, 1)) * spread(8)[:, None, None, None],
        "w2": RNG.standard_normal((8, 2, 1, 1)),
        "s1": np.array([1, 2, 4, 6, 6]),
        "s2": np.array([1, 8, 6, 6]),
    }
    shape_inits = [
        numpy_helper.from_array(np.asarray(inits.pop(k), np.int64), k) for k in ("s1", "s2")
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["t"], name="c1", group=4),
        h.make_node("Reshape", ["t", "s1"], ["r"], name="r1"),
        h.make_node("Transpose", ["r"], ["tr"], name="tr", perm=[0, 2, 1, 3, 4]),
        h.make_node("Reshape", ["tr", "s2"], ["u"], name="r2"),
        h.make_node("Conv", ["u", "w2"], ["y"], name="c2", group=4),
    ]
    model = build(nodes, inits, [1, 8, 6, 6])
    model.graph.initializer.extend(shape_inits)
    out, count = equalize(model)
    assert count == 0 and unchanged(model, out)
    # a Conv's channels (axis 1) into a MatMul (the last axis)
    inits = {
        "w1": RNG.standard_normal((6, 4, 1, 1)) * spread(6)[:, None, None, None],
        "w2": RNG.standard_normal((6, 6)),
    }
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["t"], name="c1"),
        h.make_node("MatMul", ["t", "w2"], ["y"], name="mm"),
    ]
    model = build(nodes, inits, [1, 4, 6, 6])
    out, count = equalize(model)
    assert count == 0 and unchanged(model, out)


def test_custom_domain_nodes_and_untouched_nodes_are_kept():
    model = conv_pair("Relu")
    model.graph.node.append(h.make_node("Mystery", ["y"], ["z"], name="custom", domain="x.y"))
    model.opset_import.append(h.make_opsetid("x.y", 1))
    out, count = equalize(model)
    assert count == 1
    assert [(n.name, n.op_type, n.domain) for n in out.graph.node] == [
        (n.name, n.op_type, n.domain) for n in model.graph.node
    ]
    assert out.graph.node[-1] == model.graph.node[-1]


def test_a_shared_weight_is_copied_not_changed_for_its_other_reader():
    model = conv_pair("Relu")
    # another conv reads w1 too, outside any pair
    model.graph.node.append(
        h.make_node("Conv", ["x", "w1"], ["z"], name="other", pads=[1, 1, 1, 1])
    )
    model.graph.output.append(h.make_tensor_value_info("z", T.FLOAT, None))
    out, count = equalize(model)
    assert count == 1
    c1 = next(n for n in out.graph.node if n.name == "c1")
    assert c1.input[1] != "w1" and out.graph.node[-1].input[1] == "w1"
    assert np.array_equal(weights(out)["w1"], weights(model)["w1"])
    assert deviations(model, out, feeds([1, 8, 10, 10])) == []


# ------------------------------------------------------------------------- idempotence


def test_a_second_equalization_changes_nothing():
    model = depthwise_block()
    once, count = equalize(model)
    assert count == 2
    twice, again = equalize(once)
    assert again == 0 and unchanged(once, twice)


def test_a_second_equalization_with_bias_absorption_changes_little():
    model = conv_pair("Relu", pads2=0)
    b1 = next(t for t in model.graph.initializer if t.name == "b1")
    b1.CopyFrom(numpy_helper.from_array(np.full(16, 8.0, np.float32), "b1"))
    calib = feeds([1, 8, 10, 10], n=8)
    once, count = equalize(model, calib, absorb_bias=True)
    plain, _ = equalize(model)
    absorbed = weights(once)["b1"] < weights(plain)["b1"]
    assert count == 1 and absorbed.sum() >= 4
    twice, again = equalize(once, calib, absorb_bias=True)
    assert again == 0
    w1, w2 = weights(once), weights(twice)
    for name in w1:
        np.testing.assert_allclose(
            w2[name], w1[name], rtol=1e-3, atol=1e-3 * np.abs(w1[name]).max()
        )


# ----------------------------------------------------------------------- bias absorption


def test_bias_absorption_moves_always_positive_channels_and_stays_exact():
    model = conv_pair("Relu", pads2=0)
    b1 = next(t for t in model.graph.initializer if t.name == "b1")
    bias = numpy_helper.to_array(b1).copy()
    w1 = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w1"))
    # six channels that never reach the Relu's knee on inputs in [-1, 1]
    bias[:6] = 2 * np.abs(w1[:6]).reshape(6, -1).sum(1)
    b1.CopyFrom(numpy_helper.from_array(bias, "b1"))
    calib = feeds([1, 8, 10, 10], n=16)
    plain, _ = equalize(model)
    absorbed, count = equalize(model, calib, absorb_bias=True)
    assert count == 1
    wp, wa = weights(plain), weights(absorbed)
    moved = wp["b1"] - wa["b1"]
    assert np.all(moved[:6] > 0) and not np.any(moved[6:] > 1e-6 * np.abs(wp["b1"][6:]).max())
    assert not np.allclose(wp["b2"], wa["b2"])
    assert deviations(model, absorbed, calib) == []
    # layer 1's output range shrinks where the bias left
    t_plain = run_tensor(plain, "t", calib)
    t_abs = run_tensor(absorbed, "t", calib)
    assert t_abs[:, :6].max() < t_plain[:, :6].max()


def test_no_absorption_into_a_padded_conv():
    model = conv_pair("Relu", pads2=1)
    b1 = next(t for t in model.graph.initializer if t.name == "b1")
    b1.CopyFrom(numpy_helper.from_array(np.full(16, 5.0, np.float32), "b1"))
    calib = feeds([1, 8, 10, 10], n=4)
    plain, _ = equalize(model)
    absorbed, count = equalize(model, calib, absorb_bias=True)
    assert count == 1 and unchanged(plain, absorbed)


def run_tensor(model, name, data):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(h.make_empty_tensor_value_info(name))
    return np.concatenate([r[-1] for r in run(probe, data)])


def test_not_into_a_grouped_conv_transpose_or_a_transposed_gemm_input():
    inits = {
        "w1": RNG.standard_normal((8, 4, 1, 1)) * spread(8)[:, None, None, None],
        "wt": RNG.standard_normal((8, 3, 2, 2)),  # group 2: (C_in, C_out / group, k, k)
    }
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["t"], name="c1"),
        h.make_node("Relu", ["t"], ["a"], name="r1"),
        h.make_node("ConvTranspose", ["a", "wt"], ["y"], name="up", group=2),
    ]
    model = build(nodes, inits, [1, 4, 5, 5])
    out, count = equalize(model)
    assert count == 0 and unchanged(model, out)
    inits = {
        "w1": RNG.standard_normal((6, 6)) * spread(6)[None, :],
        "w2": RNG.standard_normal((4, 5)),
    }
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["t"], name="mm"),
        h.make_node("Gemm", ["t", "w2"], ["y"], name="fc", transA=1),  # reads t's rows
    ]
    model = build(nodes, inits, [6, 6])
    out, count = equalize(model)
    assert count == 0 and unchanged(model, out)
