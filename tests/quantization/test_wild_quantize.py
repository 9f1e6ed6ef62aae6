"""What ``opfuse quantize`` on onnx's conformance models found (tests/quantize_conformance.py
runs them all): models of IR 3 and opsets onnxruntime cannot load, models of other domains
only, float16 parts, an opset without Q/DQ kernels, unnamed nodes, a quantizer output out
of topological order, outputs whose shape depends on the data, sequences and strings."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import opfuse
from opfuse.model.sessions import open_session
from opfuse.pipeline.opset import convert_opset, raise_ir_version
from opfuse.quantization import flow, ort_backend, quantizer_input
from opfuse.quantization.accuracy import compare_outputs
from test_wild_models import ml_only_model

RNG = np.random.default_rng(0)


def feeds(name: str, shape: tuple[int, ...], n: int = 12, dtype=np.float32) -> list[dict]:
    return [{name: RNG.standard_normal(shape).astype(dtype)} for _ in range(n)]


def torch_legacy_conv() -> onnx.ModelProto:
    """A 2016-era torch export: IR 3, opset 6, weights listed as graph inputs, a Conv and a
    BatchNormalization-6 (which onnxruntime has no kernel for)."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    stats = [
        numpy_helper.from_array(v.astype(np.float32), n)
        for n, v in [
            ("scale", RNG.uniform(0.5, 1.5, 4)),
            ("bias", RNG.standard_normal(4)),
            ("mean", RNG.standard_normal(4)),
            ("var", RNG.uniform(0.5, 1.5, 4)),
        ]
    ]
    graph = h.make_graph(
        [
            h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            h.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
        ],
        "legacy",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])]
        + [h.make_tensor_value_info(t.name, T.FLOAT, list(t.dims)) for t in [w, *stats]],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])],
        [w, *stats],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 6)])
    model.ir_version = 3
    return model


def test_an_ir_3_model_onnxruntime_cannot_load_is_quantized():
    """Its reference outputs come from the model converted to opset 7 (onnxruntime has no
    BatchNormalization-6), and the IR version rises with the opset: at IR 3 each scale
    the quantizer adds had to be a graph input (onnx.checker refused the int8 model)."""
    legacy = torch_legacy_conv()
    with pytest.raises(Exception, match="BatchNormalization"):
        open_session(legacy, graph_opt="off")
    from opfuse.runtime.settings import RuntimeSettings

    result = opfuse.quantize(
        legacy,
        calibration=feeds("x", (1, 3, 8, 8)),
        max_drop="off",
        runtime_settings=RuntimeSettings(bench_seconds=0.1),
        write_slower=True,  # a toy: written whatever its speed
    )
    assert result.speed is not None  # the float original timed as its conversion
    assert any("judged and timed as onnx's version converter" in w for w in result.warnings)
    made = result.model
    onnx.checker.check_model(made, full_check=True)
    assert made.ir_version >= 7
    assert [i.name for i in made.graph.input][0] == "x"
    assert "QuantizeLinear" in {n.op_type for n in made.graph.node}
    open_session(made).run(None, feeds("x", (1, 3, 8, 8), 1)[0])


def test_the_ir_version_rises_with_a_converted_opset_and_never_falls():
    converted = ir.to_proto(convert_opset(ir.from_proto(torch_legacy_conv()), 13))
    assert converted.ir_version == 7
    onnx.checker.check_model(converted, full_check=True)
    recent = torch_legacy_conv()
    recent.opset_import[0].version, recent.ir_version = 13, 10
    raise_ir_version(recent)
    assert recent.ir_version == 10


def test_a_model_of_another_domain_only_passes_through_said():
    """onnxruntime's quantizer refuses a model with no ai.onnx import ("Failed to find
    proper ai.onnx domain"): it has nothing to quantize there, and is not called."""
    result = opfuse.quantize(ml_only_model(), calibration=feeds("x", (2, 3)), benchmark=False)
    assert [n.op_type for n in result.model.graph.node] == ["Binarizer"]
    assert any("no operator of the default domain" in n for n in result.notes)


