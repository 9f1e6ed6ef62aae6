"""The advisor on QDQ models (made by onnxruntime's quantize_static on small CNNs): each
finding fires where it should and not elsewhere, the float twin, the measured verdict
with a fake runtime, and the section in the advise report and its text."""

from __future__ import annotations

import html
import io
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from opfuse.advisor.conductor import AdviseOptions, advise
from opfuse.advisor.quantized import (
    channel_counts,
    dequantized_float,
    float_layers,
    int8_pays,
    quantized_findings,
    requantizations,
    unfused_qdq,
)
from opfuse.advisor.render import render_html, render_text
from opfuse.runtime.cpu import parse_cpuinfo
from opfuse.runtime.fake import FakeRuntime
from qdq_models import calibration, cnn, quantize

AVX512_VNNI = parse_cpuinfo("flags: avx2 avx512f avx512_vnni\n")
AVX2 = parse_cpuinfo("flags: avx2\n")


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, feeds)[0])


def test_unfused_qdq_fires_on_an_op_without_int8_kernel(tmp_path: Path) -> None:
    found = unfused_qdq(quantize(cnn(act="HardSwish"), tmp_path), None)
    assert len(found) == 1 and found[0]["kind"] == "unfused_qdq"
    assert "Mul x2" in str(found[0]["finding"])
    assert found[0]["why"] and found[0]["what_to_do"]


def test_unfused_qdq_silent_when_everything_fuses(tmp_path: Path) -> None:
    assert unfused_qdq(quantize(cnn(), tmp_path), None) == []


