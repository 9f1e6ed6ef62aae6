"""LayerNormFusionPass, GeluFusionPass, RMSNormFusionPass: the written-out forms fold
into LayerNormalization / Gelu / RMSNormalization only at opsets that have them; the
forms they leave alone, with reasons; --target-opset converts first."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner

from helpers import (
    check_rule,
    effected,
    model_from_text,
    op_types,
    random_feeds,
    reasons,
    run_model,
    run_passes,
)
from opfuse.cli import app
from opfuse.errors import OpfuseError
from opfuse.rewrite.context import Options

LN, GELU, RMS = "LayerNormFusionPass", "GeluFusionPass", "RMSNormFusionPass"
rng = np.random.default_rng(0)
H = 8
NP_DTYPES = {"float": np.float32, "double": np.float64, "float16": np.float16}


def affine():
    return {
        "gamma": rng.uniform(0.5, 1.5, H).astype(np.float32),
        "beta": rng.standard_normal(H).astype(np.float32),
    }


def layer_norm(
    opset=17,
    square="q = Pow(d, two)",
    tail="y = Add(gm, beta)",
    axes="-1",
    mean_axes=None,
    dtype="float",
    keepdims=1,
):
    mean_axes = axes if mean_axes is None else mean_axes
    np_dtype = NP_DTYPES[dtype]
    inits = {k: v.astype(np_dtype) for k, v in affine().items() if k == "gamma" or k in tail}
    inits["eps"] = np.array(1e-5, np_dtype)
    if "two" in square:
        inits["two"] = np.array(2.0, np_dtype)
    if opset >= 18:
        reduce1 = f"mean = ReduceMean<keepdims={keepdims}>(x, ax1)"
        reduce2 = f"var = ReduceMean<keepdims={keepdims}>(q, ax2)"
    else:
        reduce1 = f"mean = ReduceMean<keepdims={keepdims}, axes=[{mean_axes}]>(x)"
        reduce2 = f"var = ReduceMean<keepdims={keepdims}, axes=[{axes}]>(q)"
    return model_from_text(
        f"""
        <ir_version: 9, opset_import: ["" : {opset}]>
        g ({dtype}[2,3,{H}] x) => ({dtype}[2,3,{H}] y) {{
          ax1 = Constant<value = int64[{mean_axes.count(",") + 1}] {{{mean_axes}}}>()
          ax2 = Constant<value = int64[{axes.count(",") + 1}] {{{axes}}}>()
          {reduce1}
          d = Sub(x, mean)
          {square}
          {reduce2}
          ve = Add(var, eps)
          s = Sqrt(ve)
          n = Div(d, s)
          gm = Mul(n, gamma)
          {tail}
        }}""",
        inits,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"opset": 18},
        {"square": "q = Mul(d, d)"},
        {"axes": "2", "mean_axes": "-1"},
        {"tail": "y = Identity(gm)"},
    ],
)
def test_layer_norm_fuses(kwargs):
    optimized, result = check_rule(layer_norm(**kwargs), LN)
    ops = op_types(optimized)
    assert ops["LayerNormalization"] == 1
    assert set(ops) <= {"LayerNormalization", "Identity"}
    assert effected(result, LN, "layer_norm") == 1
    assert effected(result, LN, "layer_norm_scale") == 1
    assert effected(result, LN, "layer_norm_bias") == (0 if "tail" in kwargs else 1)


def test_layer_norm_after_pow_to_mul():
    optimized, _ = check_rule(layer_norm(), LN, "PowToMulFusionPass")
    assert op_types(optimized) == {"LayerNormalization": 1}


def test_layer_norm_over_two_axes():
    optimized, result = check_rule(layer_norm(axes="-2, -1"), LN)
    assert op_types(optimized) == {"LayerNormalization": 1}
    norm = next(iter(optimized.graph))
    assert norm.attributes["axis"].value == -2


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"axes": "-1", "mean_axes": "-2, -1"}, "the two ReduceMeans reduce different axes"),
        ({"axes": "1", "mean_axes": "1"}, "ReduceMean does not reduce the trailing axes"),
        ({"dtype": "float16"}, "input is FLOAT16, not float32/float64"),
        (
            # a double stash_type has no function body in onnx: a runtime following the
            # spec would compute the statistics in float32, the chain computed them in double
            {"dtype": "double"},
            "input is DOUBLE: LayerNormalization would compute its statistics in float32 "
            "(its stash_type cannot be double)",
        ),
    ],
)
def test_layer_norm_not_fused(kwargs, reason):
    optimized, result = check_rule(layer_norm(**kwargs), LN)
    assert "LayerNormalization" not in op_types(optimized)
    assert reason in reasons(result, LN)


def test_layer_norm_needs_opset_17():
    model = layer_norm(opset=16)
    result = run_passes(model, LN)
    assert LN not in result.passes
    assert any("LayerNormFusionPass skipped: needs opset 17+" in w for w in result.warnings)
    assert "LayerNormalization" not in op_types(model)


def test_layer_norm_scale_varying_outside_normalized_dims_is_kept():
    # a [3, 1] multiplier varies along a non-normalized dim
    model = model_from_text(
        f"""
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[2,3,{H}] x) => (float[2,3,{H}] y) {{
          ax = Constant<value = int64[1] {{-1}}>()
          eps = Constant<value = float {{1e-5}}>()
          mean = ReduceMean<axes=[-1]>(x)
          d = Sub(x, mean)
          q = Mul(d, d)
          var = ReduceMean<axes=[-1]>(q)
          ve = Add(var, eps)
          s = Sqrt(ve)
          n = Div(d, s)
          y = Mul(n, g3)
        }}""",
        {"g3": rng.standard_normal((3, 1)).astype(np.float32)},
    )
    optimized, result = check_rule(model, LN)
    assert op_types(optimized) == {"LayerNormalization": 1, "Mul": 1}
    assert "the Mul constant varies outside the normalized dims" in reasons(result, LN)


def test_existing_layer_norm_with_a_scale_is_left_alone():
    model = model_from_text(
        f"""
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[2,{H}] x) => (float[2,{H}] y) {{
          n = LayerNormalization(x, gamma, beta)
          y = Mul(n, gamma)
        }}""",
        affine(),
    )
    optimized, result = check_rule(model, LN)
    assert op_types(optimized) == {"LayerNormalization": 1, "Mul": 1}
    assert "LayerNormalization already has a bias" in reasons(result, LN)


def rms_norm(opset=23, inverse="s = Sqrt(ve)\n n = Div(x, s)", dtype="float"):
    return model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : {opset}]>
        g ({dtype}[2,3,{H}] x) => ({dtype}[2,3,{H}] y) {{
          ax = Constant<value = int64[1] {{-1}}>()
          two = Constant<value = {dtype} {{2.0}}>()
          one = Constant<value = {dtype} {{1.0}}>()
          mhalf = Constant<value = {dtype} {{-0.5}}>()
          eps = Constant<value = {dtype} {{1e-6}}>()
          q = Pow(x, two)
          var = ReduceMean(q, ax)
          ve = Add(var, eps)
          {inverse}
          y = Mul(gamma, n)
        }}""",
        {"gamma": affine()["gamma"].astype(NP_DTYPES[dtype])},
    )


