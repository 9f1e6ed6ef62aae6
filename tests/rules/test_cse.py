"""CommonSubexpressionFusionPass: duplicate nodes merged, duplicate initializers
deduplicated (hash, then bytes), what must stay apart."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from helpers import check_rule, effected, model_from_text, op_types, random_feeds, run_passes
from opfuse.rules.cse import dedupe_initializers

PASS = "CommonSubexpressionFusionPass"
HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def model(body, inputs="float[2,3] x", outputs="float[2,3] y", inits=None):
    return model_from_text(f"{HEAD}\ng ({inputs}) => ({outputs}) {{\n{body}\n}}", inits)


def test_duplicate_nodes_merge_in_chains():
    m = model("a = Relu(x)\n b = Relu(x)\n c = Sigmoid(a)\n d = Sigmoid(b)\n y = Add(c, d)")
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"Relu": 1, "Sigmoid": 1, "Add": 1}
    assert effected(result, PASS, "common_subexpression") == 2


def test_different_attributes_stay_apart():
    m = model("a = LeakyRelu<alpha=0.1>(x)\n b = LeakyRelu<alpha=0.2>(x)\n y = Add(a, b)")
    optimized, result = check_rule(m, PASS)
    assert op_types(optimized) == {"LeakyRelu": 2, "Add": 1}
    assert effected(result, PASS) == 0


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike", "Bernoulli"])
def test_random_ops_stay_apart(op):
    m = model(f"p = Sigmoid(x)\n a = {op}(p)\n b = {op}(p)\n y = Add(a, b)")
    result = run_passes(m, PASS)
    assert op_types(m)[op] == 2
    assert effected(result, PASS) == 0


def test_random_ops_without_inputs_stay_apart():
    m = model(
        "a = RandomUniform<shape=[2,3]>()\n b = RandomUniform<shape=[2,3]>()\n"
        " c = Multinomial<sample_size=2>(x)\n d = Multinomial<sample_size=2>(x)\n"
        " e = Add(a, b)\n y = Add(e, x)",
        outputs="float[2,3] y, int32[2,2] c, int32[2,2] d",
    )
    result = run_passes(m, PASS)
    assert op_types(m)["RandomUniform"] == 2 and op_types(m)["Multinomial"] == 2
    assert effected(result, PASS) == 0


def test_dropout_in_training_mode_stays_apart_in_inference_mode_merges():
    training = model(
        "r = Constant<value=float {0.5}>()\n t = Constant<value=bool {1}>()\n"
        " a = Dropout(x, r, t)\n b = Dropout(x, r, t)\n y = Add(a, b)"
    )
    result = run_passes(training, PASS)
    assert op_types(training)["Dropout"] == 2
    assert effected(result, PASS, "common_subexpression") == 0
    runtime_flag = model(
        "r = Constant<value=float {0.5}>()\n a = Dropout(x, r, t)\n b = Dropout(x, r, t)\n"
        " y = Add(a, b)",
        inputs="float[2,3] x, bool t",
    )
    run_passes(runtime_flag, PASS)
    assert op_types(runtime_flag)["Dropout"] == 2
    inference = model("a = Dropout(x)\n b = Dropout(x)\n y = Add(a, b)")
    optimized, _ = check_rule(inference, PASS)
    assert op_types(optimized)["Dropout"] == 1


def test_custom_domain_dropout_stays_apart():
    m = model_from_text(
        '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
        "g (float[2,3] x) => (float[2,3] y) {\n"
        " a = com.microsoft.BitmaskDropout(x)\n b = com.microsoft.BitmaskDropout(x)\n"
        " y = Add(a, b)\n}"
    )
    result = run_passes(m, PASS)
    assert effected(result, PASS, "common_subexpression") == 0


def test_float_attributes_of_opposite_zero_stay_apart():
    m = model(
        "a = Constant<value_float=0.0>()\n b = Constant<value_float=-0.0>()\n"
        " p = Div(x, a)\n q = Div(x, b)\n y = Add(p, q)"
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "common_subexpression") == 0
    assert op_types(optimized)["Constant"] == 2


def test_duplicate_graph_outputs_keep_their_names():
    m = model("a = Relu(x)\n b = Relu(x)", outputs="float[2,3] a, float[2,3] b")
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "common_subexpression") == 1
    assert [v.name for v in optimized.graph.outputs] == ["a", "b"]
    assert op_types(optimized) == {"Relu": 1, "Identity": 1}


def if_model(branch_body: str) -> ir.Model:
    return model_from_text(
        f"{HEAD}\ng (float[2,3] x, bool c) => (float[2,3] y) {{\n"
        " a = Relu(x)\n"
        " t = If(c) <then_branch = g1 () => (float[2,3] o1) {\n"
        f"{branch_body}\n"
        " }, else_branch = g2 () => (float[2,3] o2) { o2 = Relu(x) }>\n"
        " y = Add(a, t)\n}"
    )


def test_subgraph_duplicates_merge_reading_outer_values():
    m = if_model(
        " b1 = Relu(x)\n b2 = Relu(x)\n n1 = Neg(a)\n n2 = Neg(a)\n"
        " s = Add(b1, b2)\n u = Add(n1, n2)\n o1 = Add(s, u)"
    )
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    for c in (True, False):
        optimized, result = check_rule(m, PASS, feeds={**feeds, "c": np.array(c)})
    assert effected(result, PASS, "common_subexpression") == 2
    # the main graph's Relu(x) and each branch's stay apart: different scopes
    assert op_types(optimized) == {"Relu": 3, "Neg": 1, "Add": 4, "If": 1}


def test_subgraph_merges_after_the_outer_graph_merged():
    m = model_from_text(
        f"{HEAD}\ng (float[2,3] x, bool c) => (float[2,3] y) {{\n"
        " a1 = Relu(x)\n a2 = Relu(x)\n"
        " t = If(c) <then_branch = g1 () => (float[2,3] o1) {\n"
        "  n1 = Neg(a1)\n n2 = Neg(a2)\n o1 = Add(n1, n2)\n"
        " }, else_branch = g2 () => (float[2,3] o2) { o2 = Abs(a2) }>\n"
        " y = Add(a1, t)\n}"
    )
    optimized, result = check_rule(m, PASS, feeds={**random_feeds(m), "c": np.array(True)})
    assert effected(result, PASS, "common_subexpression") == 2
    assert op_types(optimized) == {"Relu": 1, "Neg": 1, "Add": 2, "Abs": 1, "If": 1}


def test_loop_body_values_stay_apart_from_outer_ones():
    m = model_from_text(
        f"{HEAD}\ng (float[2,3] x, int64 n) => (float[2,3] y) {{\n"
        " a = Neg(x)\n cond = Constant<value=bool {1}>()\n"
        " y = Loop(n, cond, x) <body = body (int64 i, bool ci, float[2,3] v) =>"
        " (bool co, float[2,3] vo) {\n"
        "  co = Identity(ci)\n p = Neg(v)\n q = Neg(v)\n r = Neg(x)\n"
        "  s = Add(p, q)\n w = Add(s, r)\n vo = Add(w, a)\n"
        " }>\n}"
    )
    feeds = {**random_feeds(m), "n": np.array(3, np.int64)}
    optimized, result = check_rule(m, PASS, feeds=feeds)
    assert effected(result, PASS, "common_subexpression") == 1
    assert op_types(optimized)["Neg"] == 3  # a, p (q merged into it), r


def test_duplicate_initializers_are_deduplicated():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    inits = {"w1": w, "w2": w.copy(), "w3": w + 1}
    m = model(
        "a = Add(x, w1)\n b = Mul(x, w2)\n c = Sub(x, w3)\n d = Add(a, b)\n y = Add(d, c)",
        inits=inits,
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "duplicate_initializers") == 1
    assert set(optimized.graph.initializers) == {"w1", "w3"}


def test_same_bytes_different_dtype_or_shape_stay_apart():
    graph = ir.Graph([], [], nodes=[])
    for name, array in {
        "a": np.zeros(4, np.float32),
        "b": np.zeros(4, np.int32),  # same bytes, another dtype
        "c": np.zeros((2, 2), np.float32),  # same bytes, another shape
    }.items():
        graph.register_initializer(ir.Value(name=name, const_value=ir.tensor(array)))
    assert dedupe_initializers(graph) == 0
    assert len(graph.initializers) == 3


def three_weights() -> ir.Model:
    """w3 is a copy of w1; w2 differs from w1 (by default everywhere)."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    return model(
        "a = Add(x, w1)\n b = Mul(x, w2)\n c = Sub(x, w3)\n d = Add(a, b)\n y = Add(d, c)",
        inits={"w1": w, "w2": w + 1, "w3": w.copy()},
    )