def qdq_chain(second_scale: float) -> onnx.ModelProto:
    """x -> Q(s1) -> DQ(s1) -> Q(s2) -> DQ(s2) -> Relu -> y"""
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s1"),
        numpy_helper.from_array(np.array(second_scale, np.float32), "s2"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["q1"], name="q1"),
        helper.make_node("DequantizeLinear", ["q1", "s1", "z"], ["d1"], name="d1"),
        helper.make_node("QuantizeLinear", ["d1", "s2", "z"], ["q2"], name="q2"),
        helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"], name="d2"),
        helper.make_node("Relu", ["d2"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_requantization_same_and_other_scale() -> None:
    same = requantizations(qdq_chain(0.1))
    assert [f["nodes"] for f in same] == [["q2"]]
    assert "same scale" in str(same[0]["finding"])
    other = requantizations(qdq_chain(0.2))
    assert [f["nodes"] for f in other] == [["q2"]]
    assert "another scale" in str(other[0]["finding"])


def test_requantization_silent_on_a_plain_qdq_model(tmp_path: Path) -> None:
    assert requantizations(quantize(cnn(), tmp_path)) == []


def test_float_layers_with_their_profile_cost(tmp_path: Path) -> None:
    qdq = quantize(cnn(act="HardSwish"), tmp_path, exclude=["conv2", "act2"])
    found = float_layers(qdq, {"conv2": 30.0, "conv1": 10.0}, total_us=100.0)
    assert len(found) == 1
    assert found[0]["nodes"] == ["conv2"] and found[0]["cost_us"] == 30.0
    # conv2's share of the multiply-adds: 294912 of 322880
    assert "(91% of the multiply-adds, 30.0 us (30% of the profile))" in str(found[0]["finding"])
    assert float_layers(quantize(cnn(), tmp_path), {}, 0.0) == []


def test_channel_counts_against_the_vector_width(tmp_path: Path) -> None:
    # conv1: 3 input channels (not a multiple of 4); conv2 20 -> 32 fine on AVX-512 only
    # if 20 % 16 ... : conv1 has 20 output channels; fc 10 outputs
    qdq = quantize(cnn(channels=(20, 32)), tmp_path)
    found = channel_counts(qdq, AVX512_VNNI, {"fc": 1.0})
    assert len(found) == 1
    assert set(found[0]["nodes"]) == {"conv1", "fc"}  # type: ignore[arg-type]
    assert "16 output channels" in str(found[0]["finding"])
    # on AVX2 (8 int32 lanes) conv2 (32 out, 20 in) is still whole; fc 10 is not
    avx2 = channel_counts(qdq, AVX2, {})
    assert set(avx2[0]["nodes"]) == {"conv1", "fc"}  # type: ignore[arg-type]
    assert "8 output channels" in str(avx2[0]["finding"])


def test_channel_counts_silent_when_whole(tmp_path: Path) -> None:
    model = cnn(channels=(16, 32), classes=16)
    # the first conv reads 3 channels whatever the model: give it 4 (an RGBA-like input)
    w1 = numpy_helper.to_array(model.graph.initializer[0])
    padded = np.concatenate([w1, np.zeros_like(w1[:, :1])], axis=1)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(padded, "w1"))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    assert channel_counts(quantize(model, tmp_path), AVX512_VNNI, {}) == []


def test_dequantized_float_twin(tmp_path: Path) -> None:
    model = cnn()
    qdq = quantize(model, tmp_path)
    twin = dequantized_float(qdq)
    onnx.checker.check_model(twin)
    ops = [n.op_type for n in twin.graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert [o.name for o in twin.graph.output] == ["y"]
    # the twin's weights are the int8 weights dequantized: (q - zp) * scale per channel
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    w1 = {t.name: numpy_helper.to_array(t) for t in twin.graph.initializer}
    conv1 = next(n for n in twin.graph.node if n.name == "conv1")
    expect = inits["w1_quantized"].astype(np.float32) * inits["w1_scale"].reshape(-1, 1, 1, 1)
    np.testing.assert_array_equal(w1[conv1.input[1]], expect)
    # and its outputs are the float model's up to the weights' rounding
    feeds = calibration(model, 1, seed=7)[0]
    ref, got = run(model, feeds), run(twin, feeds)
    cos = float(np.dot(ref.ravel(), got.ravel()) / np.linalg.norm(ref) / np.linalg.norm(got))
    assert cos > 0.999


def test_int8_does_not_pay_with_a_fake_runtime(tmp_path: Path) -> None:
    qdq = quantize(cnn(), tmp_path)
    path = tmp_path / "q.onnx"
    onnx.save_model(qdq, str(path))
    # the fake adds per-node costs: Q/DQ nodes cost time and nothing is faster in int8
    slow = int8_pays(
        path, FakeRuntime({"QuantizeLinear": 1e-3, "DequantizeLinear": 1e-3}), 0.1, AVX2
    )
    assert len(slow) == 1 and slow[0]["kind"] == "int8_does_not_pay"
    assert str(slow[0]["finding"]).startswith("int8 does not pay on this CPU: int8 ")
    assert "no VNNI" in str(slow[0]["why"])
    # a negative Q/DQ cost stands for int8 kernels that save more than the Q/DQ cost
    fast = FakeRuntime({"QuantizeLinear": -1e-3, "DequantizeLinear": -1e-3}, default=1e-2)
    assert int8_pays(path, fast, 0.1, AVX2) == []


def test_float_model_has_no_findings(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save_model(cnn(), str(path))
    assert quantized_findings(path) == []


@pytest.fixture
def qdq_path(tmp_path: Path) -> Path:
    path = tmp_path / "int8.onnx"
    onnx.save_model(quantize(cnn(channels=(20, 32), act="HardSwish"), tmp_path), str(path))
    return path


def test_advise_report_has_the_quantized_section(qdq_path: Path) -> None:
    opts = AdviseOptions(runs=2, warmup=1, compare_onnxruntime=False, next_steps=False)
    report = advise(qdq_path, options=opts)
    findings = report["quantized"]
    assert [f["kind"] for f in findings] == ["unfused_qdq", "channels"]  # type: ignore[union-attr, index]
    keys = {"kind", "finding", "why", "what_to_do", "nodes", "count", "cost_us"}
    assert all(set(f) == keys for f in findings)  # type: ignore[union-attr, arg-type]
    out = io.StringIO()
    render_text(report, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "====Quantized model (int8)====" in text
    assert "why it costs:" in text and "what to do:" in text
    page = render_html(report)
    assert '<h2 id="quantized">' in page and "Why it costs" in page
    assert html.escape(str(findings[0]["finding"])) in page.replace("<wbr>", "")  # type: ignore[index]


def test_advise_float_model_has_an_empty_section(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save_model(cnn(), str(path))
    opts = AdviseOptions(runs=2, warmup=1, compare_onnxruntime=False, next_steps=False)
    report = advise(path, options=opts)
    assert report["quantized"] == []
    out = io.StringIO()
    render_text(report, Console(file=out, width=200, color_system=None))
    assert "Quantized model" not in out.getvalue()
    assert 'id="quantized"' not in render_html(report)


def test_int8_does_not_pay_advice_follows_the_cpu(tmp_path: Path) -> None:
    path = tmp_path / "q.onnx"
    onnx.save_model(quantize(cnn(), tmp_path), str(path))
    costs = {"QuantizeLinear": 1e-3, "DequantizeLinear": 1e-3}
    without = int8_pays(path, FakeRuntime(costs), 0.1, AVX2)[0]
    with_vnni = int8_pays(path, FakeRuntime(costs), 0.1, AVX512_VNNI)[0]
    assert "needs a CPU with VNNI or AMX" in str(without["what_to_do"])
    assert "remove what eats the int8 kernels' gain" in str(with_vnni["what_to_do"])
    assert "has VNNI" in str(with_vnni["why"])


def test_float_twin_keeps_a_quantized_graph_output() -> None:
    """x -> Q -> DQ -> Relu -> Q -> y (an int8 output): the last Q stays."""
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="d"),
        helper.make_node("Relu", ["d"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"], name="qy"),
    ]
    graph = helper.make_graph(
        nodes,
        "int8_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    twin = dequantized_float(model)
    onnx.checker.check_model(twin)
    assert [n.op_type for n in twin.graph.node] == ["Relu", "QuantizeLinear"]
    x = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    assert run(twin, {"x": x}).tolist() == [128, 128, 133, 148]


def lines_of(report: dict[str, object]) -> str:
    out = io.StringIO()
    render_text(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_a_qdq_model_is_profiled_as_deployed(qdq_path: Path) -> None:
    """onnxruntime's QDQ fusion on: the groups are grown on its kernels (QLinearConv ...),
    the report says so, the quantized findings come first, and nothing says "quantize"."""
    opts = AdviseOptions(runs=2, warmup=1, next_steps=False)
    report = advise(qdq_path, options=opts)
    assert report["profile"]["graph_opt"] == "all"  # type: ignore[index]
    assert report["graph"]["quantized"] is True  # type: ignore[index]
    assert "deploys for this quantized (QDQ) model" in report["graph"]["analysed"]  # type: ignore[index]
    assert "QDQ fusion" in report["profile"]["notes"][0]  # type: ignore[index]
    types = {s["op_type"] for s in report["op_statistic"]}  # type: ignore[union-attr, index]
    assert "QLinearConv" in types and "Conv" not in types  # the convs run in int8
    # no group is a Conv with the Q/DQ onnxruntime folds into its QLinearConv
    for g in report["ub_fusion"]:  # type: ignore[union-attr]
        assert "Conv" not in g["op_types"]  # type: ignore[index]
    conv_groups = [g for g in report["ub_fusion"] if g["op_types"][0] == "QLinearConv"]  # type: ignore[union-attr, index]
    assert conv_groups and all(g["model_nodes"][0] for g in conv_groups)  # type: ignore[index]
    # every kernel maps back to the model's nodes, the inlined HardSwish body's kernels
    # (HardSigmoid_N, Mul_M in onnxruntime's graph) to the HardSwish node
    names = {n.name for n in onnx.load_model(str(qdq_path)).graph.node}
    for g in report["ub_fusion"]:  # type: ignore[union-attr]
        assert all(set(ran) <= names for ran in g["model_nodes"]), g["model_nodes"]  # type: ignore[index]
    assert any(["act1"] in g["model_nodes"] for g in report["ub_fusion"])  # type: ignore[union-attr, index]
    # the float islands' cost: the float ops and their Q/DQ, as profiled
    (unfused,) = [f for f in report["quantized"] if f["kind"] == "unfused_qdq"]  # type: ignore[union-attr, index]
    assert 0 < unfused["cost_us"] < report["profile"]["total_us"]  # type: ignore[index, operator]
    # the findings first: in the JSON, the text and the HTML
    keys = list(report)
    assert keys.index("quantized") < keys.index("next_steps")
    text = lines_of(report)
    assert text.index("====Quantized model (int8)====") < text.index("====Next steps====")
    page = render_html(report)
    assert page.index('id="quantized"') < page.index('id="steps"')
    for said in (text, page, str(report["next_steps"])):
        assert "quantize to int8" not in said


def test_qdq_fused_by_the_runtime_does_not_dominate(tmp_path: Path) -> None:
    """Every Q/DQ of this model fuses into an integer kernel: profiled as deployed, Q/DQ
    are not named as the ops that dominate (at --graph-opt disable they would be)."""
    path = tmp_path / "relu.int8.onnx"
    onnx.save_model(quantize(cnn(size=32), tmp_path), str(path))
    deployed = advise(path, options=AdviseOptions(runs=3, warmup=1, next_steps=False))
    shares = {s["op_type"]: s["share"] for s in deployed["op_statistic"]}  # type: ignore[union-attr, index]
    assert shares["QLinearConv"] > 0.5, shares
    named = {d["op_type"] for d in deployed["next_steps"]["dominant"]}  # type: ignore[index]
    assert not named & {"QuantizeLinear", "DequantizeLinear"}
    assert "unfused_qdq" not in {f["kind"] for f in deployed["quantized"]}  # type: ignore[union-attr, index]
    # the level asked for is kept, and the report says what it costs
    disabled = AdviseOptions(runs=2, warmup=1, next_steps=False, graph_opt="disable")
    report = advise(path, options=disabled)
    assert report["profile"]["graph_opt"] == "disable"  # type: ignore[index]
    assert "QDQ fusion is off" in report["profile"]["notes"][0]  # type: ignore[index]
    assert "Conv" in {s["op_type"] for s in report["op_statistic"]}  # type: ignore[union-attr, index]
    # there the Convs run in float on dequantized weights and dominate: still the model is
    # quantized, so the guide's "or quantize to int8" for a Conv is not given
    steps = report["next_steps"]["dominant"]  # type: ignore[index]
    assert "Conv" in {d["op_type"] for d in steps}
    assert not any("quantize to" in str(d["suggestion"]) for d in steps), steps


def test_a_float_model_is_still_profiled_node_by_node(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save_model(cnn(), str(path))
    report = advise(path, options=AdviseOptions(runs=2, warmup=1, next_steps=False))
    assert report["profile"]["graph_opt"] == "disable"  # type: ignore[index]
    assert report["graph"]["quantized"] is False  # type: ignore[index]
    assert "QDQ" not in " ".join(report["profile"]["notes"])  # type: ignore[index, arg-type]


def test_dominant_ops_of_a_quantized_model_get_no_quantize_advice() -> None:
    from opfuse.advisor.nextsteps import dominant

    stats = [
        {"op_type": "QLinearConv", "share": 0.5},
        {"op_type": "DequantizeLinear", "share": 0.2},
        {"op_type": "Gemm", "share": 0.15},
    ]
    float_advice = dominant(stats[2:])
    assert "quantize" in str(float_advice[0]["suggestion"])  # a float model: it is advice
    rows = dominant(stats, quantized=True)
    assert [r["op_type"] for r in rows] == ["QLinearConv", "DequantizeLinear", "Gemm"]
    assert not any("quantize to" in str(r["suggestion"]) for r in rows)
    assert "quantized findings" in str(rows[1]["suggestion"])
