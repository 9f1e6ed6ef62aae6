"""Constant nodes lifted into initializers at load (model/constants.py), for the
constant_node rule of ConstantFoldingFusionPass: the same model, log and counts as the
rule's own lifts, and nothing lifted when the pass is off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from opfuse.model.constants import Lifted, lift_constants
from opfuse.pipeline.conductor import OptimizeResult, optimize_file, optimize_model


def constants_model(ir_version: int = 8) -> onnx.ModelProto:
    """Three plain Constants (one a graph output), a value_float Constant, a Constant
    inside an If branch; Reshape/Add/Mul read them."""
    then_branch = h.make_graph(
        [
            h.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2.0))),
            h.make_node("Mul", ["y", "k"], ["z_then"]),
        ],
        "then",
        [],
        [h.make_tensor_value_info("z_then", T.FLOAT, [2, 3])],
    )
    else_branch = h.make_graph(
        [h.make_node("Identity", ["y"], ["z_else"])],
        "else",
        [],
        [h.make_tensor_value_info("z_else", T.FLOAT, [2, 3])],
    )
    shape = numpy_helper.from_array(np.array([2, 3], np.int64))
    bias = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))
    other = numpy_helper.from_array(np.ones((2, 3), np.float32))
    nodes = [
        h.make_node("Constant", [], ["shape"], name="c_shape", value=shape),
        h.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        h.make_node("Constant", [], ["bias"], name="c_bias", value=bias),
        h.make_node("Add", ["r", "bias"], ["y"], name="add"),
        h.make_node("Constant", [], ["half"], name="c_half", value_float=0.5),
        h.make_node("Mul", ["y", "half"], ["w"], name="mul"),
        h.make_node("Constant", [], ["out_c"], name="c_out", value=other),
        h.make_node("If", ["flag"], ["z"], name="branch", then_branch=then_branch,
                    else_branch=else_branch),
    ]  # fmt: skip
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [6]), h.make_tensor_value_info("flag", T.BOOL, [])],
        [
            h.make_tensor_value_info("w", T.FLOAT, [2, 3]),
            h.make_tensor_value_info("out_c", T.FLOAT, [2, 3]),
            h.make_tensor_value_info("z", T.FLOAT, [2, 3]),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def outputs(model: onnx.ModelProto) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.arange(6, dtype=np.float32), "flag": np.array(True)}
    return sess.run(None, feeds)


def test_plain_constants_become_initializers_and_nothing_else_moves():
    model = constants_model()
    before = outputs(model)
    assert lift_constants(model) == Lifted(2)  # shape and bias
    onnx.checker.check_model(model)
    assert [t.name for t in model.graph.initializer] == ["shape", "bias"]
    assert [n.name for n in model.graph.node] == [
        "reshape",
        "add",
        "c_half",
        "mul",
        "c_out",
        "branch",
    ]
    branch = next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["Constant", "Mul"]  # the branch keeps its own
    for got, want in zip(outputs(model), before, strict=True):
        np.testing.assert_array_equal(got, want)
    assert lift_constants(model) == Lifted(0)  # idempotent


def test_ir_version_3_keeps_its_constants():
    model = constants_model(ir_version=3)
    assert lift_constants(model) == Lifted(0)
    assert sum(n.op_type == "Constant" for n in model.graph.node) == 4


def _log(result: OptimizeResult, pattern: str) -> tuple[int, int]:
    stats = next(s for s in result.log if s.pattern == pattern)
    return stats.matched, stats.effected


def on_file_and_in_memory(
    model: onnx.ModelProto, tmp_path: Path
) -> tuple[OptimizeResult, OptimizeResult, onnx.ModelProto]:
    """``model`` optimized file to file (lifted at load) and in memory (by the rules):
    the same graph; both results and the file written."""
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    on_file = optimize_file(src, tmp_path / "out.onnx", verify=False)
    in_memory = optimize_model(ir.from_proto(model))
    written = onnx.load(str(tmp_path / "out.onnx"))
    kept = ir.to_proto(in_memory.model)
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in kept.graph.node]
    assert sorted(t.name for t in written.graph.initializer) == sorted(
        t.name for t in kept.graph.initializer
    )
    return on_file, in_memory, written


def test_optimize_file_reads_as_if_the_rule_had_lifted(tmp_path: Path):
    """The file path lifts at load, the in-memory path lets the rule do it: the same
    graph, the same log line and the same node counts."""
    on_file, in_memory, _ = on_file_and_in_memory(constants_model(), tmp_path)
    # shape and bias at load; half (value_float) and the branch's k by the rule
    assert _log(on_file, "constant_node") == _log(in_memory, "constant_node") == (4, 4)
    assert on_file.before == in_memory.before and on_file.before["Constant"] == 5
    assert on_file.after == in_memory.after


def test_no_lift_when_the_pass_is_off(tmp_path: Path):
    src = tmp_path / "m.onnx"
    onnx.save(constants_model(), src)
    result = optimize_file(
        src, tmp_path / "out.onnx", verify=False, disable=["ConstantFoldingFusionPass"]
    )
    written = onnx.load(str(tmp_path / "out.onnx"))
    assert sum(n.op_type == "Constant" for n in written.graph.node) == 4
    assert not [s for s in result.log if s.pattern == "constant_node"]


def duplicates_model() -> onnx.ModelProto:
    """Constants a (2.0, raw bytes), b (2.0, raw bytes: equal to a), c (2.0 as float_data:
    left to CSE), d (3.0) that Max/Min read (nothing folds them); an If branch reads b by
    name; b has an exporter value_info."""

    def const(name: str, tensor: onnx.TensorProto) -> onnx.NodeProto:
        return h.make_node("Constant", [], [name], name=f"c_{name}", value=tensor)

    two = numpy_helper.from_array(np.array([2.0], np.float32))
    two_floats = h.make_tensor("t", T.FLOAT, [1], [2.0])  # float_data, not raw_data
    then_branch = h.make_graph(
        [h.make_node("Mul", ["w", "b"], ["z_then"])],
        "then",
        [],
        [h.make_tensor_value_info("z_then", T.FLOAT, [1])],
    )
    else_branch = h.make_graph(
        [h.make_node("Identity", ["w"], ["z_else"])],
        "else",
        [],
        [h.make_tensor_value_info("z_else", T.FLOAT, [1])],
    )
    nodes = [
        const("a", two),
        const("b", two),
        const("c", two_floats),
        const("d", numpy_helper.from_array(np.array([3.0], np.float32))),
        h.make_node("Max", ["x", "a"], ["u"], name="max"),
        h.make_node("Min", ["u", "b"], ["v"], name="min"),
        h.make_node("Max", ["v", "c"], ["s"], name="max_c"),
        h.make_node("Min", ["s", "d"], ["w"], name="min_d"),
        h.make_node("If", ["flag"], ["z"], name="branch", then_branch=then_branch,
                    else_branch=else_branch),
    ]  # fmt: skip
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1]), h.make_tensor_value_info("flag", T.BOOL, [])],
        [h.make_tensor_value_info("z", T.FLOAT, [1])],
        value_info=[h.make_tensor_value_info("b", T.FLOAT, [1])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def run_duplicates(model: onnx.ModelProto) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": np.array([1.0], np.float32), "flag": np.array(True)})[0]


def test_equal_raw_constants_merge_as_they_are_lifted():
    model = duplicates_model()
    before = run_duplicates(model)
    assert lift_constants(model, merge=True) == Lifted(4, merged=1)
    onnx.checker.check_model(model, full_check=True)
    assert [t.name for t in model.graph.initializer] == ["a", "c", "d"]
    low = next(n for n in model.graph.node if n.name == "min")
    assert list(low.input) == ["u", "a"]
    branch = next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")
    assert list(branch.node[0].input) == ["w", "a"]  # the branch reads the outer name
    assert not [i for i in model.graph.value_info if i.name == "b"]
    np.testing.assert_array_equal(run_duplicates(model), before)


def test_without_merge_equal_constants_stay_apart():
    model = duplicates_model()
    assert lift_constants(model) == Lifted(4)
    assert [t.name for t in model.graph.initializer] == ["a", "b", "c", "d"]


def test_an_annotated_constant_is_not_merged():
    model = duplicates_model()
    model.graph.quantization_annotation.add(tensor_name="b")
    assert lift_constants(model, merge=True) == Lifted(4, merged=0)


def test_optimize_file_merges_as_common_subexpressions_would(tmp_path: Path):
    """The file path merges equal Constants as it lifts them, the in-memory path lets
    CSE merge them after the first stage: the same graph and the same log."""
    model = duplicates_model()
    on_file, in_memory, written = on_file_and_in_memory(model, tmp_path)
    # b merged at load on the file path, by CSE in memory; c (float_data) by CSE on both
    assert _log(on_file, "duplicate_initializers") == _log(in_memory, "duplicate_initializers")
    assert _log(on_file, "duplicate_initializers") == (2, 2)
    assert on_file.before == in_memory.before and on_file.after == in_memory.after
    np.testing.assert_array_equal(run_duplicates(written), run_duplicates(model))


def test_no_merge_when_common_subexpressions_are_off(tmp_path: Path):
    src = tmp_path / "m.onnx"
    onnx.save(duplicates_model(), src)
    result = optimize_file(
        src, tmp_path / "out.onnx", verify=False, disable=["CommonSubexpressionFusionPass"]
    )
    written = onnx.load(str(tmp_path / "out.onnx"))
    assert {"a", "b"} <= {t.name for t in written.graph.initializer}
    assert not [s for s in result.log if s.pattern == "duplicate_initializers"]


def test_a_name_a_subgraph_declares_is_never_merged():
    """c1 and c2 are equal, but a Loop body's own input is named c2: renaming the body's
    readers of c2 would make them read the outer c1."""
    v = numpy_helper.from_array(np.array([1.0, 2.0], np.float32))
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Add", ["c2", "c2"], ["acc_out"])],
        "body",
        [h.make_tensor_value_info("it", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("c2", T.FLOAT, [2])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("acc_out", T.FLOAT, [2])],
    )  # fmt: skip
    nodes = [
        h.make_node("Constant", [], ["c1"], value=v),
        h.make_node("Constant", [], ["c2"], value=v),
        h.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array(3, np.int64))),
        h.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True))),
        h.make_node("Loop", ["n", "t", "x"], ["acc"], body=body),
        h.make_node("Mul", ["acc", "c1"], ["m"]),
        h.make_node("Mul", ["m", "c2"], ["y"]),
    ]
    graph = h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info("y", T.FLOAT, [2])]
    )  # fmt: skip
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8

    def run(m: onnx.ModelProto) -> np.ndarray:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": np.array([1.0, 1.0], np.float32)})[0]

    before = run(model)
    assert lift_constants(model, merge=True) == Lifted(4, merged=0)
    np.testing.assert_array_equal(run(model), before)


def test_equal_constants_over_the_shared_size_stay_apart(tmp_path: Path):
    """Two equal 6,000-byte Constants, one folded by a Neg, one by a Relu: each fold
    frees its own copy and both fold, as before the loader merged anything."""
    arr = numpy_helper.from_array(np.linspace(-1, 1, 1500).astype(np.float32))
    nodes = [
        h.make_node("Constant", [], ["c1"], value=arr),
        h.make_node("Constant", [], ["c2"], value=arr),
        h.make_node("Neg", ["c1"], ["n"]),
        h.make_node("Relu", ["c2"], ["r"]),
        h.make_node("Add", ["x", "n"], ["a"]),
        h.make_node("Add", ["a", "r"], ["y"]),
    ]
    graph = h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1500])],
        [h.make_tensor_value_info("y", T.FLOAT, [1500])],
    )  # fmt: skip
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert lift_constants(
        onnx.ModelProto.FromString(model.SerializeToString()), merge=True
    ) == Lifted(2)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    optimize_file(src, tmp_path / "out.onnx", verify=False)
    assert [n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node] == ["Add"]
