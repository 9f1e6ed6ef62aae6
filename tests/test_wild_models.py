"""What models from the wild and the ONNX conformance suite found: a model importing only
ai.onnx.ml passes through, an opset below 7 is converted (and the summary says so), and
no evaluator failure crashes constant folding."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from helpers import assert_same_outputs, copy_model, op_types
from opfuse import cli
from opfuse.errors import OpfuseError
from opfuse.pipeline.conductor import optimize_file, optimize_model
from opfuse.rewrite.evaluate import EvaluationError, evaluate


def ml_only_model() -> onnx.ModelProto:
    """Binarizer (ai.onnx.ml) alone: no default-domain opset import at all."""
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    return model


def opset_6_model() -> onnx.ModelProto:
    """x -> Sigmoid -> Identity -> Relu -> y at opset 6 (ops onnxruntime still runs there)."""
    graph = helper.make_graph(
        [
            helper.make_node("Sigmoid", ["x"], ["a"]),
            helper.make_node("Identity", ["a"], ["b"]),
            helper.make_node("Relu", ["b"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    return model


def test_a_model_importing_only_ai_onnx_ml_passes_through(tmp_path: Path):
    src = tmp_path / "ml.onnx"
    onnx.save_model(ml_only_model(), str(src))
    result = optimize_file(src, tmp_path / "out.onnx")
    assert result.verify is not None and result.verify.ok
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Binarizer"]
    assert {o.domain for o in out.opset_import} == {"ai.onnx.ml"}


def test_an_opset_below_7_is_converted_and_the_summary_says_so(tmp_path, monkeypatch, capsys):
    src = tmp_path / "old.onnx"
    onnx.save_model(opset_6_model(), str(src))
    monkeypatch.setattr(
        sys, "argv", ["opfuse", "optimize", str(src), "-o", str(tmp_path / "o.onnx")]
    )
    cli.main()  # returns: exit status 0
    assert "opset 6 converted to 7" in capsys.readouterr().out.replace("\n", " ")
    out = onnx.load(str(tmp_path / "o.onnx"))
    onnx.checker.check_model(out, full_check=True)
    assert [o.version for o in out.opset_import if o.domain == ""] == [7]
    assert "Identity" not in [n.op_type for n in out.graph.node]  # and it was optimized


def test_an_opset_below_7_converts_in_memory_too():
    model = ir.from_proto(opset_6_model())
    original = copy_model(model)
    result = optimize_model(model)
    assert result.model.opset_imports[""] == 7
    assert op_types(result.model) == {"Sigmoid": 1, "Relu": 1}
    assert any("converted to 7" in n for n in result.notes)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    assert_same_outputs(original, result.model, feeds)


def optional_type_node() -> tuple[ir.Node, ir.Model]:
    """``Optional(type=tensor(float))`` with no input: all-constant by its inputs, and its
    TYPE_PROTO attribute is an object onnx-ir cannot hash (node/test_if_opt)."""
    optional = helper.make_node(
        "Optional", [], ["o"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, None)
    )
    graph = helper.make_graph(
        [optional, helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    (node,) = [n for n in model.graph if n.op_type == "Optional"]
    return node, model


def test_an_unhashable_attribute_is_evaluated_uncached_not_a_crash():
    node, model = optional_type_node()
    with pytest.raises(EvaluationError):  # an optional is not a tensor constant: not folded
        evaluate(node, [], model)


def test_any_evaluator_failure_leaves_the_node(monkeypatch):
    import opfuse.rewrite.evaluate as evaluate_module

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(evaluate_module, "_one_node_model", broken)
    node, model = optional_type_node()
    with pytest.raises(EvaluationError, match="boom"):
        evaluate(node, [], model)


def test_an_old_opset_the_converter_cannot_convert_is_refused_in_one_line(tmp_path):
    """Pad-1 (``paddings`` attribute) has no adapter to opset 7 in onnx's converter."""
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x"], ["y"], paddings=[0, 1, 0, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)])
    model.ir_version = 3
    src = tmp_path / "pad1.onnx"
    onnx.save_model(model, str(src))
    with pytest.raises(OpfuseError, match="cannot convert the model to opset 7") as error:
        optimize_file(src, tmp_path / "out.onnx", verify=False)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out.onnx").exists()


def test_an_old_opset_onnxruntime_cannot_load_is_verified_against_its_conversion(tmp_path):
    """onnxruntime has no Add-6 kernel: the reference is the model converted to opset 7."""
    w = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["w"], value=w),
            helper.make_node("Add", ["x", "w"], ["a"]),
            helper.make_node("Identity", ["a"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    src = tmp_path / "add6.onnx"
    onnx.save_model(model, str(src))
    result = optimize_file(src, tmp_path / "out.onnx")
    assert result.verify is not None and result.verify.ok
    assert any("verified against the model converted to opset 7" in n for n in result.notes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add6.onnx", "out.onnx"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x + np.arange(12).reshape(3, 4))


def test_a_conversion_onnxruntime_cannot_run_is_named_after_the_users_model(tmp_path):
    """PRelu-6 with one slope per channel: onnx's version converter keeps the slope's shape
    [C], which PRelu-7 broadcasts from the last axis, so the model verified against (the
    conversion, onnxruntime has no PRelu-6) cannot run. The one-line error names the
    user's model and the conversion, never the staging folder it was written to."""
    slope = helper.make_tensor("slope", TensorProto.FLOAT, [3], [0.1, 0.2, 0.3])
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 5])],
        [slope],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    model.graph.input.append(helper.make_tensor_value_info("slope", TensorProto.FLOAT, [3]))
    src = tmp_path / "prelu6.onnx"
    onnx.save_model(model, str(src))
    with pytest.raises(OpfuseError) as info:
        optimize_file(src, tmp_path / "out.onnx")
    message = str(info.value)
    assert message.startswith(f"{src} as onnx's version converter converts it: ")
    assert "opfuse-stage" not in message and "\n" not in message
    assert not (tmp_path / "out.onnx").exists()


def test_input_shapes_are_checked_on_the_conversion_of_a_model_onnxruntime_cannot_load(
    tmp_path,
):
    """--input-shape is checked before any work on a session of the model; below opset 7
    onnxruntime may have no kernel (BatchNormalization-6), so the check runs on the
    model's conversion to opset 7 (a wrong rank is still refused), and a file that is no
    model stays exit 2."""
    stats = [helper.make_tensor(n, TensorProto.FLOAT, [2], [1.0, 0.5]) for n in "sbmv"]
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 3])]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "sbmv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, 3])],
        stats,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    src = tmp_path / "bn6.onnx"
    onnx.save_model(model, str(src))
    optimize_file(src, tmp_path / "out.onnx", input_shapes={"x": [4, 2, 3]})
    onnx.checker.check_model(str(tmp_path / "out.onnx"))
    with pytest.raises(OpfuseError, match="has rank 3"):
        optimize_file(src, tmp_path / "o2.onnx", input_shapes={"x": [4, 2]})
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(OpfuseError, match="cannot load"):  # not protobuf's DecodeError
        optimize_file(bad, tmp_path / "o3.onnx", input_shapes={"x": [1]})