@pytest.mark.parametrize(
    "inverse",
    [
        "s = Sqrt(ve)\n n = Div(x, s)",
        "s = Sqrt(ve)\n r = Reciprocal(s)\n n = Mul(x, r)",
        "s = Sqrt(ve)\n r = Div(one, s)\n n = Mul(r, x)",
        "r = Pow(ve, mhalf)\n n = Mul(x, r)",
    ],
)
def test_rms_norm_fuses(inverse):
    optimized, result = check_rule(rms_norm(inverse=inverse), RMS)
    assert op_types(optimized) == {"RMSNormalization": 1}
    assert effected(result, RMS, "rms_norm") == 1
    assert effected(result, RMS, "rms_norm_scale") == 1


def test_rms_norm_needs_opset_23():
    model = rms_norm(opset=22)
    result = run_passes(model, RMS)
    assert RMS not in result.passes
    assert "RMSNormalization" not in op_types(model)


def test_rms_norm_with_non_constant_epsilon_is_not_fused():
    model = model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : 23]>
        g (float[2,{H}] x, float eps) => (float[2,{H}] y) {{
          ax = Constant<value = int64[1] {{-1}}>()
          q = Mul(x, x)
          var = ReduceMean(q, ax)
          ve = Add(var, eps)
          s = Sqrt(ve)
          y = Div(x, s)
        }}"""
    )
    result = run_passes(model, RMS)
    assert "eps is not a constant" in reasons(result, RMS)


GELU_ERF = """
          sqrt2 = Constant<value = float {1.4142135}>()
          one = Constant<value = float {1.0}>()
          half = Constant<value = float {0.5}>()
          a = Div(x, sqrt2)
          e = Erf(a)
          p = Add(e, one)
          PRODUCT"""
GELU_TANH = """
          c1 = Constant<value = float {0.7978846}>()
          c2 = Constant<value = float {0.044715}>()
          three = Constant<value = float {3.0}>()
          one = Constant<value = float {1.0}>()
          half = Constant<value = float {0.5}>()
          CUBE
          t = Mul(cube, c2)
          u = Add(x, t)
          v = Mul(c1, u)
          e = Tanh(v)
          p = Add(one, e)
          PRODUCT"""


def gelu(body, opset=20, dtype="float"):
    return model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : {opset}]>
        g ({dtype}[2,{H}] x) => ({dtype}[2,{H}] y) {{{body}
        }}"""
    )


