"""ConstantFoldingFusionPass: constant nodes, all-constant nodes (onnx reference evaluator),
shape arithmetic on static dims and the Reshape shape chains; what it never folds, with
its reasons; the size limit; a quantized model that must not grow."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes
from opfuse.pipeline.conductor import optimize_file
from opfuse.rewrite.context import Options

PASS = "ConstantFoldingFusionPass"
HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def model(body, inputs="float[2,3] x", outputs="float[2,3] y", inits=None, head=HEAD):
    return model_from_text(f"{head}\ng ({inputs}) => ({outputs}) {{\n{body}\n}}", inits)


def test_constant_node_becomes_initializer():
    m = model("c = Constant<value=float[3] {1,2,3}>()\n y = Add(x, c)")
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Add": 1}
    assert effected(result, PASS, "constant_node") == 1
    assert len(optimized.graph.initializers) == 1


@pytest.mark.parametrize(
    "constant",
    ["value_floats=[1.0, 2.0, 3.0]", "value_float=2.5", "value=float[3] {1,2,3}"],
)
def test_every_constant_form_becomes_an_initializer_of_the_same_value(constant):
    m = model(f"c = Constant<{constant}>()\n y = Add(x, c)")
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Add": 1}
    (init,) = optimized.graph.initializers.values()
    expected = {"value_float=2.5": [2.5]}.get(constant, [1.0, 2.0, 3.0])
    assert init.const_value is not None
    np.testing.assert_array_equal(init.const_value.numpy().reshape(-1), expected)
    assert init.const_value.name == init.name


def test_constant_graph_output_stays_a_node():
    m = model("y = Constant<value=float[2,3] {1,2,3,4,5,6}>()")
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Constant": 1}
    assert effected(result, PASS) == 0


def test_folds_chain_of_constant_nodes():
    m = model(
        "c = Constant<value=float[3] {1,4,9}>()\n r = Sqrt(c)\n n = Neg(r)\n"
        " k = Constant<value=int64[1] {0}>()\n u = Unsqueeze(n, k)\n y = Add(x, u)"
    )
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Add": 1}
    assert effected(result, PASS, "fold") == 3
    (init,) = optimized.graph.initializers.values()
    np.testing.assert_array_equal(init.const_value.numpy(), [[-1, -2, -3]])


def test_folded_graph_output_becomes_a_constant_node():
    m = model("c = Constant<value=float[2,3] {1,2,3,4,5,6}>()\n y = Neg(c)")
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Constant": 1}
    assert effected(result, PASS, "fold") == 1


def test_if_with_constant_condition_and_constant_branches_folds():
    m = model(
        "cond = Constant<value=bool {1}>()\n"
        " t = If(cond) <then_branch = g1 () => (float[3] a) { a = Constant<value=float[3] {1,2,3}>() },"
        " else_branch = g2 () => (float[3] b) { b = Constant<value=float[3] {4,5,6}>() }>\n"
        " y = Add(x, t)"
    )
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Add": 1}
    assert effected(result, PASS, "fold") == 1


def test_if_reading_a_non_constant_value_stays():
    m = model(
        "cond = Constant<value=bool {1}>()\n"
        " t = If(cond) <then_branch = g1 () => (float[2,3] a) { a = Neg(x) },"
        " else_branch = g2 () => (float[2,3] b) { b = Abs(x) }>\n"
        " y = Add(x, t)"
    )
    optimized, result = check_rule(m, PASS)
    assert "a subgraph reads non-constant values" in reasons(result, PASS)
    assert op_types(optimized)["If"] == 1


def test_random_is_never_folded():
    m = model("r = RandomUniform<shape=[2,3], seed=1.0>()\n y = Add(x, r)")
    result = run_passes(m, PASS)
    assert "RandomUniform is nondeterministic" in reasons(result, PASS)
    assert op_types(m) == {"RandomUniform": 1, "Add": 1}


def test_dropout_in_training_mode_on_a_constant_is_never_folded():
    m = model(
        "c = Constant<value=float[2,3] {1,2,3,4,5,6}>()\n r = Constant<value=float {0.5}>()\n"
        " t = Constant<value=bool {1}>()\n d = Dropout(c, r, t)\n y = Add(x, d)"
    )
    result = run_passes(m, PASS)
    assert "Dropout may be in training mode" in reasons(result, PASS)
    assert op_types(m) == {"Dropout": 1, "Add": 1}


def test_dequantize_linear_of_weights_is_never_folded():
    inits = {
        "w": np.arange(9, dtype=np.int8).reshape(3, 3),
        "s": np.array(0.1, np.float32),
        "z": np.array(0, np.int8),
    }
    m = model("d = DequantizeLinear(w, s, z)\n y = MatMul(x, d)", inits=inits)
    optimized, result = check_rule(m, PASS)
    assert any("DequantizeLinear" in r for r in reasons(result, PASS))
    assert op_types(optimized) == {"DequantizeLinear": 1, "MatMul": 1}


def test_result_over_the_size_limit_is_not_folded():
    m = model(
        "s = Constant<value=int64[2] {20,30}>()\n"
        " z = ConstantOfShape<value=float[1] {1}>(s)\n r = ReduceSum<keepdims=0>(z)\n"
        " y = Add(x, r)"
    )
    optimized, result = check_rule(m, PASS, options=Options(fold_size_limit=100))
    assert any("exceeds --fold-size-limit 100" in r for r in reasons(result, PASS))
    assert op_types(optimized) == {"ConstantOfShape": 1, "ReduceSum": 1, "Add": 1}


def test_large_result_folds_when_it_frees_as_much():
    w = np.arange(200, dtype=np.float32).reshape(20, 10)
    m = model(
        "t = Transpose<perm=[1,0]>(w)\n y = MatMul(x, t)",
        inputs="float[2,10] x",
        outputs="float[2,20] y",
        inits={"w": w},
    )
    optimized, result = check_rule(m, PASS, options=Options(fold_size_limit=100))
    assert op_types(optimized) == {"MatMul": 1}
    assert effected(result, PASS, "fold") == 1


def expand_model(shape: str = "c") -> ir.Model:
    """Add(x, Expand(0.5, [256, 512])): a 177-byte model whose fold would store 512 KiB."""
    return model(
        "h = Constant<value=float {0.5}>()\n c = Constant<value=int64[2] {256,512}>()\n"
        f"{'' if shape == 'c' else ' s = Abs(c)'}\n e = Expand(h, {shape})\n y = Add(x, e)",
        inputs="float[256,512] x",
        outputs="float[256,512] y",
    )


@pytest.mark.parametrize("shape", ["c", "s"])  # s: the Expand's shape is known only once Abs folds
def test_expand_that_would_grow_the_model_is_not_folded(shape, tmp_path):
    src, out = tmp_path / "expand.onnx", tmp_path / "expand.opt.onnx"
    ir.save(expand_model(shape), src)
    result = optimize_file(src, out)
    assert result.verify is not None and result.verify.ok
    assert out.stat().st_size <= src.stat().st_size
    assert any("would grow the model by 524268 bytes" in r for r in reasons(result, PASS))
    assert "Expand" in {n.op_type for n in onnx.load(str(out)).graph.node}


def test_a_result_refused_for_its_size_is_never_evaluated(monkeypatch):
    from opfuse.rules import constant_folding

    evaluated = []
    real = constant_folding.evaluate

    def spy(node, *args, **kwargs):
        evaluated.append(node.op_type)
        return real(node, *args, **kwargs)

    monkeypatch.setattr(constant_folding, "evaluate", spy)
    m = expand_model("s")
    run_passes(m, PASS)
    assert evaluated == ["Abs"]  # the Expand's output shape was unknown before Abs folded
    assert op_types(m) == {"Expand": 1, "Add": 1}


def test_an_op_sized_by_its_input_values_is_not_evaluated_unsized(monkeypatch):
    from opfuse.rules import constant_folding

    monkeypatch.setattr(constant_folding, "output_bytes", lambda *a: None)
    m = model(
        "c = Constant<value=int64[2] {2,3}>()\n s = Abs(c)\n"
        " z = ConstantOfShape<value=float[1] {2}>(s)\n y = Add(x, z)"
    )
    optimized, result = check_rule(m, PASS)
    assert "result size unknown before evaluation" in reasons(result, PASS)
    # the round's shape inference then sized it (2x3 floats): folded in the next round
    assert op_types(optimized) == {"Add": 1}


def test_small_growth_folds_and_the_allowance_is_per_result():
    # 2x3 floats from an 8-byte shape: 16 bytes of growth, within the allowance
    m = model(
        "c = Constant<value=int64[2] {2,3}>()\n z = ConstantOfShape<value=float[1] {2}>(c)"
        "\n y = Add(x, z)"
    )
    optimized, _ = check_rule(m, PASS)
    assert op_types(optimized) == {"Add": 1}
    # 2048 floats (8 KiB) from a 16-byte shape: over the 4 KiB allowance though under the limit
    m = model(
        "c = Constant<value=int64[2] {2,1024}>()\n z = ConstantOfShape<value=float[1] {2}>(c)\n"
        " y = Add(x, z)",
        inputs="float[2,1] x",
        outputs="float[2,1024] y",
    )
    optimized, result = check_rule(m, PASS)
    assert any(
        "would grow the model by 8176 bytes (more than 4096)" in r for r in reasons(result, PASS)
    )
    assert op_types(optimized) == {"ConstantOfShape": 1, "Add": 1}


def test_large_result_of_a_shared_weight_is_not_folded():
    # the Transpose frees nothing: w stays for its other reader, so the fold would add 8 KiB
    w = np.arange(2048, dtype=np.float32).reshape(32, 64)
    m = model(
        "t = Transpose<perm=[1,0]>(w)\n a = MatMul(x, t)\n b = MatMul(a, w)\n y = Relu(b)",
        inputs="float[2,64] x",
        outputs="float[2,64] y",
        inits={"w": w},
    )
    optimized, result = check_rule(m, PASS)
    assert any("would grow the model" in r for r in reasons(result, PASS))
    assert op_types(optimized)["Transpose"] == 1


def test_evaluation_failure_is_a_reason():
    m = ir.from_onnx_text(
        f"{HEAD}\ng (float[2,3] x) => (float[2,3] y) {{\n"
        " c = Constant<value=float[6] {1,2,3,4,5,6}>()\n"
        " s = Constant<value=int64[1] {4}>()\n r = Reshape(c, s)\n y = Add(x, r)\n}"
    )
    result = run_passes(m, PASS)
    assert any(r.startswith("cannot evaluate") for r in reasons(result, PASS))
    assert op_types(m)["Reshape"] == 1


# --- shape arithmetic -------------------------------------------------------------


def test_shape_of_static_tensor_folds():
    m = model(
        "s = Shape(x)\n f = Cast<to=1>(s)\n y = Add(x, f)",
        inputs="float[2,3,3] x",
        outputs="float[2,3,3] y",
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "shape_static") == 1
    assert op_types(optimized) == {"Add": 1}


def test_shape_of_dynamic_tensor_stays_with_reason():
    m = model(
        "s = Shape(x)\n f = Cast<to=1>(s)\n y = Add(x, f)",
        inputs="float[N,3,3] x",
        outputs="float[N,3,3] y",
    )
    optimized, result = check_rule(m, PASS)
    assert "input has dynamic dims" in reasons(result, PASS)
    assert op_types(optimized)["Shape"] == 1


@pytest.mark.parametrize(
    "select",
    [
        "i = Constant<value=int64 {2}>()\n g = Gather<axis=0>(s, i)",
        "i = Constant<value=int64[1] {-1}>()\n g = Gather<axis=0>(s, i)",
        "a = Constant<value=int64[1] {2}>()\n b = Constant<value=int64[1] {3}>()\n"
        " g = Slice(s, a, b)",
    ],
)
def test_gather_or_slice_of_static_dims_folds(select):
    m = model(
        f"s = Shape(x)\n {select}\n f = Cast<to=1>(g)\n y = Add(x, f)",
        inputs="float[N,3,3] x",
        outputs="float[N,3,3] y",
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "shape_gather") == 1
    assert op_types(optimized) == {"Add": 1}


@pytest.mark.parametrize(
    "select,value",
    [
        (
            "s = Shape<start=1, end=-1>(x)\n i = Constant<value=int64 {1}>()\n"
            " g = Gather<axis=0>(s, i)",
            4,
        ),
        (
            "s = Shape<start=-3>(x)\n i = Constant<value=int64[2] {-2,0}>()\n"
            " g = Gather<axis=0>(s, i)",
            [4, 3],
        ),
        (
            "s = Shape(x)\n a = Constant<value=int64[1] {-2}>()\n"
            " b = Constant<value=int64[1] {-9223372036854775807}>()\n"
            " c = Constant<value=int64[1] {0}>()\n d = Constant<value=int64[1] {-1}>()\n"
            " g = Slice(s, a, b, c, d)",
            None,
        ),  # reversed: [4, 3, N]
        (
            "s = Shape(x)\n a = Constant<value=int32[1] {3}>()\n b = Constant<value=int32[1] {0}>()"
            "\n c = Constant<value=int32[1] {-1}>()\n d = Constant<value=int32[1] {-1}>()\n"
            " g = Slice(s, a, b, c, d)",
            [5, 4, 3],
        ),
    ],
)
def test_shape_slices_follow_onnx_semantics(select, value):
    m = model(
        f"{select}\n f = Cast<to=1>(g)\n r = ReduceSum<keepdims=0>(f)\n y = Add(x, r)",
        inputs="float[N,3,4,5] x",
        outputs="float[N,3,4,5] y",
    )
    optimized, result = check_rule(m, PASS)
    if value is None:
        assert "the selected dims are dynamic" in reasons(result, PASS)
        return
    assert op_types(optimized) == {"Add": 1}
    (init,) = optimized.graph.initializers.values()
    assert init.const_value.numpy() == np.sum(value)


def test_gather_of_dynamic_dim_stays_with_reason():
    m = model(
        "s = Shape(x)\n i = Constant<value=int64 {0}>()\n g = Gather<axis=0>(s, i)\n"
        " f = Cast<to=1>(g)\n y = Add(x, f)",
        inputs="float[N,3] x",
        outputs="float[N,3] y",
    )
    optimized, result = check_rule(m, PASS)
    assert "the selected dims are dynamic" in reasons(result, PASS)
    assert op_types(optimized)["Gather"] == 1


def reshape_chain(
    tail: str, target: str, x: str = "float[N,T,64] x", out: str = "", head: str = HEAD
) -> ir.Model:
    return model(
        "s = Shape(x)\n i0 = Constant<value=int64 {0}>()\n i1 = Constant<value=int64 {1}>()\n"
        " a = Gather<axis=0>(s, i0)\n b = Gather<axis=0>(s, i1)\n"
        " ax = Constant<value=int64[1] {0}>()\n"
        f" {tail}\n y = Reshape{target}",
        inputs=x,
        outputs=out,
        head=head,
    )


@pytest.mark.parametrize("opset", [13, 17])
def test_reshape_chain_becomes_constant_shape_with_zeros(opset):
    m = reshape_chain(
        "ua = Unsqueeze(a, ax)\n ub = Unsqueeze(b, ax)\n"
        " k = Constant<value=int64[2] {4,16}>()\n c = Concat<axis=0>(ua, ub, k)",
        "(x, c)",
        out="float[N,T,4,16] y",
        head=HEAD.replace("17", str(opset)),
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "reshape_shape_chain") == 1
    assert op_types(optimized) == {"Reshape": 1}
    (node,) = optimized.graph
    np.testing.assert_array_equal(node.inputs[1].const_value.numpy(), [0, 0, 4, 16])


def test_reshape_chain_uses_minus_one_for_one_runtime_dim():
    m = reshape_chain(
        "p = Mul(a, b)\n up = Unsqueeze(p, ax)\n k = Constant<value=int64[1] {64}>()\n"
        " c = Concat<axis=0>(up, k)",
        "(x, c)",
        out="float[M,64] y",
    )
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Reshape": 1}
    (node,) = optimized.graph
    np.testing.assert_array_equal(node.inputs[1].const_value.numpy(), [-1, 64])


def test_reshape_chain_copies_a_dim_of_the_same_name_from_another_tensor():
    m = model(
        "s = Shape(z)\n i0 = Constant<value=int64 {0}>()\n a = Gather<axis=0>(s, i0)\n"
        " ax = Constant<value=int64[1] {0}>()\n ua = Unsqueeze(a, ax)\n"
        " k = Constant<value=int64[2] {-1,16}>()\n c = Concat<axis=0>(ua, k)\n"
        " y = Reshape(x, c)",
        inputs="float[N,T,64] x, float[N,5] z",
        outputs="float[N,M,16] y",
    )
    optimized, _ = check_rule(m, PASS)
    (node,) = optimized.graph
    np.testing.assert_array_equal(node.inputs[1].const_value.numpy(), [0, -1, 16])


def test_reshape_chain_with_two_runtime_dims_stays():
    m = reshape_chain(
        "p = Mul(a, b)\n up = Unsqueeze(p, ax)\n q = Add(a, b)\n uq = Unsqueeze(q, ax)\n"
        " k = Constant<value=int64[1] {-1}>()\n c = Concat<axis=0>(up, uq, k)",
        "(x, c)",
        out="float[P,Q,R] y",
    )
    result = run_passes(m, PASS)
    assert "more than one dim is known only at run time" in reasons(result, PASS)
    assert op_types(m)["Concat"] == 1


def test_reshape_chain_with_allowzero_stays():
    m = reshape_chain(
        "ua = Unsqueeze(a, ax)\n ub = Unsqueeze(b, ax)\n"
        " k = Constant<value=int64[2] {4,16}>()\n c = Concat<axis=0>(ua, ub, k)",
        "<allowzero=1>(x, c)",
        out="float[N,T,4,16] y",
    )
    optimized, result = check_rule(m, PASS)
    assert "allowzero is set" in reasons(result, PASS)
    assert op_types(optimized)["Concat"] == 1


# --- a quantized model must not grow ---------------------------------------------------


def qdq_model(path):
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.integers(-127, 127, (64, 64)).astype(np.int8),
        "ws": np.array(0.02, np.float32),
        "wz": np.array(0, np.int8),
        "xs": np.array(0.05, np.float32),
        "xz": np.array(0, np.uint8),
        "b": rng.standard_normal(64).astype(np.float32),
    }
    m = model(
        "q = QuantizeLinear(x, xs, xz)\n dx = DequantizeLinear(q, xs, xz)\n"
        " dw = DequantizeLinear(w, ws, wz)\n mm = MatMul(dx, dw)\n y = Add(mm, b)",
        inputs="float[4,64] x",
        outputs="float[4,64] y",
        inits=inits,
    )
    ir.save(m, path)


def test_quantized_model_does_not_grow(tmp_path):
    src, out = tmp_path / "qdq.onnx", tmp_path / "qdq.opt.onnx"
    qdq_model(src)
    result = optimize_file(src, out)  # the default passes, verified against the input
    assert result.verify is not None and result.verify.ok
    assert out.stat().st_size <= src.stat().st_size
    onnx.checker.check_model(str(out), full_check=True)
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("DequantizeLinear") >= 1


def test_gather_of_shape_with_runtime_indices_stays():
    m = model(
        "s = Shape(x)\n g = Gather<axis=0>(s, i)\n f = Cast<to=1>(g)\n y = Add(x, f)",
        inputs="float[N,3] x, int64[1] i",
        outputs="float[N,3] y",
    )
    feeds = {"x": np.ones((2, 3), np.float32), "i": np.array([1])}
    optimized, result = check_rule(m, PASS, feeds=feeds)
    assert "indices are not constant or the rank is unknown" in reasons(result, PASS)
    assert op_types(optimized)["Gather"] == 1


def test_reshape_to_a_shape_of_unknown_length_stays():
    m = model(
        "s = Abs(z)\n y = Reshape(x, s)",
        inputs="float[2,3] x, int64[K] z",
        outputs="float[A] y",
    )
    result = run_passes(m, PASS)
    assert "shape length unknown" in reasons(result, PASS)


def test_constant_node_in_ir3_model_stays():
    m = model(
        "c = Constant<value=float[3] {1,2,3}>()\n y = Add(x, c)",
        head='<ir_version: 3, opset_import: ["" : 8]>',
    )
    result = run_passes(m, PASS)
    assert "IR version below 4: initializers must also be graph inputs" in reasons(result, PASS)


def test_onnxruntime_evaluates_when_the_reference_evaluator_fails(monkeypatch):
    import opfuse.rewrite.evaluate as _evaluate

    def broken(proto):
        raise RuntimeError("reference evaluator unavailable")

    monkeypatch.setattr(_evaluate, "_reference", broken)
    monkeypatch.setattr(_evaluate, "_cache", {})
    monkeypatch.setattr(_evaluate, "_memo", {})
    m = model("c = Constant<value=float[3] {1,4,9}>()\n r = Sqrt(c)\n y = Add(x, r)")
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "fold") == 1
    assert op_types(optimized) == {"Add": 1}


def test_dim_kept_by_a_slice_with_runtime_bounds_folds():
    # onnx's inference loses every dim of t; dim 0 is x's, which the Slice does not touch
    m = model(
        "z = Constant<value=int64[1] {0}>()\n one = Constant<value=int64[1] {1}>()\n"
        " t = Slice(x, z, e, one)\n s = Shape(t)\n i = Constant<value=int64 {0}>()\n"
        " g = Gather<axis=0>(s, i)\n f = Cast<to=1>(g)\n y = Add(t, f)",
        inputs="float[3,N] x, int64[1] e",
        outputs="float[3,M] y",
    )
    feeds = {"x": np.ones((3, 4), np.float32), "e": np.array([2])}
    optimized, result = check_rule(m, PASS, feeds=feeds)
    assert effected(result, PASS, "shape_gather") == 1
    assert op_types(optimized) == {"Slice": 1, "Add": 1}


def test_dim_cut_by_a_slice_with_runtime_bounds_stays():
    m = model(
        "z = Constant<value=int64[1] {0}>()\n one = Constant<value=int64[1] {1}>()\n"
        " t = Slice(x, z, e, one)\n s = Shape(t)\n i = Constant<value=int64 {1}>()\n"
        " g = Gather<axis=0>(s, i)\n f = Cast<to=1>(g)\n y = Add(t, f)",
        inputs="float[3,4] x, int64[1] e",
        outputs="float[3,M] y",
    )
    feeds = {"x": np.ones((3, 4), np.float32), "e": np.array([2])}
    optimized, result = check_rule(m, PASS, feeds=feeds)
    assert "the selected dims are dynamic" in reasons(result, PASS)
    assert op_types(optimized)["Gather"] == 1


def test_folding_keeps_int4_and_uint4_apart():
    """int4 and uint4 arrays share numpy's dtype string (the evaluator cache keys by the
    dtype itself): the same bytes fold to each type's own values."""
    from onnx import helper

    def constant(name, dtype):
        tensor = onnx.TensorProto(name=name, data_type=dtype, dims=[2], raw_data=bytes([0x9F]))
        return helper.make_node("Constant", [], [name], value=tensor)

    nodes = [
        constant("a", onnx.TensorProto.INT4),
        constant("b", onnx.TensorProto.UINT4),
        helper.make_node("Cast", ["a"], ["ca"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Cast", ["b"], ["cb"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["x", "ca"], ["ya"]),
        helper.make_node("Add", ["x", "cb"], ["yb"]),
    ]
    out = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("ya", "yb")]
    x = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])]
    proto = helper.make_model(
        helper.make_graph(nodes, "g", x, out), opset_imports=[helper.make_opsetid("", 21)]
    )
    proto.ir_version = 10
    model = ir.serde.deserialize_model(proto)
    run_passes(model, PASS)
    folded = {
        n.outputs[0].name: n.inputs[1].const_value.numpy().tolist()
        for n in model.graph
        if n.op_type == "Add"
    }
    assert folded == {"ya": [-1.0, -7.0], "yb": [15.0, 9.0]}


