"""Never break what the runtime fuses: the fused kernels onnxruntime makes from a model,
the comparison of original and output, and the default passes keeping a GELU whole where
GeluFusionPass cannot fire (convnext: opset 17, erf GELU between two MatMuls), GPT-2's tanh
GELU a FastGelu (its x^3 left a Pow), a dynamo export's SkipLayerNormalization (its shape
annotations kept); and the --benchmark guard naming what cost a lost kernel."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons
from opfuse.cli.benchmark import lost_causes
from opfuse.pipeline.conductor import optimize_file
from opfuse.runtime.fused import lost_fusions, lost_text, runtime_kernels
from transformer_models import dynamo_bert, gpt2_mlp

H = 16
rng = np.random.default_rng(0)
CONV_MUL = "ConvMulFusionPass"

# LayerNorm -> MatMul -> erf GELU (its 0.5 last, as torch exports it) -> MatMul
CONVNEXT_MLP = """
    <ir_version: 9, opset_import: ["" : OPSET]>
    g (float[1,4,{H}] x) => (float[1,4,{H}] y) {{
        n = LayerNormalization<axis = -1>(x, gamma, beta)
        h0 = MatMul(n, w1)
        h = Add(h0, b1)
        sqrt2 = Constant<value = float {{1.4142135}}>()
        one = Constant<value = float {{1.0}}>()
        half = Constant<value = float {{0.5}}>()
        a = Div(h, sqrt2)
        e = Erf(a)
        p = Add(e, one)
        m = Mul(h, p)
        g1 = Mul(m, half)
        y = MatMul(g1, w2)
    }}"""


def convnext_mlp(opset: int = 17) -> ir.Model:
    return model_from_text(
        CONVNEXT_MLP.replace("OPSET", str(opset)).format(H=H),
        {
            "gamma": rng.uniform(0.5, 1.5, H).astype(np.float32),
            "beta": rng.standard_normal(H).astype(np.float32),
            "w1": rng.standard_normal((H, H)).astype(np.float32),
            "b1": rng.standard_normal(H).astype(np.float32),
            "w2": rng.standard_normal((H, H)).astype(np.float32),
        },
    )


def test_mul_conv_keeps_the_half_of_a_gelu():
    optimized, result = check_rule(convnext_mlp(), CONV_MUL)
    assert effected(result, CONV_MUL, "mul_conv") == 0
    assert "the Mul is part of a GELU, which onnxruntime fuses into one kernel" in reasons(
        result, CONV_MUL
    )
    assert op_types(optimized)["Erf"] == 1 and op_types(optimized)["Mul"] == 2


def test_mul_conv_still_folds_a_plain_scale():
    text = f"""
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[1,4,{H}] x) => (float[1,4,{H}] y) {{
            half = Constant<value = float {{0.5}}>()
            s = Mul(x, half)
            y = MatMul(s, w)
        }}"""
    model = model_from_text(text, {"w": rng.standard_normal((H, H)).astype(np.float32)})
    optimized, result = check_rule(model, CONV_MUL)
    assert effected(result, CONV_MUL, "mul_conv") == 1
    assert op_types(optimized) == {"MatMul": 1}


def test_gelu_fusion_still_fires_at_opset_20():
    optimized, result = check_rule(convnext_mlp(20), CONV_MUL, "GeluFusionPass")
    assert op_types(optimized)["Gelu"] == 1
    assert "Erf" not in op_types(optimized)


def _save(model: ir.Model, path) -> str:
    ir.save(model, str(path))
    return str(path)


def test_default_optimize_keeps_every_gelu_onnxruntime_fuses(tmp_path):
    src = _save(convnext_mlp(), tmp_path / "mlp.onnx")
    dst = tmp_path / "mlp.opt.onnx"
    optimize_file(src, dst)
    before, after = runtime_kernels(src), runtime_kernels(dst)
    assert before["BiasGelu"] + before["Gelu"] == 1
    assert lost_fusions(before, after) == {}


def test_the_comparison_sees_a_lost_gelu(tmp_path):
    src = _save(convnext_mlp(), tmp_path / "mlp.onnx")
    dst = tmp_path / "broken.onnx"  # what the fold did before the guard: 0.5 in w2
    broken = convnext_mlp()
    half = next(n for n in broken.graph if n.op_type == "Mul" and n.outputs[0].name == "g1")
    mm = next(n for n in broken.graph if n.op_type == "MatMul" and n.outputs[0].name == "y")
    w2 = broken.graph.initializers["w2"]
    w2.const_value = ir.tensor(w2.const_value.numpy() * np.float32(0.5), name="w2")
    mm.replace_input_with(0, half.inputs[0])
    broken.graph.remove(half, safe=True)
    _save(broken, dst)
    lost = lost_fusions(runtime_kernels(src), runtime_kernels(dst))
    assert set(lost) == {"Gelu"}
    assert lost_text(lost) == "Gelu 1 -> 0"


@pytest.mark.parametrize(
    ("before", "after", "lost"),
    [
        ({"Gelu": 18}, {"Gelu": 18}, {}),
        ({"Gelu": 18, "FusedConv": 3}, {"FusedConv": 1}, {"FusedConv": (3, 1), "Gelu": (18, 0)}),
        ({"BiasGelu": 2}, {"Gelu": 2}, {}),  # the bias went elsewhere: still a Gelu kernel
        ({"LayerNormalization": 4}, {"SkipLayerNormalization": 4}, {}),
        ({}, {"FusedMatMul": 2}, {}),
        # the residual Add no longer fused: a LayerNormalization kernel still, but not Skip
        (
            {"SkipLayerNormalization": 8, "LayerNormalization": 1},
            {"LayerNormalization": 9},
            {"SkipLayerNormalization": (8, 0)},
        ),
        ({"SkipLayerNormalization": 2}, {}, {"LayerNormalization": (2, 0)}),
        ({"FastGelu": 4}, {}, {"Gelu": (4, 0)}),
        ({"Attention": 6}, {"QAttention": 6}, {}),  # its quantized form: still fused
        ({"Attention": 6}, {}, {"Attention": (6, 0)}),
    ],
)
def test_lost_fusions(before, after, lost):
    assert lost_fusions(Counter(before), Counter(after)) == lost


def test_summary_says_gelu_would_fire_at_a_higher_opset(tmp_path):
    import subprocess
    import sys

    note = "note: GeluFusionPass would fire at a higher opset: 1 match at --target-opset 20"
    for opset, expected in ((17, True), (20, False)):
        src = _save(convnext_mlp(opset), tmp_path / f"mlp{opset}.onnx")
        proc = subprocess.run(
            [sys.executable, "-m", "opfuse", "optimize", src, "-o", str(tmp_path / "o.onnx")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (note in proc.stdout.splitlines()) is expected


def test_opset_upgrades_match_without_changing_the_model():
    from opfuse.tuning.variants import opset_upgrades

    model = convnext_mlp(17)
    before = ir.to_proto(model).SerializeToString()
    assert opset_upgrades(model) == {"GeluFusionPass": (20, 1)}
    assert ir.to_proto(model).SerializeToString() == before
    assert opset_upgrades(convnext_mlp(20)) == {}  # Gelu runs there already


GELU_POW = "PowToMulInGeluFusionPass"


def _saved(proto, path) -> str:
    import onnx

    onnx.save_model(proto, str(path))
    return str(path)


def test_gpt2_gelu_keeps_fast_gelu_after_optimize(tmp_path):
    src = _saved(gpt2_mlp(blocks=2), tmp_path / "gpt2.onnx")
    dst = tmp_path / "gpt2.opt.onnx"
    result = optimize_file(src, dst)
    before, after = runtime_kernels(src), runtime_kernels(dst)
    assert before["FastGelu"] == after["FastGelu"] == 2
    assert lost_fusions(before, after) == {}
    assert effected(result, "PowToMulFusionPass") == 1  # the lone x^3 still became Muls
    assert effected(result, GELU_POW) == 0


def test_the_guard_names_the_gelu_pow_rewritten_and_the_option_keeping_fast_gelu(tmp_path):
    src = _saved(gpt2_mlp(blocks=2), tmp_path / "gpt2.onnx")
    dst = tmp_path / "gpt2.pow.onnx"
    result = optimize_file(src, dst, enable=[GELU_POW])
    before, after = runtime_kernels(src), runtime_kernels(dst)
    lost = lost_fusions(before, after)
    assert lost == {"Gelu": (2, 0)}
    fired = {name: result.log.effected(name) for name in result.passes}
    assert lost_causes(lost, before, after, (src, dst), fired) == [
        f"FastGelu 2 -> 0: {GELU_POW} rewrote the x^3 of 2 tanh GELUs into Muls, and "
        "onnxruntime fuses such a GELU into FastGelu only while x^3 is a Pow; --disable "
        f"{GELU_POW} keeps it"
    ]


def test_a_dynamo_export_keeps_skip_layer_normalization_after_optimize(tmp_path):
    src = _saved(dynamo_bert(), tmp_path / "bert.onnx")
    dst = tmp_path / "bert.opt.onnx"
    optimize_file(src, dst)
    before, after = runtime_kernels(src), runtime_kernels(dst)
    assert before["SkipLayerNormalization"] == after["SkipLayerNormalization"] == 4
    assert lost_fusions(before, after) == {}


def test_the_guard_names_the_value_info_dropped_and_the_option_keeping_skip_layer_norm(
    tmp_path,
):
    """What opfuse wrote before it kept value_info: onnxruntime cannot tell the residual
    Add's inputs have one shape (the Reshapes' sizes are computed), so no Skip kernel."""
    import onnx

    src = _saved(dynamo_bert(), tmp_path / "bert.onnx")
    dst = tmp_path / "bert.opt.onnx"
    optimize_file(src, dst)
    stripped = onnx.load_model(str(dst))
    del stripped.graph.value_info[:]
    dst = _saved(stripped, dst)
    before, after = runtime_kernels(src), runtime_kernels(dst)
    lost = lost_fusions(before, after)
    assert lost == {"SkipLayerNormalization": (4, 0)}
    (cause,) = lost_causes(lost, before, after, (src, dst), {})
    assert cause.startswith(
        "SkipLayerNormalization 4 -> 0: the output lacks the shape annotations (value_info) "
        "of 70 of the 70 values the original described"
    )
    assert cause.endswith("--static-shapes with --input-shape makes every shape known")
    out = tmp_path / "static.onnx"
    optimize_file(dst, out, static_shapes=True, input_shapes={"x": [1, 8, 32]})
    assert runtime_kernels(out)["SkipLayerNormalization"] == 4  # what the option says


def test_benchmark_warns_of_the_fast_gelu_lost_and_names_its_option(tmp_path):
    import subprocess
    import sys

    src = _saved(gpt2_mlp(), tmp_path / "gpt2.onnx")
    args = ["optimize", src, "-o", str(tmp_path / "o.onnx"), "--enable", GELU_POW]
    proc = subprocess.run(
        [sys.executable, "-m", "opfuse", *args, "--benchmark", "--bench-seconds", "0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())  # wrapped at the terminal's width
    assert "fuses fewer kernels from the output than from the original: Gelu 1 -> 0" in err
    assert f"FastGelu 1 -> 0: {GELU_POW} rewrote the x^3 of 1 tanh GELU into Muls" in err
    assert f"--disable {GELU_POW} keeps it" in err