PRODUCTS = [
    "m = Mul(x, p)\n y = Mul(m, half)",  # bert_small's order
    "m = Mul(x, half)\n y = Mul(m, p)",
    "m = Mul(half, p)\n y = Mul(x, m)",
]


@pytest.mark.parametrize("product", PRODUCTS)
def test_gelu_erf_fuses(product):
    optimized, result = check_rule(gelu(GELU_ERF.replace("PRODUCT", product)), GELU)
    assert op_types(optimized) == {"Gelu": 1}
    assert effected(result, GELU, "gelu") == 1
    node = next(iter(optimized.graph))
    assert node.attributes["approximate"].value == "none"


@pytest.mark.parametrize(
    "cube",
    [
        "cube = Pow(x, three)",
        "sq = Mul(x, x)\n cube = Mul(sq, x)",
        "sq = Mul(x, x)\n cube = Mul(x, sq)",
    ],
)
@pytest.mark.parametrize("product", PRODUCTS[:2])
def test_gelu_tanh_fuses(cube, product):
    optimized, result = check_rule(
        gelu(GELU_TANH.replace("CUBE", cube).replace("PRODUCT", product)), GELU
    )
    assert op_types(optimized) == {"Gelu": 1}
    node = next(iter(optimized.graph))
    assert node.attributes["approximate"].value == "tanh"


def test_gelu_with_other_constants_is_not_fused():
    body = GELU_ERF.replace("1.4142135", "1.5").replace("PRODUCT", PRODUCTS[0])
    optimized, result = check_rule(gelu(body), GELU)
    assert "Gelu" not in op_types(optimized)
    assert effected(result, GELU) == 0