def test_hash_collision_with_different_bytes_keeps_both(monkeypatch):
    from opfuse.rules import cse

    monkeypatch.setattr(cse, "SMALL_BYTES", 0)  # the large-weight path: hash, then bytes
    monkeypatch.setattr(cse, "_digest", lambda value: "collision")
    w = np.arange(100, dtype=np.float32).reshape(4, 25)
    w2 = w.copy()
    w2[0, 20] += 1  # outside the sampled elements: w2 gets as far as the byte comparison
    inits = {"w1": w, "w2": w2, "w3": w.copy()}
    m = model(
        "a = Add(x, w1)\n b = Mul(x, w2)\n c = Sub(x, w3)\n d = Add(a, b)\n y = Add(d, c)",
        inputs="float[4,25] x",
        outputs="float[4,25] y",
        inits=inits,
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "duplicate_initializers") == 1  # w3 is w1; w2 stays
    assert set(optimized.graph.initializers) == {"w1", "w2"}


def test_weights_that_differ_in_their_samples_are_never_hashed(monkeypatch):
    from opfuse.rules import cse

    monkeypatch.setattr(cse, "SMALL_BYTES", 0)  # sampling is for the large-weight path
    hashed: list[str] = []
    real = cse._digest
    monkeypatch.setattr(cse, "_digest", lambda value: hashed.append(value.name) or real(value))
    m = three_weights()
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "duplicate_initializers") == 1
    assert set(optimized.graph.initializers) == {"w1", "w2"}
    assert "w2" not in hashed and {"w1", "w3"} <= set(hashed)