def half_and_single() -> onnx.ModelProto:
    """x -> MatMul (float32 weight) -> Cast to float16 -> Mul (float16) -> Cast -> y."""
    w = numpy_helper.from_array(RNG.standard_normal((8, 8)).astype(np.float32), "w")
    k = numpy_helper.from_array(np.full((8,), 0.5, np.float16), "k")
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            h.make_node("Cast", ["m"], ["mh"], to=T.FLOAT16),
            h.make_node("Mul", ["mh", "k"], ["ph"]),
            h.make_node("Cast", ["ph"], ["y"], to=T.FLOAT),
        ],
        "half",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
        [w, k],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_float16_nodes_stay_float_and_the_rest_is_quantized():
    """onnxruntime's quantizer, made for float32, makes a float16 part whose types
    disagree (onnxruntime refuses the model): those nodes stay float, the float32 MatMul is
    quantized, and the nodes without a name keep none."""
    model = half_and_single()
    assert quantizer_input.other_float_nodes(quantizer_input.with_names(model)[0]) == [
        "Cast:mh",
        "Mul:ph",
        "Cast:y",
    ]
    result = opfuse.quantize(model, calibration=feeds("x", (4, 8)), benchmark=False)
    made = result.model
    assert any("3 nodes read or write float16" in n for n in result.notes)
    mul = next(n for n in made.graph.node if n.op_type == "Mul")
    assert mul.name == "" and "ph" in mul.output  # float, unnamed as it was
    mm = next(n for n in made.graph.node if n.name == "mm")
    made_by = {o: n.op_type for n in made.graph.node for o in n.output}
    assert [made_by.get(i) for i in mm.input] == ["DequantizeLinear", "DequantizeLinear"]
    open_session(made).run(None, feeds("x", (4, 8), 1)[0])


