"""onnxruntime's own fusions kept in the int8 model (issue 42, item 2): on a built BERT
layer whose float model onnxruntime fuses into SkipLayerNormalization, BiasGelu and
FusedMatMul kernels, dynamic int8 keeps every one of them and static QDQ loses them, as
read from the graph onnxruntime saves at ORT_ENABLE_ALL, and the quantize report says so
(text and JSON)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.model.sessions import open_session
from opfuse.quantization import flow
from opfuse.quantization.conductor import quantize_file
from opfuse.quantization.kept_fusions import KeptFusions
from opfuse.runtime.fused import runtime_kernels

HIDDEN, HEADS, FF, TOKENS = 32, 2, 64, 8
# what onnxruntime fuses the float layer into (its saved graph, ORT_ENABLE_ALL)
FLOAT_KERNELS = {"BiasGelu": 1, "FusedMatMul": 1, "SkipLayerNormalization": 2}
STATIC_LOST = {"FusedMatMul": (1, 0), "Gelu": (1, 0), "SkipLayerNormalization": (2, 0)}


def bert_layer(path):  # type: ignore[no-untyped-def]
    """One post-LN BERT encoder layer as torch.onnx.export writes it at opset 17 (the
    additive mask from attention_mask, Q/K/V MatMul + Add, heads by Reshape/Transpose,
    Q.K^T / sqrt(d), Softmax, the output projection and residual into LayerNormalization,
    an Erf GELU MLP), with its shapes inferred (onnxruntime fuses an Add into the
    normalization only where it knows both shapes)."""
    rng = np.random.default_rng(0)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: object) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def linear(x: str, p: str, k: int, m: int) -> str:
        w = const(p + ".w", rng.normal(0, 0.2, (k, m)).astype(np.float32))
        b = const(p + ".b", rng.normal(0, 0.1, m).astype(np.float32))
        return node("Add", [node("MatMul", [x, w], p + "_mm"), b], p)

    def norm(x: str, out: str) -> str:
        scale = const(out + ".g", rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32))
        bias = const(out + ".b", rng.normal(0, 0.1, HIDDEN).astype(np.float32))
        return node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=1e-12)

    const("split", np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64))
    mask = node("Unsqueeze", ["attention_mask", const("ax1", np.array([1], np.int64))], "m1")
    mask = node("Unsqueeze", [mask, const("ax2", np.array([2], np.int64))], "m2")
    mask = node("Cast", [mask], "m3", to=TensorProto.FLOAT)
    mask = node("Sub", [const("one", np.float32(1)), mask], "m4")
    mask = node("Mul", [mask, const("big", np.float32(-10000))], "m5")
    heads = {}
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        split = node("Reshape", [linear("x", p, HIDDEN, HIDDEN), "split"], p + "_r")
        heads[p] = node("Transpose", [split], p + "_t", perm=perm)
    scores = node("MatMul", [heads["q"], heads["k"]], "qk")
    scores = node("Div", [scores, const("scale", np.float32(np.sqrt(HIDDEN // HEADS)))], "qk_s")
    probs = node("Softmax", [node("Add", [scores, mask], "scores")], "probs", axis=-1)
    ctx = node("Transpose", [node("MatMul", [probs, heads["v"]], "pv")], "ctx_t", perm=[0, 2, 1, 3])
    ctx = node("Reshape", [ctx, const("merge", np.array([0, 0, HIDDEN], np.int64))], "ctx")
    a = norm(node("Add", [linear(ctx, "o", HIDDEN, HIDDEN), "x"], "res1"), "ln1")
    f = linear(a, "ff1", HIDDEN, FF)
    erf = node("Erf", [node("Div", [f, const("sqrt2", np.float32(1.4142135))], "g1")], "g2")
    gelu = node("Mul", [f, node("Add", [erf, const("one_g", np.float32(1))], "g3")], "g4")
    gelu = node("Mul", [gelu, const("half", np.float32(0.5))], "gelu")
    norm(node("Add", [linear(gelu, "ff2", FF, HIDDEN), a], "res2"), "last_hidden_state")
    graph = helper.make_graph(
        nodes,
        "bert_layer",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", HIDDEN]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "T"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["N", "T", HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(onnx.shape_inference.infer_shapes(model, strict_mode=True), str(path))
    return path


@pytest.fixture(scope="module")
def layer(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The layer, 16 calibration and 12 evaluation samples (a third with padding)."""
    tmp = tmp_path_factory.mktemp("layer")
    bert_layer(tmp / "layer.onnx")
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (28, TOKENS, HIDDEN)).astype(np.float32)
    mask = np.ones((28, TOKENS), np.int64)
    mask[::3, TOKENS - 2 :] = 0
    np.savez(tmp / "c.npz", x=x[:16], attention_mask=mask[:16])
    np.savez(tmp / "e.npz", x=x[16:], attention_mask=mask[16:])
    return tmp