def test_a_fold_repeated_on_the_same_small_inputs_is_evaluated_once(monkeypatch):
    """A stack of identical blocks folds the same shape arithmetic in every block: the
    result is remembered by the op and the inputs' bytes, and each copy is its own."""
    import opfuse.rewrite.evaluate as _evaluate

    runs = []
    real = _evaluate._reference

    def counted(proto):
        runner = real(proto)
        return lambda feeds: runs.append(proto.graph.node[0].op_type) or runner(feeds)

    monkeypatch.setattr(_evaluate, "_reference", counted)
    monkeypatch.setattr(_evaluate, "_cache", {})
    monkeypatch.setattr(_evaluate, "_memo", {})
    blocks = "\n".join(
        f" c{i} = Constant<value=float[3] {{1,4,9}}>()\n r{i} = Sqrt(c{i})\n"
        f" d{i} = Constant<value=float[3] {{1,4,{9 + i % 2}}}>()\n q{i} = Sqrt(d{i})\n"
        f" s{i} = Add(r{i}, q{i})\n y{i} = Add({'x' if i == 0 else f'y{i - 1}'}, s{i})"
        for i in range(4)
    )
    m = model(blocks.replace("y3 =", "y ="))
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "fold") == 4 * 3
    # Sqrt of {1,4,9} once, of {1,4,10} once, Add of each distinct pair once
    assert runs.count("Sqrt") == 2
    assert runs.count("Add") == 2