def matmul(opset: int = 17) -> onnx.ModelProto:
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
        [numpy_helper.from_array(RNG.standard_normal((8, 8)).astype(np.float32), "w")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def test_a_float32_model_has_no_other_float_nodes():
    assert quantizer_input.other_float_nodes(matmul()) == []


def test_an_opset_without_qdq_kernels_gets_the_contrib_ones(monkeypatch):
    """onnxruntime 1.32 has no QuantizeLinear at opset 28 (onnx's newest); the
    com.microsoft ones run at any opset. Made to happen at opset 17 here, so the test does
    not depend on which opsets the installed onnxruntime has kernels for."""
    monkeypatch.setattr(quantizer_input, "qdq_kernels_at", lambda opset: opset != 17)
    result = opfuse.quantize(matmul(), calibration=feeds("x", (4, 8)), benchmark=False)
    assert any("com.microsoft domain" in n for n in result.notes)
    domains = {n.domain for n in result.model.graph.node if "Quantize" in n.op_type}
    assert domains == {"com.microsoft"}
    open_session(result.model).run(None, feeds("x", (4, 8), 1)[0])


def test_onnxruntime_has_qdq_kernels_at_opset_13():
    assert quantizer_input.qdq_kernels_at(13)


def test_names_are_invented_only_for_unnamed_nodes_and_taken_off_again():
    model = half_and_single()
    named, invented = quantizer_input.with_names(model)
    assert invented == {"Cast:mh", "Mul:ph", "Cast:y"} and named.graph.node[0].name == "mm"
    assert all(n.name == "" for n in model.graph.node[1:])  # the model given is not touched
    back = quantizer_input.without_names(named, invented)
    assert [n.name for n in back.graph.node] == ["mm", "", "", ""]
    again = quantizer_input.with_names(back)[0]
    assert again is not back
    assert quantizer_input.with_names(again) == (again, set())  # all named: nothing to do


def test_a_branch_reading_a_tensor_made_later_is_sorted():
    """onnxruntime's quantizer sorts by the nodes' own inputs: an If whose branch reads a
    tensor made after it stays before it (onnxruntime runs it; onnx.checker refuses it)."""
    branch = h.make_graph(
        [h.make_node("Identity", ["t"], ["o"])],
        "then",
        [],
        [h.make_tensor_value_info("o", T.FLOAT, [2])],
    )
    graph = h.make_graph(
        [
            h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
            h.make_node("Neg", ["x"], ["t"]),
        ],
        "g",
        [
            h.make_tensor_value_info("c", T.BOOL, []),
            h.make_tensor_value_info("x", T.FLOAT, [2]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    made = flow.sorted_graph(model)
    onnx.checker.check_model(made)
    assert [n.op_type for n in made.graph.node] == ["Neg", "If"]
    assert flow.sorted_graph(made).graph == made.graph  # idempotent


def test_outputs_whose_shape_depends_on_the_data_are_compared():
    """A count that differs between samples (boxes kept), and between the two models on
    one sample: what one has and the other lacks is all error."""
    ref = [[np.ones((3, 4), np.float32)], [np.ones((5, 4), np.float32)]]
    same = compare_outputs(["boxes"], ref, ref)[0]
    assert same.sqnr_db == float("inf")
    got = [[np.ones((3, 4), np.float32)], [np.ones((4, 4), np.float32)]]
    fewer = compare_outputs(["boxes"], ref, got)[0]
    assert fewer.samples_sqnr_db[0] == float("inf")
    assert fewer.samples_sqnr_db[1] == pytest.approx(10 * np.log10(20 / 4))
    flat = [[np.ones((2, 3), np.float32)], [np.ones((2, 5), np.float32)]]
    assert compare_outputs(["m"], flat, flat)[0].sqnr_db == float("inf")


def test_sequence_and_string_outputs_are_compared():
    seq = [[[np.ones(3, np.float32), np.ones(2, np.float32)]]]
    half = [[[np.ones(3, np.float32), np.zeros(2, np.float32)]]]
    assert compare_outputs(["s"], seq, seq)[0].sqnr_db == float("inf")
    assert compare_outputs(["s"], seq, half)[0].sqnr_db == pytest.approx(10 * np.log10(5 / 2))
    labels = [[np.array(["cat", "dog"])]]
    other = [[np.array(["cat", "cow"])]]
    assert compare_outputs(["l"], labels, labels)[0].top1 == 1.0
    differ = compare_outputs(["l"], labels, other)[0]
    assert differ.top1 == 0.5 and differ.sqnr_db == pytest.approx(10 * np.log10(2))


def test_integer_outputs_are_judged_by_exact_agreement():
    """A classifier's label (int64) off by one is a wrong answer whatever its SQNR (an
    sklearn MLP's label output read 25.5 dB, and passed the SQNR floor, with labels
    changed): the share of elements that agree is its top-1, which the gate holds."""
    from opfuse.quantization.gate import Gate

    ref = [[np.array([3], np.int64)] for _ in range(99)] + [[np.array([4], np.int64)]]
    got = [[np.array([3], np.int64)] for _ in range(98)] + [[np.array([5], np.int64)]] * 2
    figures = compare_outputs(["label"], ref, got)
    assert figures[0].top1 == pytest.approx(0.98) and figures[0].rows == 100
    assert figures[0].sqnr_db > 20  # what the SQNR floor would have passed
    assert Gate().misses(figures) == ["label: top-1 agreement 98.0% < 99.0%"]
    flags = [[np.array([True, False])]]
    assert compare_outputs(["mask"], flags, flags)[0].top1 == 1.0


def test_an_already_quantized_model_is_refused_with_what_to_give(tmp_path):
    """The quantizer would quantize it again (duplicate node names: a model onnxruntime
    refuses, exit 3 before); exit 2, nothing written, and what to give instead."""
    from opfuse.errors import OpfuseError

    made = opfuse.quantize(
        matmul(), calibration=feeds("x", (4, 8)), benchmark=False, max_drop="off"
    )
    int8 = made.model
    src = tmp_path / "int8.onnx"
    onnx.save_model(int8, str(src))
    out = tmp_path / "again.onnx"
    with pytest.raises(
        OpfuseError, match=r"already quantized \(.*QuantizeLinear.*float model"
    ) as info:
        opfuse.quantize(src, out, calibration=feeds("x", (4, 8)), benchmark=False)
    assert not out.exists()
    assert type(info.value) is OpfuseError  # exit 2 (bad input), not QuantizeInternalError
    assert quantizer_input.quantized_ops(matmul()) == ""


def zipmap_classifier() -> onnx.ModelProto:
    """skl2onnx's default classifier form: X -> MatMul -> Softmax -> ZipMap (a sequence of
    maps, a type onnx-ir cannot hold) and ArgMax as the label."""
    w = numpy_helper.from_array(RNG.standard_normal((8, 3)).astype(np.float32), "w")
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["X", "w"], ["logits"], name="mm"),
            h.make_node("Softmax", ["logits"], ["probabilities"], axis=1, name="sm"),
            h.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0, name="am"),
            h.make_node(
                "ZipMap",
                ["probabilities"],
                ["output_probability"],
                domain="ai.onnx.ml",
                classlabels_int64s=[0, 1, 2],
                name="zm",
            ),
        ],
        "classifier",
        [h.make_tensor_value_info("X", T.FLOAT, [None, 8])],
        [
            h.make_tensor_value_info("label", T.INT64, [None]),
            h.make_value_info(
                "output_probability",
                h.make_sequence_type_proto(
                    h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, []))
                ),
            ),
        ],
        [w],
    )
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 1)]
    )
    model.ir_version = 8
    return model