def _run(path, feed):  # type: ignore[no-untyped-def]
    return open_session(path, graph_opt="disable").run(None, feed)[0]


def test_the_layer_is_fused_exactly_in_float_and_onnxruntime_fuses_it(layer):
    """The premise: opfuse's float fusion (quantize's step 3) changes no output beyond
    1e-5 (onnxruntime with its optimizations off), and onnxruntime fuses the float
    model's residual LayerNorms, its GELU with the bias and its scaled Q.K^T."""
    fused = layer / "fused.onnx"
    flow.fuse(layer / "layer.onnx", fused)
    data = np.load(layer / "e.npz")
    for i in range(3):
        feed = {"x": data["x"][i : i + 1], "attention_mask": data["attention_mask"][i : i + 1]}
        want, got = _run(layer / "layer.onnx", feed), _run(fused, feed)
        assert np.abs(got - want).max() <= 1e-5
    assert dict(runtime_kernels(fused)) == FLOAT_KERNELS


def _quantized(layer, recipe):  # type: ignore[no-untyped-def]
    return quantize_file(
        layer / "layer.onnx",
        None,
        layer / "c.npz",
        eval=layer / "e.npz",
        recipe=recipe,
        benchmark=False,
        max_drop="off",
    )


def test_dynamic_int8_keeps_every_fusion_of_the_runtime(layer):
    """``minmax,dynamic``: the Q/K/V projections MatMulIntegerToFloat, the others
    DynamicQuantizeMatMul, and still the two SkipLayerNormalization, the Gelu (its bias
    now in the int8 MatMul) and the FusedMatMul of Q.K^T in onnxruntime's saved graph;
    the report says every fusion kept; the embeddings within cosine 0.99 of float."""
    result = _quantized(layer, "minmax,dynamic")
    onnx.save(result.model, str(layer / "dynamic.onnx"))
    saved = layer / "dynamic.ran.onnx"
    open_session(layer / "dynamic.onnx", graph_opt="all", optimized_path=saved)
    ran = Counter(n.op_type for n in onnx.load(str(saved)).graph.node)
    assert ran["DynamicQuantizeMatMul"] == 3 and ran["MatMulIntegerToFloat"] == 3
    kernels = {"FusedMatMul": 1, "Gelu": 1, "SkipLayerNormalization": 2}
    assert {k: ran[k] for k in [*kernels, "BiasGelu", "LayerNormalization"]} == {
        **kernels,
        "BiasGelu": 0,
        "LayerNormalization": 0,
    }
    assert result.fusions is not None
    assert result.fusions.float_kernels == FLOAT_KERNELS
    assert result.fusions.int8_kernels == kernels and result.fusions.lost == {}
    line = next(x for x in result.lines() if x.startswith("onnxruntime's fused kernels"))
    assert line.endswith(
        "float optimized -> int8: BiasGelu 1 -> 0, FusedMatMul 1 -> 1, Gelu 0 -> 1, "
        "SkipLayerNormalization 2 -> 2; every fusion kept"
    )
    assert result.to_json()["runtime_fusions"]["lost"] == {}
    [figures] = result.accuracy
    assert figures.embedding_cosine is not None and figures.embedding_cosine > 0.99


