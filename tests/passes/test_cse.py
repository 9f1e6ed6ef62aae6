"""CommonSubexpressionFusionPass: duplicate nodes merged, duplicate initializers
deduplicated (hash, then bytes), what must stay apart."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from helpers import check_rule, effected, model_from_text, op_types
from opfuse.passes.cse import dedupe_initializers

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


def test_random_ops_stay_apart():
    m = model("a = RandomUniformLike(x)\n b = RandomUniformLike(x)\n y = Add(a, b)")
    from helpers import run_passes

    result = run_passes(m, PASS)
    assert op_types(m)["RandomUniformLike"] == 2
    assert effected(result, PASS) == 0


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