def test_a_zipmap_classifier_quantizes_and_its_label_is_judged():
    """The clean-up's sort read the int8 model into onnx-ir, which holds no map types
    (SerdeError, exit 3); only a model with subgraphs is sorted, and through the
    set-aside reader."""
    result = opfuse.quantize(
        zipmap_classifier(), calibration=feeds("X", (4, 8)), benchmark=False, max_drop="off"
    )
    figures = {a.name: a for a in result.accuracy}
    assert figures["label"].top1 is not None and figures["label"].rows == 4 * 3
    assert "label: SQNR" in result.summary() and "top-1" in figures["label"].line()
    assert json.loads(json.dumps(result.to_json()))["accuracy"]
    made = result.model
    assert [o.name for o in made.graph.output] == ["label", "output_probability"]
    run = open_session(made).run(None, feeds("X", (4, 8), 1)[0])
    assert len(run[1]) == 4 and set(run[1][0]) == {0, 1, 2}


def test_rows_only_one_model_has_disagree_and_the_sqnr_has_a_floor():
    """Zero padding must not agree with a zero row: the float model keeps no box where the
    int8 model keeps two; a label output one element longer."""
    ref = [[np.zeros((0, 3), np.float32)], [np.eye(3, dtype=np.float32)[:2]]]
    got = [[np.ones((2, 3), np.float32)], [np.eye(3, dtype=np.float32)[:2]]]
    figures = compare_outputs(["boxes"], ref, got)[0]
    assert figures.top1 == pytest.approx(2 / 4) and figures.rows == 4
    assert figures.samples_sqnr_db[0] == -100.0  # all error, not -3000 dB
    labels = compare_outputs(
        ["ids"], [[np.array([1, 2], np.int64)]], [[np.array([1, 2, 3], np.int64)]]
    )[0]
    assert labels.top1 == 0.0 and labels.rows == 3
    empty = compare_outputs(
        ["none"], [[np.zeros((0, 4), np.float32)]] * 2, [[np.zeros((0, 4), np.float32)]] * 2
    )[0]
    assert empty.top1 is None and json.dumps(empty.to_json())


def test_weight_only_int8_is_not_already_quantized():
    """int8 weights an exporter stores behind a DequantizeLinear (weight-only
    quantization): the activations are float, and the quantizer quantizes them."""
    w = RNG.integers(-127, 128, (8, 8)).astype(np.int8)
    graph = h.make_graph(
        [
            h.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="dq"),
            h.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        "weight_only",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.float32(0.01), "ws")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert quantizer_input.quantized_ops(model) == ""
    result = opfuse.quantize(model, calibration=feeds("x", (4, 8)), benchmark=False, max_drop="off")
    open_session(result.model).run(None, feeds("x", (4, 8), 1)[0])


def test_an_ir_3_model_not_converted_is_raised_for_the_quantizer():
    """Per-tensor weights need no opset 13, so an IR-3 model at opset 9 is not converted;
    its IR version still has to rise for the scales the quantizer adds."""
    legacy = torch_legacy_conv()
    legacy.graph.node.pop()  # the Conv alone
    legacy.graph.output[0].name = "c"
    legacy.opset_import[0].version = 9
    made = opfuse.quantize(
        legacy,
        calibration=feeds("x", (1, 3, 8, 8)),
        benchmark=False,
        max_drop="off",
        per_channel=False,
    ).model
    onnx.checker.check_model(made, full_check=True)
    assert made.ir_version >= 4 and made.opset_import[0].version < 13


def test_a_workaround_on_an_unnamed_node_stays_out_of_the_users_exclude(monkeypatch):
    """The quantizer raised on an unnamed node, named here for it: kept in float for this
    quantization and said by what it makes, never added to the --exclude list a command
    line prints (the invented name is no node of the user's model)."""
    model = matmul()
    model.graph.node[0].name = ""
    real = ort_backend._quantize_once

    def raising(model, samples, options, exclude, extra, cache=None):
        node = model.graph.node[0]  # a frame local the workaround reads
        if node.name not in exclude:
            raise ValueError("cannot quantize this")
        return real(model, samples, options, exclude, extra, cache)

    monkeypatch.setattr(ort_backend, "_quantize_once", raising)
    exclude: list[str] = []
    notes: list[str] = []
    made = ort_backend.quantize_proto(
        model, feeds("x", (4, 8)), flow.QuantOptions(), exclude, name="m", notes=notes
    )
    assert exclude == [] and made.graph.node[0].name == ""
    assert any("the unnamed node making y" in n for n in notes), notes
