"""Models with parts onnx-ir cannot hold (map types, opaque types, sparse tensors) are
optimized around those parts, never refused or crashed on, and the parts come back
exactly as they were (opfuse.model.set_aside)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from opfuse.model import set_aside as sa
from opfuse.pipeline.conductor import optimize_file

ML = "ai.onnx.ml"


def zipmap_classifier() -> onnx.ModelProto:
    """skl2onnx's shape of a classifier: scaling, LinearClassifier, Normalizer, ZipMap
    (whose output is a sequence of maps), with a Mul/Add by neutral constants to remove."""
    probabilities = h.make_value_info(
        "probabilities",
        h.make_sequence_type_proto(
            h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, []))
        ),
    )
    nodes = [
        h.make_node("Mul", ["X", "one"], ["Xs"], name="scale"),
        h.make_node("Add", ["Xs", "zero"], ["Xa"], name="shift"),
        h.make_node(
            "LinearClassifier",
            ["Xa"],
            ["label", "scores"],
            domain=ML,
            name="linear",
            classlabels_ints=[0, 1, 2],
            coefficients=[float(i) / 10 for i in range(12)],
            intercepts=[0.1, 0.2, 0.3],
            multi_class=1,
        ),
        h.make_node("Normalizer", ["scores"], ["probs"], domain=ML, name="norm", norm="L1"),
        h.make_node(
            "ZipMap",
            ["probs"],
            ["probabilities"],
            domain=ML,
            name="zipmap",
            classlabels_int64s=[0, 1, 2],
        ),
    ]
    graph = h.make_graph(
        nodes,
        "classifier",
        [h.make_tensor_value_info("X", T.FLOAT, [None, 4])],
        [h.make_tensor_value_info("label", T.INT64, [None]), probabilities],
        initializer=[
            h.make_tensor("one", T.FLOAT, [], [1.0]),
            h.make_tensor("zero", T.FLOAT, [], [0.0]),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 1)])
    onnx.checker.check_model(model, full_check=True)
    return model


def sparse_model() -> onnx.ModelProto:
    """A sparse initializer and a Constant with sparse_value, each feeding an Add."""

    def sparse(name: str, first: float) -> onnx.SparseTensorProto:
        values = h.make_tensor(name, T.FLOAT, [2], [first, 2.0])
        return h.make_sparse_tensor(values, h.make_tensor("i", T.INT64, [2], [0, 3]), [4])

    graph = h.make_graph(
        [
            h.make_node("Add", ["X", "w"], ["Y"], name="add_w"),
            h.make_node(
                "Constant", [], ["c"], name="const_c", sparse_value=sparse("c_values", 3.0)
            ),
            h.make_node("Relu", ["Y"], ["R"], name="relu"),
            h.make_node("Add", ["R", "c"], ["Z"], name="add_c"),
        ],
        "sparse",
        [h.make_tensor_value_info("X", T.FLOAT, [4])],
        [h.make_tensor_value_info("Z", T.FLOAT, [4])],
        sparse_initializer=[sparse("w", 1.0)],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def map_input_model() -> onnx.ModelProto:
    """DictVectorizer: a map input, a tensor output, then an Identity to remove."""
    graph = h.make_graph(
        [
            h.make_node(
                "DictVectorizer", ["M"], ["V"], domain=ML, name="dv", int64_vocabulary=[1, 2, 3]
            ),
            h.make_node("Identity", ["V"], ["Y"], name="identity"),
        ],
        "maps",
        [
            h.make_value_info(
                "M", h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, []))
            )
        ],
        [h.make_tensor_value_info("Y", T.FLOAT, [1, 3])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 1)])
    onnx.checker.check_model(model)
    return model


def sequence_output_model() -> onnx.ModelProto:
    """A sequence-of-tensors output (onnx-ir holds it: nothing to set aside)."""
    graph = h.make_graph(
        [
            h.make_node("Mul", ["X", "one"], ["Y"], name="mul"),
            h.make_node("SplitToSequence", ["Y"], ["S"], name="split", axis=0),
        ],
        "seq",
        [h.make_tensor_value_info("X", T.FLOAT, [2, 3])],
        [
            h.make_value_info(
                "S", h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None))
            )
        ],
        initializer=[h.make_tensor("one", T.FLOAT, [], [1.0])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def opfuse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opfuse", *args], capture_output=True, text=True, timeout=300
    )


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def test_a_zipmap_classifier_is_optimized_and_its_map_output_kept(tmp_path):
    src = _save(zipmap_classifier(), tmp_path / "clf.onnx")
    result = optimize_file(src, tmp_path / "out.onnx")
    assert result.verify is not None and result.verify.ok
    assert result.before["Mul"] == 1 and result.after["Mul"] == 0  # the float part optimized
    assert any("'probabilities'" in part and "map" in part for part in result.left_alone)
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out, full_check=True)
    original = zipmap_classifier()
    assert out.graph.output[1] == original.graph.output[1]  # the map type, exactly
    assert [n.name for n in out.graph.node] == ["linear", "norm", "zipmap"]
    feeds = {"X": np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)}
    no_opt = ort.SessionOptions()
    no_opt.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(src, no_opt).run(None, feeds)
    got = ort.InferenceSession(str(tmp_path / "out.onnx"), no_opt).run(None, feeds)
    assert np.array_equal(want[0], got[0]) and want[1] == got[1]


def test_the_cli_says_what_was_left_alone(tmp_path):
    src = _save(zipmap_classifier(), tmp_path / "clf.onnx")
    run = opfuse("optimize", src, "-o", str(tmp_path / "out.onnx"))
    assert run.returncode == 0, run.stderr
    assert "left alone: output 'probabilities' (seq(map(int64, tensor(float))))" in run.stdout
    run = opfuse("optimize", src, "-o", str(tmp_path / "o2.onnx"), "--format", "json")
    report = json.loads(run.stdout)
    assert len(report["left_alone"]) == 1 and "map" in report["left_alone"][0]


@pytest.mark.parametrize("command", ["verify", "advise", "tune"])
def test_other_commands_take_a_map_model(tmp_path, command):
    src = _save(zipmap_classifier(), tmp_path / "clf.onnx")
    args = {
        "verify": ["verify", src, _save(zipmap_classifier(), tmp_path / "same.onnx")],
        "advise": ["advise", src, "--format", "json", "-o", str(tmp_path / "a.json")],
        "tune": ["tune", src, "-o", str(tmp_path / "t.onnx"), "--budget", "3"],
    }[command]
    run = opfuse(*args)
    assert run.returncode == 0, run.stderr


def test_a_map_input_passes_through(tmp_path):
    src = _save(map_input_model(), tmp_path / "m.onnx")
    result = optimize_file(src, tmp_path / "out.onnx", verify=False)
    assert result.after["Identity"] == 0
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out)
    assert out.graph.input[0] == map_input_model().graph.input[0]
    feeds = {"M": {1: 2.0, 3: 5.0}}
    want = ort.InferenceSession(src).run(None, feeds)[0]
    got = ort.InferenceSession(str(tmp_path / "out.onnx")).run(None, feeds)[0]
    assert np.array_equal(want, got)


def test_a_sequence_output_is_optimized(tmp_path):
    src = _save(sequence_output_model(), tmp_path / "s.onnx")
    result = optimize_file(src, tmp_path / "out.onnx")
    assert result.verify is not None and result.verify.ok and result.after["Mul"] == 0
    assert result.left_alone == []


def test_sparse_tensors_are_used_dense_and_written_sparse_while_unchanged(tmp_path):
    src = _save(sparse_model(), tmp_path / "sp.onnx")
    result = optimize_file(src, tmp_path / "out.onnx")
    assert result.verify is not None and result.verify.ok
    assert len(result.left_alone) == 2
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out)
    # no pass changed the tensors (a Relu sits between): both come back sparse (constant
    # folding made the Constant an initializer under a new name: sparse under that name)
    original = sparse_model().graph
    want_w, want_c = original.sparse_initializer[0], original.node[1].attribute[0].sparse_tensor
    written = {s.values.name: s for s in out.graph.sparse_initializer}
    assert written.pop("w") == want_w  # byte for byte
    [(name, got_c)] = written.items()
    assert got_c.indices == want_c.indices and list(got_c.dims) == list(want_c.dims)
    assert np.array_equal(
        onnx.numpy_helper.to_array(got_c.values), onnx.numpy_helper.to_array(want_c.values)
    )
    assert not out.graph.initializer


def test_set_aside_and_restore_round_trip_exactly():
    for model in (zipmap_classifier(), sparse_model(), map_input_model()):
        copy, aside = sa.set_aside(model)
        assert aside and copy is not model
        sa.restore(copy, aside)
        assert copy == model


def test_nothing_is_copied_without_a_part_to_set_aside():
    model = sequence_output_model()
    copy, aside = sa.set_aside(model)
    assert copy is model and not aside


def test_a_sparse_tensor_too_large_to_make_dense_passes_the_model_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(sa, "DENSE_LIMIT", 8)  # the 16-byte tensors are now "too large"
    src = _save(sparse_model(), tmp_path / "sp.onnx")
    result = optimize_file(src, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == (tmp_path / "sp.onnx").read_bytes()
    assert result.passes == [] and "written as it was read" in result.left_alone[-1]