def test_gelu_with_shared_intermediate_is_not_fused():
    model = model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : 20]>
        g (float[2,{H}] x) => (float[2,{H}] y, float[2,{H}] e) {{{GELU_ERF.replace("PRODUCT", PRODUCTS[0])}
        }}"""
    )
    optimized, result = check_rule(model, GELU)
    assert "Gelu" not in op_types(optimized)
    assert any("graph output" in r for r in reasons(result, GELU))


def test_gelu_needs_opset_20_and_target_opset_converts():
    model = gelu(GELU_ERF.replace("PRODUCT", PRODUCTS[0]), opset=17)
    result = run_passes(model, GELU)
    assert GELU not in result.passes and "Erf" in op_types(model)
    assert model.opset_imports[""] == 17
    optimized, result = check_rule(model, GELU, options=Options(target_opset=20))
    assert result.model.opset_imports[""] == 20
    assert op_types(result.model) == {"Gelu": 1}


def test_target_opset_never_lowers_and_same_opset_is_kept():
    model = gelu(GELU_ERF.replace("PRODUCT", PRODUCTS[0]), opset=20)
    with pytest.raises(OpfuseError, match="lower than the model's opset 20"):
        run_passes(model, GELU, options=Options(target_opset=17))
    result = run_passes(model, GELU, options=Options(target_opset=20))
    assert result.model is model and model.opset_imports[""] == 20


def test_cli_target_opset_converts_fuses_and_verifies(tmp_path):
    model = gelu(GELU_ERF.replace("PRODUCT", PRODUCTS[0]), opset=17)
    src, dst = tmp_path / "gelu17.onnx", tmp_path / "out.onnx"
    ir.save(model, src)
    runner = CliRunner()
    plain = runner.invoke(app, ["optimize", str(src), "-o", str(dst)])
    assert plain.exit_code == 0, plain.output
    assert "Gelu" not in op_types(ir.load(dst)) and ir.load(dst).opset_imports[""] == 17
    converted = runner.invoke(app, ["optimize", str(src), "-o", str(dst), "--target-opset", "20"])
    assert converted.exit_code == 0, converted.output
    assert "verification: ok" in converted.output
    out = ir.load(dst)
    assert out.opset_imports[""] == 20 and op_types(out) == {"Gelu": 1}


def test_gelu_with_a_broadcasting_constant_is_not_fused():
    body = GELU_ERF.replace("PRODUCT", PRODUCTS[0]).replace(
        "half = Constant<value = float {0.5}>()", "half = Constant<value = float[1,1,1] {0.5}>()"
    )
    model = model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : 20]>
        g (float[2,{H}] x) => (float[1,2,{H}] y) {{{body}
        }}"""
    )
    optimized, result = check_rule(model, GELU)
    assert "Gelu" not in op_types(optimized)
    assert "a constant's rank may broadcast the output" in reasons(result, GELU)


def test_layer_norm_with_a_vector_epsilon_is_not_fused():
    model = layer_norm()
    model.graph.initializers["eps"].const_value = ir.tensor(
        np.full(H, 1e-5, np.float32), name="eps"
    )
    optimized, result = check_rule(model, LN)
    assert "LayerNormalization" not in op_types(optimized)
    assert "epsilon is not a scalar" in reasons(result, LN)