def test_small_weights_with_colliding_hashes_are_compared_byte_for_byte(monkeypatch):
    import hashlib
    import types

    from opfuse.rules import cse

    class Collide:
        def __init__(self, *args, **kwargs):
            pass

        def digest(self):
            return b"same"

    monkeypatch.setattr(
        cse, "hashlib", types.SimpleNamespace(blake2b=Collide, sha256=hashlib.sha256)
    )
    m = three_weights()
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "duplicate_initializers") == 1  # w3 is w1; w2 stays
    assert set(optimized.graph.initializers) == {"w1", "w2"}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (onnx.TensorProto.INT4, onnx.TensorProto.UINT4),
        (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ),
    ],
    ids=["int4/uint4", "float8e4m3fn/fnuz"],
)
def test_constants_of_onnx_types_sharing_a_numpy_dtype_stay_apart(first, second):
    """int4 and uint4 (and the float8 variants) are one numpy dtype: same bytes, other values."""
    from onnx import helper

    def constant(name, dtype):
        tensor = onnx.TensorProto(name=name, data_type=dtype, dims=[2], raw_data=bytes([0x9F]))
        if dtype not in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            tensor.raw_data = bytes([0x38, 0x40])
        return helper.make_node("Constant", [], [name], value=tensor)

    nodes = [
        constant("a", first),
        constant("b", second),
        helper.make_node("Cast", ["a"], ["ya"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Cast", ["b"], ["yb"], to=onnx.TensorProto.FLOAT),
    ]
    outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("ya", "yb")]
    proto = helper.make_model(
        helper.make_graph(nodes, "g", [], outputs), opset_imports=[helper.make_opsetid("", 21)]
    )
    proto.ir_version = 10
    model = ir.serde.deserialize_model(proto)
    run_passes(model, PASS)
    casts = [n for n in model.graph if n.op_type == "Cast"]
    assert len({id(n.inputs[0]) for n in casts}) == 2


# --- equal constants shared as rewrites make them (rewrite.builder.SharedConstants) --------

FOLDING = "ConstantFoldingFusionPass"
SIXES = (
    "a = Constant<value=float[1] {10}>()\n b = Constant<value=float[1] {4}>()\n"
    " c = Constant<value=float[1] {9}>()\n d = Constant<value=float[1] {3}>()\n"
    " s = Sub(a, b)\n t = Sub(c, d)\n u = Add(x, s)\n y = Mul(u, t)"
)


def _readers_of_the_sixes(m: ir.Model) -> set[int]:
    return {id(n.inputs[1]) for n in m.graph if n.op_type in ("Add", "Mul")}


def test_folds_to_equal_constants_share_one_initializer_when_merging_is_on():
    m = model(SIXES)
    optimized, result = check_rule(m, FOLDING, PASS)
    assert effected(result, FOLDING, "fold") == 2
    # the second fold read the first one's initializer (one copy never made)
    assert effected(result, PASS, "duplicate_initializers") == 1
    assert len(_readers_of_the_sixes(optimized)) == 1
    assert list(optimized.graph.initializers) == ["s"]


def test_without_merging_equal_constants_stay_apart():
    m = model(SIXES)
    optimized, result = check_rule(m, FOLDING)
    assert effected(result, FOLDING, "fold") == 2
    assert len(_readers_of_the_sixes(optimized)) == 2


def test_shared_constants_are_exact_and_live_in_their_graph():
    from opfuse.rewrite.builder import SharedConstants

    g = ir.Graph([], [], nodes=[])
    zero, minus_zero = np.array([0.0], np.float32), np.array([-0.0], np.float32)
    assert SharedConstants.key(g, zero) != SharedConstants.key(g, minus_zero)
    assert SharedConstants.key(g, zero) != SharedConstants.key(g, zero.astype(np.float64))
    assert SharedConstants.key(g, np.zeros(1000, np.float32)) is None  # large: not shared
    assert SharedConstants.key(g, np.array(["a"])) is None  # not numeric
    shared = SharedConstants()
    key = SharedConstants.key(g, zero)
    assert key is not None
    value = ir.Value(name="z", const_value=ir.Tensor(zero))
    g.register_initializer(value)
    shared.remember(key, value)
    assert shared.get(key, g) is value
    assert shared.get(key, ir.Graph([], [], nodes=[])) is None  # another graph's
    g.initializers.pop("z")  # dropped (dead code): never handed out again
    assert shared.get(key, g) is None


def test_a_shared_constant_counts_as_freed_by_each_fold_that_reads_it():
    """Abs(k2), then Relu(k1) fold to equal 256-byte constants: Relu's is Abs's, read by
    the Add and the Tile; the Tile's fold grows the model by exactly the allowance only if
    it frees its input, as it would free its own copy: it still folds."""
    k = np.arange(64, dtype=np.float32)
    m = model(
        "b = Abs(k2)\n s = Add(x, b)\n a = Relu(k1)\n t = Tile(a, reps)\n"
        " r = ReduceSum<keepdims=0>(t)\n y = Add(s, r)",
        inputs="float[64] x",
        outputs="float[64] y",
        inits={"k1": k, "k2": k.copy(), "reps": np.array([17], np.int64)},
    )
    optimized, result = check_rule(m, FOLDING, PASS)
    assert effected(result, FOLDING, "fold") == 4
    assert op_types(optimized) == {"Add": 2}


def test_copies_not_made_are_counted_as_duplicates():
    m = model(SIXES)
    _, result = check_rule(m, FOLDING, PASS)
    # the second fold's six is the first one's: one duplicate CSE never had to drop
    assert effected(result, PASS, "duplicate_initializers") == 1


def test_merged_graph_outputs_merge_again_in_the_next_round():
    # three equal Negs, all graph outputs: each merge keeps its name with an Identity of
    # y0; those two Identities are alike and merge in the next round (y2 reads y1)
    m = model(
        "y0 = Neg(x)\n y1 = Neg(x)\n y2 = Neg(x)",
        outputs="float[2,3] y0, float[2,3] y1, float[2,3] y2",
    )
    optimized, result = check_rule(m, PASS)
    assert effected(result, PASS, "common_subexpression") == 3
    reads = {
        n.outputs[0].name: n.inputs[0].name for n in optimized.graph if n.op_type == "Identity"
    }
    assert reads == {"y1": "y0", "y2": "y1"}
