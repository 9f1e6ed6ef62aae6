"""Activation range estimators (quantization/ranges.py): the ranges reach onnxruntime's
quantizer as per-tensor overrides (the QDQ model's scales and zero points are the ones
computed here), each estimator beats global min/max where one sample carries a huge outlier
and agrees with it on a uniform activation, the edge cases (a constant tensor, an all-zero
channel, one sample), the histogram's error model against a brute-force count, and the
statistics' fixed size whatever the number of samples."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from recovery import ort_quantize

from opfuse.errors import OpfuseError
from opfuse.quantization import _stats, ranges
from opfuse.quantization._stats import tensor_values
from opfuse.quantization.ranges import (
    BINS,
    METHODS,
    RangeStatistics,
    activation_ranges,
    qparams,
    quantized_activations,
    to_overrides,
)
from opfuse.quantization.trace import sqnr_db

Feed = dict[str, np.ndarray]


def const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def conv_net(
    seed: int = 0, channels: int = 8, zero_channel: bool = False, size: int = 16, head: bool = True
) -> onnx.ModelProto:
    """x [1,4,size,size] -> Conv(+bias) -> Relu -> Conv(+bias) -> Reshape -> Gemm -> y [1,10]
    (``head``; else the second Conv's output is the model's); ``zero_channel``: the first
    conv's filter and bias of channel 0 are zero (an all-zero channel after the Relu)."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.3, (channels, 4, 3, 3))
    b1 = rng.normal(0, 0.1, channels)
    if zero_channel:
        w1[0], b1[0] = 0.0, 0.0
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", strides=[2, 2]),
        h.make_node("Reshape", ["c2", "shape"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    inits = [
        const("w1", w1),
        const("b1", b1),
        const("w2", rng.normal(0, 0.2, (channels, channels, 2, 2))),
        const("b2", rng.normal(0, 0.1, channels)),
        numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),
        const("wf", rng.normal(0, 0.05, (10, channels * size * size // 4))),
        const("bf", rng.normal(0, 0.1, 10)),
    ]
    if not head:
        nodes, inits = nodes[:3], inits[:4]
    out = [1, 10] if head else [1, channels, size // 2, size // 2]
    graph = h.make_graph(
        nodes,
        "net",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, size, size])],
        [h.make_tensor_value_info("y" if head else "c2", T.FLOAT, out)],
        initializer=inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def normal_samples(n: int, seed: int, outlier: float | None = None, size: int = 16) -> list[Feed]:
    rng = np.random.default_rng(seed)
    out = [{"x": rng.normal(0, 1, (1, 4, size, size)).astype(np.float32)} for _ in range(n)]
    if outlier is not None:
        out[0]["x"][0, 1, 5, 5] = outlier  # one value of one sample
    return out


def quantize(
    model: onnx.ModelProto, samples: Sequence[Feed], tmp: Path, overrides: dict | None = None
) -> onnx.ModelProto:
    return ort_quantize(model, samples, tmp, overrides=overrides)


def output_sqnr(fm: onnx.ModelProto, qm: onnx.ModelProto, samples: Sequence[Feed]) -> float:
    name = fm.graph.output[0].name
    signal = noise = 0.0
    for f, q in zip(
        tensor_values(fm, [name], samples), tensor_values(qm, [name], samples), strict=True
    ):
        x, y = f[name].astype(np.float64), q[name].astype(np.float64)
        signal += float(np.sum(x**2))
        noise += float(np.sum((x - y) ** 2))
    return sqnr_db(signal, noise)


def activation_qparams(qm: onnx.ModelProto) -> dict[str, tuple[float, int]]:
    """Tensor -> (scale, zero point) of each QuantizeLinear of an activation (a graph
    output's producer writes NAME_QuantizeLinear_Input)."""
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    return {
        n.input[0].removesuffix("_QuantizeLinear_Input"): (
            float(inits[n.input[1]]),
            int(inits[n.input[2]]),
        )
        for n in qm.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits
    }


# --- onnxruntime reads the ranges -----------------------------------------------------------


def test_overrides_become_the_qdq_models_scales(tmp_path: Path) -> None:
    model = conv_net()
    calib = normal_samples(6, 1, outlier=40.0)
    tensors = quantized_activations(model)
    computed = activation_ranges(model, calib, tensors, "mean-minmax")
    qm = quantize(model, calib, tmp_path, to_overrides(computed))
    got = activation_qparams(qm)
    assert got, "the quantizer quantized no activation"
    for tensor, (scale, zero) in got.items():
        want_scale, want_zero = qparams(*computed[tensor])
        assert scale == float(want_scale), tensor  # bit for bit
        assert zero == want_zero, tensor
    # and they are not onnxruntime's own: its global min/max puts the outlier in x's range
    plain = activation_qparams(quantize(model, calib, tmp_path))
    assert plain["x"][0] > 2 * got["x"][0]


def test_int8_activations_take_the_same_ranges(tmp_path: Path) -> None:
    from onnxruntime import quantization as q

    model = conv_net()
    calib = normal_samples(3, 2)
    computed = activation_ranges(
        model, calib, quantized_activations(model), "percentile", activation_type="int8"
    )
    out = tmp_path / "int8.onnx"
    onnx.save(model, str(tmp_path / "model.onnx"))

    class Reader(q.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self) -> Feed | None:
            return next(self.it, None)

    q.quantize_static(
        str(tmp_path / "model.onnx"),
        str(out),
        Reader(),
        quant_format=q.QuantFormat.QDQ,
        activation_type=q.QuantType.QInt8,
        extra_options={"TensorQuantOverrides": to_overrides(computed)},
    )
    for tensor, (scale, zero) in activation_qparams(onnx.load(str(out))).items():
        assert (scale, zero) == tuple(map(float, qparams(*computed[tensor], "int8"))), tensor


def test_quantized_activations_are_what_the_quantizer_quantizes(tmp_path: Path) -> None:
    model = conv_net()
    listed = quantized_activations(model)
    assert listed == ["x", "c1", "r1", "c2", "f", "y"]  # graph order; no initializer, no int64
    quantized = set(activation_qparams(quantize(model, normal_samples(2, 3), tmp_path)))
    # every tensor with a QuantizeLinear is listed; the one listed without is the Relu's
    # input, which the quantizer merges into the Relu's output (it drops the Relu)
    assert quantized <= set(listed)
    assert set(listed) - quantized == {"c1"}


@pytest.mark.parametrize("method", METHODS)
def test_a_softmax_keeps_onnxruntimes_fixed_range(method: str, tmp_path: Path) -> None:
    """onnxruntime's quantizer gives a Softmax's output [0, 1]; every method keeps it (with
    minmax the overrides then give exactly onnxruntime's own scales)."""
    model = conv_net()
    model.graph.node.append(h.make_node("Softmax", ["y"], ["prob"], name="softmax", axis=-1))
    model.graph.output[0].name = "prob"
    calib = normal_samples(4, 18)
    tensors = quantized_activations(model)
    assert "prob" in tensors
    computed = activation_ranges(model, calib, tensors, method)
    assert computed["prob"] == (0.0, 1.0)
    got = activation_qparams(quantize(model, calib, tmp_path, to_overrides(computed)))
    assert got["prob"] == (float(np.float32(1 / 255)), 0)
    if method == "minmax":
        assert got == activation_qparams(quantize(model, calib, tmp_path))


@pytest.mark.parametrize("method", METHODS)
def test_a_sigmoid_map_keeps_its_global_extremes(method: str) -> None:
    """A score map (Sigmoid) whose maximum is near 0 on most samples and 1 on a few (a text
    detector on images without and with text): every method keeps the global [min, max]
    (mean-minmax would give 0.3: every text pixel saturated there), while the Conv's output
    before it still gets the method's own range."""
    model = conv_net(head=False)
    model.graph.node.append(h.make_node("Sigmoid", ["c2"], ["score"], name="sigmoid"))
    model.graph.output[0].name = "score"
    calib = normal_samples(10, 3)
    for k, sample in enumerate(calib):  # 3 of 10 with a large signal, 7 nearly empty
        sample["x"] = sample["x"] * (4.0 if k in (3, 7, 9) else 0.01) - (0 if k in (3, 7, 9) else 3)
    tensors = quantized_activations(model)
    computed = activation_ranges(model, calib, tensors, method)
    values = [v["score"] for v in tensor_values(model, ["score", "c2"], calib)]
    assert computed["score"] == (
        min(float(v.min()) for v in values),
        max(float(v.max()) for v in values),
    )
    if method == "mean-minmax":  # must not fire on what is not bounded
        c2 = [v["c2"] for v in tensor_values(model, ["c2"], calib)]
        assert computed["c2"][1] == pytest.approx(float(np.mean([v.max() for v in c2])), rel=1e-6)
        assert computed["c2"][1] < max(float(v.max()) for v in c2)


def test_ranges_of_graph_inputs_and_unknown_tensors() -> None:
    model = conv_net()
    calib = normal_samples(2, 4)
    got = activation_ranges(model, calib, ["x"], "minmax")
    assert got["x"] == (
        min(float(s["x"].min()) for s in calib),
        max(float(s["x"].max()) for s in calib),
    )
    with pytest.raises(OpfuseError, match="no tensor 'nope'"):
        activation_ranges(model, calib, ["nope"], "minmax")
    with pytest.raises(OpfuseError, match="range method"):
        activation_ranges(model, calib, ["x"], "entropy")
    assert activation_ranges(model, calib, [], "mse") == {}


# --- where each estimator must help, and where it must change nothing ------------------------


@pytest.mark.parametrize("method", ["mean-minmax", "percentile", "mse"])
def test_a_rare_outlier_costs_minmax_not_the_estimator(method: str, tmp_path: Path) -> None:
    """One value of one calibration sample is 60x the input's spread: global min/max gives
    x (and what follows) a range 15x too wide; the held-out samples have no outlier. (One
    value among a million: the least-error range clips a lone value only when it is rarer
    than about 1 in 780,000 at 8 bits.)"""
    model = conv_net(size=64, head=False)
    calib = normal_samples(64, 5, outlier=60.0, size=64)
    held_out = normal_samples(4, 6, size=64)
    tensors = quantized_activations(model)
    base = output_sqnr(
        model,
        quantize(
            model, calib, tmp_path, to_overrides(activation_ranges(model, calib, tensors, "minmax"))
        ),
        held_out,
    )
    chosen = activation_ranges(model, calib, tensors, method)
    assert chosen["x"][1] < 30.0  # at most half of the outlier
    better = output_sqnr(model, quantize(model, calib, tmp_path, to_overrides(chosen)), held_out)
    assert better > base + 6.0, (method, base, better)


@pytest.mark.parametrize("method", METHODS)
def test_a_uniform_activation_keeps_about_its_minmax(method: str) -> None:
    rng = np.random.default_rng(7)
    model = conv_net()
    calib = [{"x": rng.uniform(-2, 3, (1, 4, 16, 16)).astype(np.float32)} for _ in range(8)]
    lo, hi = activation_ranges(model, calib, ["x"], method)["x"]
    assert lo == pytest.approx(-2.0, rel=0.02)
    assert hi == pytest.approx(3.0, rel=0.02)


# --- edge cases --------------------------------------------------------------------------


def constant_model(value: float) -> onnx.ModelProto:
    """y = x * 0 + value: a constant tensor whatever the input."""
    nodes = [
        h.make_node("Mul", ["x", "zero"], ["m"], name="mul"),
        h.make_node("Add", ["m", "c"], ["y"], name="add"),
        h.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    graph = h.make_graph(
        nodes,
        "const",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 16, 16])],
        [h.make_tensor_value_info("z", T.FLOAT, [1, 4, 16, 16])],
        initializer=[const("zero", np.zeros(1)), const("c", np.full(1, value))],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("value", [2.5, -1.5, 0.0])
def test_a_constant_tensor(method: str, value: float) -> None:
    model = constant_model(value)
    got = activation_ranges(model, normal_samples(3, 8), ["m", "y"], method)
    assert got["m"] == (0.0, 0.0)  # all zeros: onnxruntime then takes scale 1, zero point 0
    lo, hi = got["y"]
    assert lo <= 0.0 <= hi
    assert (lo, hi) == pytest.approx((min(value, 0.0), max(value, 0.0)), abs=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_an_all_zero_channel(method: str, tmp_path: Path) -> None:
    model = conv_net(zero_channel=True)
    calib = normal_samples(4, 9)
    values = next(tensor_values(model, ["r1"], calib[:1]))["r1"]
    assert not values[:, 0].any() and values[:, 1:].any()
    computed = activation_ranges(model, calib, quantized_activations(model), method)
    qm = quantize(model, calib, tmp_path, to_overrides(computed))
    for lo, hi in computed.values():
        assert lo <= 0.0 <= hi and np.isfinite([lo, hi]).all()
    assert output_sqnr(model, qm, normal_samples(2, 10)) > 20.0


def test_one_sample() -> None:
    model = conv_net()
    calib = normal_samples(1, 11)
    tensors = quantized_activations(model)
    minmax = activation_ranges(model, calib, tensors, "minmax")
    for method, kwargs in (("mean-minmax", {}), ("percentile", {"percentile": 100.0})):
        got = activation_ranges(model, calib, tensors, method, **kwargs)  # type: ignore[arg-type]
        for tensor in tensors:
            assert got[tensor] == pytest.approx(minmax[tensor]), (method, tensor)
    for lo, hi in activation_ranges(model, calib, tensors, "mse").values():
        assert lo <= 0.0 <= hi


def test_mean_minmax_is_the_mean_of_each_samples_extremes() -> None:
    model = conv_net()
    calib = normal_samples(5, 12, outlier=30.0)
    got = activation_ranges(model, calib, ["x"], "mean-minmax")["x"]
    lows = [float(s["x"].min()) for s in calib]
    highs = [float(s["x"].max()) for s in calib]
    assert got == pytest.approx((np.mean(lows), np.mean(highs)))


def test_percentile_against_numpy() -> None:
    rng = np.random.default_rng(13)
    stats = RangeStatistics(histogram=True)
    everything = []
    for k in range(20):  # the spread grows: the histogram's top doubles several times
        x = rng.normal(0.5, 0.1 * (k + 1), 5000).astype(np.float32)
        everything.append(x)
        stats.add(x)
    allx = np.concatenate(everything)
    lo, hi = stats.percentile(99.0)
    width = float(allx.max() - allx.min()) / BINS * 2
    assert lo == pytest.approx(np.quantile(allx, 0.01), abs=width)
    assert hi == pytest.approx(np.quantile(allx, 0.99), abs=width)


@pytest.mark.parametrize("clip", [(-1.0, 3.0), (-0.5, 2.0), (-1.0, 1.0), (0.0, 0.4)])
def test_the_mse_model_against_brute_force(clip: tuple[float, float]) -> None:
    """The histogram's closed-form error of one clipping range equals the error measured by
    quantizing every value as onnxruntime does, within a percent."""
    rng = np.random.default_rng(14)
    x = np.concatenate([rng.uniform(-1, 3, 100_000), rng.normal(0, 0.2, 100_000)])
    x = x.astype(np.float32)
    stats = RangeStatistics(histogram=True)
    stats.add(x)
    lower, upper, counts = stats._bins()
    model = ranges._qdq_mse(lower, upper, counts, np.array([clip[0]]), np.array([clip[1]]), "uint8")
    scale, zero = qparams(*clip)
    deq = (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * np.float64(scale)
    assert model[0] == pytest.approx(np.mean((x - deq) ** 2), rel=0.01)


@pytest.mark.parametrize("clip", [(0.0, 80.0), (0.0, 10.0), (0.0, 4.0), (-0.5, 3.0)])
def test_the_search_model_agrees_with_the_exact_one(clip: tuple[float, float]) -> None:
    """The cheap model the search ranks candidates with (clipping error by prefix sums,
    s^2/12 inside, the zeros free) within 2% of the exact one on a Relu-like tensor."""
    rng = np.random.default_rng(17)
    stats = RangeStatistics(histogram=True)
    for k in range(10):
        x = np.maximum(rng.normal(0, 1, 100_000), 0).astype(np.float32)
        if k == 3:
            x[0] = 80.0
        stats.add(x)
    lower, upper, counts = stats._bins()
    lows, highs = np.array([clip[0]]), np.array([clip[1]])
    cheap = ranges._ClipModel(lower, upper, counts).errors(lows, highs, "uint8")
    exact = ranges._qdq_mse(lower, upper, counts, lows, highs, "uint8")
    assert cheap[0] == pytest.approx(exact[0], rel=0.02)


def test_mse_finds_the_least_error_and_clips_only_when_it_pays() -> None:
    rng = np.random.default_rng(15)
    rare = RangeStatistics(histogram=True)  # 2 values of 80 among 2 million N(0, 1)
    common = RangeStatistics(histogram=True)  # 1% of the values in [10, 20]
    values = []
    for k in range(20):
        x = rng.normal(0, 1, 100_000).astype(np.float32)
        y = x.copy()
        if k in (3, 11):
            x[0] = 80.0
        y[:1000] = rng.uniform(10, 20, 1000)
        rare.add(x)
        common.add(y)
        values.append(x)
    everything = np.concatenate(values)

    def measured(lo: float, hi: float) -> float:
        scale, zero = qparams(lo, hi)
        deq = (np.clip(np.round(everything / scale) + zero, 0, 255) - zero) * np.float64(scale)
        return float(np.mean((everything - deq) ** 2))

    lo, hi = rare.mse("uint8")
    assert hi < 40.0  # the outliers are clipped
    grid = [measured(rare.low, top) for top in np.linspace(5.0, 80.0, 16)]
    assert measured(lo, hi) <= min(grid) * 1.01
    assert common.mse("uint8")[1] > 18.0  # clipping 1% of the values would cost more


# --- memory: fixed-size statistics --------------------------------------------------------


def state_size(stats: RangeStatistics) -> int:
    """Bytes of every array the statistics hold, and a check that nothing else grows."""
    size = 0
    for value in vars(stats).values():
        assert not isinstance(value, (list, dict, tuple)), value
        if isinstance(value, ranges._Histogram):
            size += value.counts.nbytes
    return size


@pytest.mark.parametrize("histogram", [False, True])
def test_the_statistics_do_not_grow_with_the_samples(histogram: bool) -> None:
    rng = np.random.default_rng(16)
    stats = RangeStatistics(histogram=histogram)
    stats.add(rng.normal(0, 1, 1000).astype(np.float32))
    first = state_size(stats)
    for k in range(200):
        stats.add(rng.normal(0, 1 + k, 1000).astype(np.float32))  # ranges keep growing
    assert state_size(stats) == first == (2 * BINS * 8 if histogram else 0)


# --- the shared statistics helper (_stats) --------------------------------------------------


def test_channel_moments_against_numpy() -> None:
    """Per-channel count, mean and std reduced inside onnxruntime (axis 1 of a Conv output
    and the last axis of a Gemm output), equal to numpy's over all samples."""
    model = conv_net()
    calib = normal_samples(5, 19)
    values = list(tensor_values(model, ["c1", "y"], calib))
    moments = _stats.channel_moments(model, {"c1": 1, "y": -1}, calib)
    c1 = np.concatenate([v["c1"] for v in values])  # [5, 8, 16, 16]
    y = np.concatenate([v["y"] for v in values])  # [5, 10]
    assert moments["c1"].count.tolist() == [5 * 16 * 16] * 8
    assert moments["c1"].mean == pytest.approx(c1.mean(axis=(0, 2, 3)), abs=1e-5)
    assert moments["c1"].std == pytest.approx(c1.std(axis=(0, 2, 3)), abs=1e-4)
    assert moments["y"].mean == pytest.approx(y.mean(axis=0), abs=1e-5)
    assert moments["y"].std == pytest.approx(y.std(axis=0), abs=1e-4)
    with pytest.raises(OpfuseError, match="no tensor"):
        _stats.channel_moments(model, {"nope": 1}, calib)
