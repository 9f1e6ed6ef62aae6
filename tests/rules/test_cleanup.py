"""Identity, Dropout and no-op removal: each rule fires, does not fire where it must not,
keeps the numbers and is idempotent."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from helpers import check_rule, effected, model_from_text, op_types, reasons, run_passes

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def model(body: str, inputs: str = "float[2,3,4] x", outputs: str = "float[2,3,4] y", inits=None):
    return model_from_text(f"{HEAD}\ng ({inputs}) => ({outputs}) {{\n{body}\n}}", inits)


POSITIVE = [
    ("IdentityRemovalFusionPass", "t = Identity(x)\n y = Relu(t)"),
    ("DropoutRemovalFusionPass", "t = Dropout(x)\n y = Relu(t)"),
    ("DropoutRemovalFusionPass", "t, mask = Dropout(x)\n y = Relu(t)"),
    ("NoOpRemovalFusionPass", "t = Cast<to=1>(x)\n y = Relu(t)"),
    (
        "NoOpRemovalFusionPass",
        "s = Constant<value=int64[3] {2,3,4}>()\n t = Reshape(x, s)\n y = Relu(t)",
    ),
    (
        "NoOpRemovalFusionPass",
        "s = Constant<value=int64[3] {0,0,-1}>()\n t = Reshape(x, s)\n y = Relu(t)",
    ),
    ("NoOpRemovalFusionPass", "t = Transpose<perm=[0,1,2]>(x)\n y = Relu(t)"),
    (
        "NoOpRemovalFusionPass",
        "a = Constant<value=int64[1] {0}>()\n b = Constant<value=int64[1] {9223372036854775807}>()\n"
        " t = Slice(x, a, b)\n y = Relu(t)",
    ),
    (
        "NoOpRemovalFusionPass",
        "s = Constant<value=int64[2] {3,1}>()\n t = Expand(x, s)\n y = Relu(t)",
    ),
    (
        "NoOpRemovalFusionPass",
        "p = Constant<value=int64[6] {0,0,0,0,0,0}>()\n t = Pad(x, p)\n y = Relu(t)",
    ),
    ("NoOpRemovalFusionPass", "t = Concat<axis=0>(x)\n y = Relu(t)"),
    ("NoOpRemovalFusionPass", "t = Split<axis=1, num_outputs=1>(x)\n y = Relu(t)"),
    ("NoOpRemovalFusionPass", "t = Sum(x)\n y = Relu(t)"),
    ("NoOpRemovalFusionPass", "t = Max(x)\n y = Relu(t)"),
    ("NoOpRemovalFusionPass", "t = Min(x)\n y = Relu(t)"),
    ("NoOpRemovalFusionPass", "t = Mean(x)\n y = Relu(t)"),
]


@pytest.mark.parametrize("pass_name,body", POSITIVE)
def test_removes(pass_name, body):
    m = model(
        body.replace("Split<axis=1, num_outputs=1>", "Split<axis=1>") if "Split" in body else body
    )
    optimized, result = check_rule(m, pass_name)
    assert effected(result, pass_name) == 1
    assert op_types(optimized) == {"Relu": 1}


X = "float[2,3,4] x"
NEGATIVE = [
    (
        "DropoutRemovalFusionPass",
        "r = Constant<value=float {0.0}>()\n tm = Constant<value=bool {1}>()\n"
        " t = Dropout(x, r, tm)\n y = Relu(t)",
        "Dropout is in training mode",
        X,
    ),
    (
        "DropoutRemovalFusionPass",
        "t = Dropout(x, r, tm)\n y = Relu(t)",
        "training_mode is not a constant",
        X + ", float r, bool tm",
    ),
    (
        "DropoutRemovalFusionPass",
        "t, mask = Dropout(x)\n y = Where(mask, t, x)",
        "the Dropout mask is used",
        X,
    ),
    (
        "NoOpRemovalFusionPass",
        "t = Cast<to=11>(x)\n u = Cast<to=1>(t)\n y = Relu(u)",
        "Cast changes the dtype",
        X,
    ),
    (
        "NoOpRemovalFusionPass",
        "s = Constant<value=int64[3] {3,2,4}>()\n r = Constant<value=int64[3] {2,3,4}>()\n"
        " t = Reshape(x, s)\n u = Reshape(t, r)\n y = Relu(u)",
        "Reshape changes the shape",
        X,
    ),
    (
        "NoOpRemovalFusionPass",
        "t = Transpose<perm=[1,0,2]>(x)\n u = Transpose<perm=[1,0,2]>(t)\n y = Relu(u)",
        "permutation is not the identity",
        X,
    ),
    (
        "NoOpRemovalFusionPass",
        "a = Constant<value=int64[1] {1}>()\n b = Constant<value=int64[1] {3}>()\n"
        " t = Slice(x, a, b)\n p = Constant<value=int64[6] {1,0,0,0,0,0}>()\n y = Pad(t, p)",
        "Slice drops elements",
        X,
    ),
    (
        "NoOpRemovalFusionPass",
        "s = Constant<value=int64[4] {2,2,3,4}>()\n t = Expand(x, s)\n"
        " a = Constant<value=int64[1] {0}>()\n u = ReduceSum<keepdims=0>(t, a)\n y = Relu(u)",
        "Expand grows the tensor",
        X,
    ),
    (
        "NoOpRemovalFusionPass",
        "p = Constant<value=int64[6] {0,0,1,0,0,0}>()\n t = Pad(x, p)\n"
        " s1 = Constant<value=int64[1] {1}>()\n s2 = Constant<value=int64[1] {5}>()\n"
        " ax = Constant<value=int64[1] {2}>()\n y = Slice(t, s1, s2, ax)",
        "pads are not zero",
        X,
    ),
]


def without_constants(model: ir.Model) -> dict[str, int]:
    return {op: n for op, n in op_types(model).items() if op != "Constant"}


@pytest.mark.parametrize("pass_name,body,reason,inputs", NEGATIVE)
def test_does_not_remove(pass_name, body, reason, inputs):
    m = model(body, inputs=inputs)
    feeds = {"x": np.ones((2, 3, 4), np.float32)}
    if "tm" in inputs:
        feeds.update(r=np.array(0.0, np.float32), tm=np.array(False))
    optimized, result = check_rule(m, pass_name, feeds=feeds)
    assert reason in reasons(result, pass_name)
    assert without_constants(optimized) == without_constants(m)


@pytest.mark.parametrize("op", ["Concat<axis=0>", "Sum", "Max", "Min", "Mean"])
def test_two_input_variadic_ops_stay(op):
    out = "float[4,3,4] y" if op.startswith("Concat") else "float[2,3,4] y"
    m = model(f"t = {op}(x, x)\n y = Relu(t)", outputs=out)
    optimized, result = check_rule(m, "NoOpRemovalFusionPass")
    assert effected(result, "NoOpRemovalFusionPass") == 0
    assert without_constants(optimized) == without_constants(m)


def test_rank1_transpose_with_default_perm_goes():
    m = model("t = Transpose(x)\n y = Relu(t)", inputs="float[4] x", outputs="float[4] y")
    optimized, result = check_rule(m, "NoOpRemovalFusionPass")
    assert effected(result, "NoOpRemovalFusionPass", "transpose_noop") == 1
    assert op_types(optimized) == {"Relu": 1}


def test_rank2_transpose_with_default_perm_stays():
    m = model("t = Transpose(x)\n y = Relu(t)", inputs="float[4,3] x", outputs="float[3,4] y")
    optimized, result = check_rule(m, "NoOpRemovalFusionPass")
    assert "default permutation reverses the axes" in reasons(result, "NoOpRemovalFusionPass")
    assert op_types(optimized) == {"Transpose": 1, "Relu": 1}


def test_identity_between_graph_input_and_output_stays():
    m = model("y = Identity(x)")
    result = run_passes(m, "IdentityRemovalFusionPass")
    assert op_types(m) == {"Identity": 1}
    assert effected(result, "IdentityRemovalFusionPass") == 0
    assert any("graph input" in r for r in reasons(result, "IdentityRemovalFusionPass"))


def test_identity_before_graph_output_keeps_the_output_name():
    m = model("t = Relu(x)\n y = Identity(t)")
    optimized, _ = check_rule(m, "IdentityRemovalFusionPass")
    assert [v.name for v in optimized.graph.outputs] == ["y"]
    assert op_types(optimized) == {"Relu": 1}


def test_dead_code_removes_unused_nodes_and_initializers():
    m = model("u = Relu(x)\n y = Sigmoid(x)")
    m.graph.register_initializer(
        ir.Value(name="unused", const_value=ir.tensor(np.ones(3, np.float32)))
    )
    optimized, result = check_rule(m)
    assert op_types(optimized) == {"Sigmoid": 1}
    assert "unused" not in optimized.graph.initializers
    assert effected(result, "DeadCodeFusionPass") == 2


# --- RedundantChainFusionPass ----------------------------------------------------------

CHAIN = "RedundantChainFusionPass"

CHAIN_POSITIVE = [
    ("t = Cast<to=11>(x)\n u = Cast<to=1>(t)\n y = Relu(u)", {"Relu": 1}),
    ("t = Cast<to=11>(x)\n u = Cast<to=7>(t)\n y = Cast<to=1>(u)", {"Cast": 2}),
    (
        "t = Transpose<perm=[1,0,2]>(x)\n u = Transpose<perm=[1,0,2]>(t)\n y = Relu(u)",
        {"Relu": 1},
    ),
    (
        "t = Transpose<perm=[1,2,0]>(x)\n u = Transpose<perm=[1,2,0]>(t)\n"
        " v = Transpose<perm=[1,2,0]>(u)\n y = Relu(v)",
        {"Relu": 1},
    ),
    (
        "s = Constant<value=int64[2] {6,4}>()\n r = Constant<value=int64[3] {2,3,4}>()\n"
        " t = Reshape(x, s)\n u = Reshape(t, r)\n y = Relu(u)",
        {"Relu": 1},
    ),
    (
        "a = Constant<value=int64[1] {0}>()\n t = Unsqueeze(x, a)\n u = Squeeze(t, a)\n"
        " y = Relu(u)",
        {"Relu": 1},
    ),
    (
        "a = Constant<value=int64[1] {-1}>()\n b = Constant<value=int64[1] {3}>()\n"
        " t = Unsqueeze(x, a)\n u = Squeeze(t, b)\n y = Relu(u)",
        {"Relu": 1},
    ),
]


@pytest.mark.parametrize("body,left", CHAIN_POSITIVE)
def test_chain_merges(body, left):
    optimized, result = check_rule(model(body), CHAIN, "NoOpRemovalFusionPass")
    assert effected(result, CHAIN) >= 1
    assert dict(op_types(optimized)) == left


def test_chain_merges_reshapes_into_one():
    body = (
        "s = Constant<value=int64[2] {6,4}>()\n r = Constant<value=int64[2] {4,6}>()\n"
        " t = Reshape(x, s)\n y = Reshape(t, r)"
    )
    optimized, result = check_rule(model(body, outputs="float[4,6] y"), CHAIN)
    assert effected(result, CHAIN, "reshape_chain") == 1
    assert op_types(optimized) == {"Reshape": 1}


def test_chain_resolves_a_copied_dim_of_the_middle_tensor():
    body = (
        "s = Constant<value=int64[2] {6,4}>()\n r = Constant<value=int64[3] {0,2,2}>()\n"
        " t = Reshape(x, s)\n y = Reshape(t, r)"
    )
    optimized, _ = check_rule(model(body, outputs="float[6,2,2] y"), CHAIN)
    (node,) = optimized.graph
    assert list(node.inputs[1].const_value.numpy()) == [6, 2, 2]


def test_unsqueeze_of_squeeze_without_axes_on_static_shape():
    body = "t = Squeeze(x)\n u = Unsqueeze(t, a)\n y = Relu(u)"
    m = model_from_text(
        f"{HEAD}\ng (float[2,1,4] x) => (float[2,1,4] y) {{\n"
        " a = Constant<value=int64[1] {1}>()\n" + body + "\n}"
    )
    optimized, _ = check_rule(m, CHAIN)
    assert op_types(optimized) == {"Relu": 1}


CHAIN_NEGATIVE = [
    (
        "t = Cast<to=10>(x)\n u = Cast<to=1>(t)\n y = Relu(u)",
        "float[2,3,4] x",
        "the first Cast (FLOAT to FLOAT16) loses information",
    ),
    (
        "t = Cast<to=6>(x)\n u = Cast<to=1>(t)\n y = Relu(u)",
        "float[2,3,4] x",
        "the first Cast (FLOAT to INT32) loses information",
    ),
    (
        "s = Constant<value=int64[2] {-1,4}>()\n r = Constant<value=int64[3] {0,2,-1}>()\n"
        " t = Reshape(x, s)\n y = Reshape(t, r)",
        "float[N,3,4] x",
        "the outer shape copies a dim of the middle tensor that is not static",
    ),
    (
        "a = Constant<value=int64[1] {0}>()\n b = Constant<value=int64[1] {1}>()\n"
        " t = Unsqueeze(x, a)\n u = Unsqueeze(t, b)\n y = Relu(u)",
        "float[2,3,4] x",
        "both are Unsqueeze",
    ),
    (
        "a = Constant<value=int64[1] {0}>()\n b = Constant<value=int64[1] {2}>()\n"
        " t = Unsqueeze(x, a)\n u = Squeeze(t, b)\n y = Relu(u)",
        "float[2,1,4] x",
        "the axes differ",
    ),
    (
        "a = Constant<value=int64[1] {0}>()\n t = Unsqueeze(x, a)\n u = Squeeze(t)\n y = Relu(u)",
        "float[N,3,4] x",
        "axes are not constant",
    ),
]


@pytest.mark.parametrize("body,x,reason", CHAIN_NEGATIVE)
def test_chain_refuses(body, x, reason):
    out = "float[A,B,C] y"
    if "Unsqueeze(t, b)" in body:
        out = "float[1,1,2,3,4] y"
    elif "Squeeze(t, b)" in body:
        out = "float[1,2,4] y"
    elif "Cast" in body:
        out = "float[2,3,4] y"
    m = model_from_text(f"{HEAD}\ng ({x}) => ({out}) {{\n{body}\n}}")
    _, result = check_rule(m, CHAIN)
    assert reason in reasons(result, CHAIN)


def test_identity_chain_goes():
    m = model("a = Identity(x)\n b = Identity(a)\n c = Identity(b)\n y = Relu(c)")
    optimized, result = check_rule(m, "IdentityRemovalFusionPass")
    assert effected(result, "IdentityRemovalFusionPass") == 3
    assert op_types(optimized) == {"Relu": 1}


def test_no_op_between_graph_input_and_output_becomes_identity():
    optimized, result = check_rule(model("y = Cast<to=1>(x)"), "NoOpRemovalFusionPass")
    assert effected(result, "NoOpRemovalFusionPass") == 1
    assert op_types(optimized) == {"Identity": 1}


def test_branch_output_that_is_an_outer_value_keeps_its_identity():
    m = model_from_text(
        f"{HEAD}\ng (float[2,3,4] x, bool c) => (float[2,3,4] y) {{\n a = Relu(x)\n"
        " y = If(c) <then_branch = g1 () => (float[2,3,4] o1) { o1 = Identity(a) },"
        " else_branch = g2 () => (float[2,3,4] o2) { o2 = Neg(x) }>\n}"
    )
    feeds = {"x": np.ones((2, 3, 4), np.float32), "c": np.array(True)}
    optimized, result = check_rule(m, "IdentityRemovalFusionPass", feeds=feeds)
    assert effected(result, "IdentityRemovalFusionPass") == 0
    assert op_types(optimized) == {"Relu": 1, "If": 1, "Identity": 1, "Neg": 1}