def test_a_remembered_result_still_meets_the_declared_shape(monkeypatch):
    import opfuse.rewrite.evaluate as _evaluate
    from opfuse.rewrite.evaluate import EvaluationError, evaluate

    monkeypatch.setattr(_evaluate, "_memo", {})
    m = ir.from_onnx_text(
        f"{HEAD}\ng (float[3] x) => (float[3] y, float[4] z) {{\n y = Sqrt(x)\n z = Sqrt(x)\n}}"
    )
    good, bad = m.graph.node(0), m.graph.node(1)
    arrays = [np.array([1, 4, 9], np.float32)]
    assert evaluate(good, arrays, m)[0].tolist() == [1, 2, 3]
    assert len(_evaluate._memo) == 1
    with pytest.raises(EvaluationError, match="declared"):
        evaluate(bad, arrays, m)
    again = evaluate(good, arrays, m)[0]
    again[0] = 7  # a copy: the remembered result stays as it was
    assert evaluate(good, arrays, m)[0].tolist() == [1, 2, 3]


def test_a_constant_read_by_many_folds_is_not_listed_at_each(monkeypatch):
    """One axes initializer read by N Unsqueezes of constants (a model whose constants
    onnxsim or onnxslim already merged): each fold asks whether it frees its inputs.
    Listing the shared constant's readers at every fold would be quadratic in N; the
    readers listed in the whole run must stay linear."""
    n = 300
    listed = [0]
    real = ir.Value.uses

    def counted(self):
        uses = real(self)
        if self.name == "axes":
            listed[0] += len(uses)
        return uses

    monkeypatch.setattr(ir.Value, "uses", counted)
    body = "\n".join(
        f" c{i} = Constant<value=float {{{i}}}>()\n u{i} = Unsqueeze(c{i}, axes)\n"
        f" y{i} = Add({'x' if i == 0 else f'y{i - 1}'}, u{i})"
        for i in range(n)
    )
    m = model(
        body.replace(f"y{n - 1} =", "y ="),
        inputs="float[1] x",
        outputs="float[1] y",
        inits={"axes": np.array([0], np.int64)},
    )
    result = run_passes(m, PASS)
    assert effected(result, PASS, "fold") == n
    assert listed[0] < 10 * n, listed[0]
