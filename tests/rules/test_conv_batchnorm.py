"""ConvBatchNormFusionPass: positive (plain, depthwise, grouped, transposed, no bias),
negative (training mode, second consumer, graph output, non-constant parameters),
numeric against onnxruntime, idempotent."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import check_rule, copy_model, effected, model_from_text, op_types, reasons, run_passes

PASS = "ConvBatchNormFusionPass"
rng = np.random.default_rng(0)


def bn_params(c: int) -> dict[str, np.ndarray]:
    return {
        "scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "bias": rng.standard_normal(c).astype(np.float32),
        "mean": rng.standard_normal(c).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, c).astype(np.float32),
    }


def conv_bn(op="Conv", group=1, bias=True, extra="", cin=4, cout=8, bn_attrs="") -> object:
    w_shape = (cout, cin // group, 3, 3) if op == "Conv" else (cin, cout // group, 3, 3)
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32), **bn_params(cout)}
    if bias:
        inits["b"] = rng.standard_normal(cout).astype(np.float32)
    conv_in = "x, w, b" if bias else "x, w"
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,{cin},6,6] x) => (float[1,{cout},?,?] y{", float[1," + str(cout) + ",?,?] c" if "out" in extra else ""}) {{
      c = {op}<group={group}, pads=[1,1,1,1]>({conv_in})
      y = BatchNormalization{bn_attrs}(c, scale, bias, mean, var)
      {"z = Relu(c)" if "consumer" in extra else ""}
    }}"""
    if "consumer" in extra:
        text = text.replace("=> (float", "=> (float[1," + str(cout) + ",?,?] z, float")
    return model_from_text(text, inits)


@pytest.mark.parametrize(
    "op,group,bias,cin,cout",
    [
        ("Conv", 1, True, 4, 8),
        ("Conv", 1, False, 4, 8),
        ("Conv", 4, True, 4, 4),  # depthwise
        ("Conv", 2, True, 4, 8),  # grouped
        ("ConvTranspose", 1, True, 4, 8),
        ("ConvTranspose", 2, False, 4, 8),
    ],
)
def test_folds_bn_into_conv(op, group, bias, cin, cout):
    model = conv_bn(op, group, bias, cin=cin, cout=cout)
    optimized, result = check_rule(model, PASS)
    assert op_types(optimized) == {op: 1}
    assert effected(result, PASS, "conv_bn") == 1
    assert optimized.graph.node(0).name == model.graph.node(0).name  # the conv keeps its name


def test_training_mode_is_not_folded():
    model = conv_bn(bn_attrs="<training_mode=0>")
    optimized, _ = check_rule(model, PASS)
    assert "BatchNormalization" not in op_types(optimized)
    model = conv_bn()
    model.graph.node(1).attributes["training_mode"] = __import__("onnx_ir").AttrInt64(
        "training_mode", 1
    )
    result = run_passes(copy_model(model), PASS)
    assert effected(result, PASS) == 0
    assert "BatchNormalization is in training mode" in reasons(result, PASS)


def test_conv_output_with_second_consumer_is_not_folded():
    model = conv_bn(extra="consumer")
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert op_types(model)["BatchNormalization"] == 1
    assert any("another consumer" in r for r in reasons(result, PASS))


def test_conv_output_that_is_a_graph_output_is_not_folded():
    model = conv_bn(extra="out")
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert any("graph output" in r for r in reasons(result, PASS))


def test_non_constant_bn_parameters_are_not_folded():
    inits = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32)}
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,6,6] x, float[8] scale, float[8] bias, float[8] mean, float[8] var)
          => (float[1,8,?,?] y) {
          c = Conv<pads=[1,1,1,1]>(x, w)
          y = BatchNormalization(c, scale, bias, mean, var)
        }""",
        inits,
    )
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0
    assert "scale is not a constant" in reasons(result, PASS)


def test_channel_mismatch_is_not_folded():
    model = conv_bn()
    # a BN whose parameters have the wrong length cannot belong to this conv
    for name in ("scale", "bias", "mean", "var"):
        model.graph.initializers[name].const_value = __import__("onnx_ir").tensor(
            np.ones(1, np.float32), name=name
        )
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0


def _run_ort_all(model, feeds) -> list[np.ndarray]:
    """Outputs under onnxruntime's default optimizations (it folds BN itself)."""
    import onnx_ir as ir
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    data = ir.to_proto(model).SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("bias", [True, False])
def test_float32_fold_is_bit_identical_to_onnxruntimes_own(bias):
    """onnxruntime folds Conv+BN at load time in float32, step by step; opfuse folds with
    the same steps, so both models give the same bits under ORT_ENABLE_ALL."""
    model = conv_bn(bias=bias, cin=16, cout=64)
    optimized, _ = check_rule(model, PASS)
    feeds = {"x": rng.standard_normal((1, 16, 6, 6)).astype(np.float32)}
    for want, got in zip(_run_ort_all(model, feeds), _run_ort_all(optimized, feeds), strict=True):
        assert np.array_equal(want, got)
    # not vacuous: the float64 fold (rounded once) gives other weight bits
    p = {k: model.graph.initializers[k].const_value.numpy() for k in ("w", "scale", "var")}
    s64 = p["scale"].astype(np.float64) / np.sqrt(p["var"].astype(np.float64) + 1e-5)
    w64 = (p["w"] * s64.reshape(-1, 1, 1, 1)).astype(np.float32)
    folded = next(v for v in optimized.graph.initializers.values() if v.name.endswith("weight_bn"))
    assert not np.array_equal(folded.const_value.numpy(), w64)
