"""Shape annotations kept through the optimizer: every value the input described with a
value_info and that still exists is written with one (on a BERT encoder as the dynamo
exporter writes it: the share kept was 0 of 70 before), the values the passes made get
theirs in such a model, a model that described none stays without (it never grows), and
a value whose type the optimized graph lost is said in the summary."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from opfuse.model import io
from opfuse.model.value_info import Declared, described_kept, untyped_declared
from opfuse.pipeline.conductor import optimize_file
from transformer_models import dynamo_bert, gpt2_mlp, node_output_value_info


def _optimized(tmp_path, proto: onnx.ModelProto, **keywords) -> tuple[str, onnx.ModelProto]:
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(proto, str(src))
    result = optimize_file(src, dst, **keywords)
    assert result.verify is not None and result.verify.ok
    return str(src), onnx.load_model(str(dst))


def test_a_dynamo_export_keeps_every_value_info_of_its_surviving_values(tmp_path):
    original = dynamo_bert()
    _, output = _optimized(tmp_path, original)
    surviving, kept = described_kept(original, output)
    assert surviving >= 60  # most of the 75 described values: the passes removed a few
    assert kept == surviving  # before: 0
    before, after = node_output_value_info(original), node_output_value_info(output)
    assert all(after[name] == before[name] for name in after if name in before)


def test_values_the_passes_made_get_their_value_info_in_a_described_model(tmp_path):
    original = onnx.shape_inference.infer_shapes(gpt2_mlp(), data_prop=True)
    _, output = _optimized(tmp_path, original)
    made = set(node_output_value_info(output)) - set(node_output_value_info(original))
    assert "cube/square_out" in made  # the lone x^3 became Mul(Mul(y, y), y)
    square = node_output_value_info(output)["cube/square_out"].tensor_type
    assert [d.dim_param or d.dim_value for d in square.shape.dim] == ["batch", "seq", 32]


def test_a_model_that_described_nothing_gets_no_value_info(tmp_path):
    original = gpt2_mlp()
    assert not original.graph.value_info
    _, output = _optimized(tmp_path, original)
    assert not output.graph.value_info


def test_declared_keeps_what_the_input_described_and_new_values_of_a_described_model():
    declared = Declared(described=frozenset({"a"}), values=frozenset({"a", "b"}))
    assert declared.keeps("a") and declared.keeps("new")
    assert not declared.keeps("b")  # the input left it undescribed: so does the output
    assert not declared.keeps("") and not declared.keeps(None)
    nothing = Declared(described=frozenset(), values=frozenset({"a", "b"}))
    assert not nothing.keeps("a") and not nothing.keeps("new")


def test_a_value_whose_type_is_lost_is_named(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save_model(dynamo_bert(), str(src))
    model = io.load_model(src)
    assert untyped_declared(model) == []
    value = next(out for node in model.graph for out in node.outputs if out.name == "l0/probs")
    value.type, value.shape = None, None
    assert untyped_declared(model) == ["l0/probs"]
    assert untyped_declared(ir.from_proto(dynamo_bert())) == []  # not read by opfuse


def test_the_summary_says_why_a_value_info_is_not_written(tmp_path, monkeypatch):
    from opfuse.pipeline import conductor

    def untyped(model: ir.Model) -> list[str]:
        return ["l0/probs", "l0/scores", "l1/probs", "l1/scores"]

    monkeypatch.setattr(conductor, "untyped_declared", untyped)
    src = tmp_path / "in.onnx"
    onnx.save_model(dynamo_bert(), str(src))
    result = optimize_file(src, tmp_path / "out.onnx")
    assert (
        "4 shape annotations (value_info) of the input not written: the optimized graph no "
        "longer knows the type of 'l0/probs', 'l0/scores', 'l1/probs', ..."
    ) in result.notes