def test_static_qdq_loses_them_and_the_report_names_each(layer):
    """``--recipe minmax`` (static QDQ), on the command line: the residual Add becomes a
    QLinearAdd before a plain LayerNormalization, the GELU's Erf and Muls are requantized,
    Q.K^T a QLinearMatMul; the text and the JSON report name the three lost kinds."""
    report = layer / "static.json"
    args = ["quantize", str(layer / "layer.onnx"), "-o", str(layer / "static.onnx")]
    args += ["--calibration", str(layer / "c.npz"), "--eval", str(layer / "e.npz")]
    args += ["--recipe", "minmax", "--max-drop", "off", "--no-benchmark", "--report", str(report)]
    done = subprocess.run(
        [sys.executable, "-m", "opfuse", *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (
        "float optimized -> int8: BiasGelu 1 -> 0, FusedMatMul 1 -> 0, LayerNormalization 0 -> 2, "
        "SkipLayerNormalization 2 -> 0; lost: FusedMatMul 1 -> 0, Gelu 1 -> 0, "
        "SkipLayerNormalization 2 -> 0"
    ) in done.stdout
    fusions = json.loads(report.read_text())["runtime_fusions"]
    assert fusions["float_optimized"] == FLOAT_KERNELS
    assert {k: tuple(v) for k, v in fusions["lost"].items()} == STATIC_LOST
    ran = runtime_kernels(layer / "static.onnx")
    assert ran["SkipLayerNormalization"] == 0 and ran["Gelu"] == 0 and ran["FusedMatMul"] == 0


def test_a_quantized_form_of_a_fused_kernel_keeps_it_and_no_kernels_make_no_line():
    """QAttention keeps an Attention (onnxruntime's transformers optimizer, then dynamic
    int8); a model with no fused kernel on either side has nothing to say, not 'every
    fusion kept'."""
    from opfuse.runtime.fused import lost_fusions

    before, after = Counter({"Attention": 6}), Counter({"QAttention": 6})
    kept = KeptFusions(dict(before), dict(after), lost_fusions(before, after))
    assert kept.describe().endswith("Attention 6 -> 0, QAttention 0 -> 6; every fusion kept")
    lost = KeptFusions({"Attention": 6}, {}, lost_fusions(before, Counter()))
    assert lost.describe().endswith("; lost: Attention 6 -> 0")
    assert KeptFusions({}, {}, {}).describe() == ""  # no line in the summary


def test_lost_fusions_are_a_cause_of_slow_int8_with_dynamic_suggested_where_static():
    """When int8 does not pay, the lost kernels are named as a measured cause, with
    ``--recipe dynamic`` where a static recipe lost a transformer's kernels (not where
    dynamic was the recipe, nor for a CNN's FusedConv)."""
    from test_pipeline import measured

    from opfuse.quantization.gate import Gate
    from opfuse.quantization.result import QuantizeResult
    from opfuse.runtime.cpu import CpuFeatures

    def verdict(recipe: str, lost: dict[str, tuple[int, int]]) -> str:
        result = QuantizeResult(None, [], Gate(), 8, 4, "samples")  # type: ignore[arg-type]
        result.speed, result.cpu = (
            measured(20.0, 18.0, 25.0),
            CpuFeatures(frozenset({"avx512_vnni"})),
        )
        result.recipe, result.fusions = recipe, KeptFusions({}, {}, lost)
        return result.speed_verdict()

    text = verdict("minmax", STATIC_LOST)
    assert (
        "onnxruntime fuses fewer kernels from the int8 model than from the float optimized one "
        "(FusedMatMul 1 -> 0, Gelu 1 -> 0, SkipLayerNormalization 2 -> 0): the ops they held "
        "run one by one. On a transformer, --recipe dynamic keeps them."
    ) in text
    assert "--recipe dynamic" not in verdict("minmax,dynamic", {"Gelu": (1, 0)})
    assert "--recipe dynamic" not in verdict("minmax", {"FusedConv": (3, 0)})
    assert "fuses fewer kernels" not in verdict("minmax", {})