def rms_custom(header: str, reduce: str, dims: str = f"2,3,{H}"):
    return model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : 23]>
        g ({header}) => (float[{dims}] y) {{
          eps = Constant<value = float {{1e-6}}>()
          q = Mul(x, x)
          {reduce}
          ve = Add(var, eps)
          s = Sqrt(ve)
          y = Div(x, s)
        }}"""
    )


@pytest.mark.parametrize(
    "header,reduce,dims,reason",
    [
        (
            "float[3,3,3] x",
            "ax = Constant<value = int64[1] {-1}>()\n var = ReduceMean<keepdims=0>(q, ax)",
            "3,3,3",
            "ReduceMean drops the reduced axes (keepdims=0)",
        ),
        (
            f"float[2,3,{H}] x, int64[1] ax",
            "var = ReduceMean(q, ax)",
            f"2,3,{H}",
            "ReduceMean axes are not constant",
        ),
        (
            "float[2,3,N] x",
            "ax = Constant<value = int64[1] {-1}>()\n var = ReduceMean(q, ax)",
            "2,3,N",
            "normalized dims are not static",
        ),
    ],
)
def test_rms_norm_not_fused(header, reduce, dims, reason):
    model = rms_custom(header, reduce, dims)
    result = run_passes(model, RMS)
    assert "RMSNormalization" not in op_types(model)
    assert reason in reasons(result, RMS)


@pytest.mark.parametrize(
    "body,outputs,reason",
    [
        (
            "n, mean, inv = LayerNormalization(x, ones)\n y = Mul(n, gamma)",
            ", float[2,1] mean",
            "LayerNormalization '' output is a graph output",
        ),
        (
            "n = LayerNormalization(x, gamma)\n y = Mul(n, gamma)",
            "",
            "LayerNormalization scale is not all ones",
        ),
    ],
)
def test_layer_norm_scale_not_folded(body, outputs, reason):
    model = model_from_text(
        f"""
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[2,{H}] x) => (float[2,{H}] y{outputs}) {{
          {body}
        }}""",
        {"gamma": affine()["gamma"]} | ({"ones": np.ones(H, np.float32)} if "ones" in body else {}),
    )
    optimized, result = check_rule(model, LN)
    assert op_types(optimized)["Mul"] == 1
    assert reason in reasons(result, LN)


@pytest.mark.parametrize(
    "pass_name,tail,op,root",
    [
        (LN, "y = Mul(n, g3)", "LayerNormalization", "Mul"),
        (LN, "gm = Mul(n, gamma)\n y = Add(gm, g3)", "LayerNormalization", "Add"),
        (RMS, "y = Mul(n, g3)", "RMSNormalization", "Mul"),
    ],
)
def test_norm_affine_constant_that_raises_the_rank_is_kept(pass_name, tail, op, root):
    # x is [4, H]; a [1, 1, H] constant broadcasts the output up to [1, 4, H]: folded
    # into the norm (whose output has x's shape) it would drop that leading dim
    num = "d" if pass_name == LN else "x"
    centered = "mean = ReduceMean(x, ax)\n d = Sub(x, mean)" if pass_name == LN else ""
    inits = {"g3": rng.standard_normal((1, 1, H)).astype(np.float32)}
    if "gamma" in tail:
        inits["gamma"] = affine()["gamma"]
    model = model_from_text(
        f"""
        <ir_version: 10, opset_import: ["" : 23]>
        g (float[4,{H}] x) => (float[1,4,{H}] y) {{
          ax = Constant<value = int64[1] {{-1}}>()
          eps = Constant<value = float {{1e-5}}>()
          {centered}
          q = Mul({num}, {num})
          var = ReduceMean(q, ax)
          ve = Add(var, eps)
          s = Sqrt(ve)
          n = Div({num}, s)
          {tail}
        }}""",
        inits,
    )
    optimized, result = check_rule(model, pass_name)
    ops = op_types(optimized)
    assert ops[op] == 1 and ops[root] == 1
    assert f"the {root} constant has a higher rank than the {op} input" in " ".join(
        reasons(result, pass_name)
    )


def spec_expanded(model: ir.Model) -> ir.Model:
    """The model with each LayerNormalization/RMSNormalization replaced by the function
    body the ONNX spec defines it by, where stash_type sets the statistics' precision
    (onnxruntime's CPU kernels compute a double input in double whatever it says)."""
    proto = ir.to_proto(model)
    opset = model.opset_imports[""]
    values = {v.name: v for n in model.graph for v in n.inputs if v is not None}
    nodes = []
    for k, node in enumerate(proto.graph.node):
        if node.op_type not in ("LayerNormalization", "RMSNormalization"):
            nodes.append(node)
            continue
        types = [
            onnx.helper.make_tensor_type_proto(int(values[n].dtype), None).SerializeToString()
            for n in node.input
        ]
        schema = onnx.defs.get_schema(node.op_type, opset)
        body = onnx.FunctionProto()
        body.ParseFromString(
            schema.get_context_dependent_function_with_opset_version(
                opset, node.SerializeToString(), types
            )
        )
        rename = {
            f: (node.input[i] if i < len(node.input) else "") for i, f in enumerate(body.input)
        }
        rename |= {
            f: (node.output[i] if i < len(node.output) else f"{k}_{f}")
            for i, f in enumerate(body.output)
        }
        for inner in body.node:
            inner.input[:] = [rename.get(n, f"{k}_{n}") if n else "" for n in inner.input]
            inner.output[:] = [rename.get(n, f"{k}_{n}") for n in inner.output]
            nodes.append(inner)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return ir.from_proto(proto)


def test_float64_rms_norm_computes_its_statistics_in_float64():
    # stash_type 1 (the default) would make a runtime that follows the spec compute the
    # statistics of a double input in float32 (~1e-7 off); the double chain is ~1e-16
    model = rms_norm(dtype="double")
    feeds = random_feeds(model)
    optimized, result = check_rule(model, RMS, feeds=feeds)
    (norm,) = list(optimized.graph)
    assert norm.attributes["stash_type"].value == ir.DataType.DOUBLE
    ref, got = run_model(model, feeds)["y"], run_model(spec_expanded(optimized), feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_float32_norm_keeps_the_default_stash_type():
    # also checks spec_expanded: the spec's body of the fused op computes the chain
    model = layer_norm()
    optimized, _ = check_rule(model, LN)
    (norm,) = list(optimized.graph)
    assert norm.attributes.get("stash_type") is None
    feeds = random_feeds(model)
    ref, got = run_model(model, feeds)["y"], run_model(spec_expanded(optimized), feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
