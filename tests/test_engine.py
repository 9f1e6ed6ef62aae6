"""The rewrite engine: worklist to fixpoint, loop guard, counts, reasons, subgraphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from helpers import model_from_text, op_types
from opfuse.errors import EngineError
from opfuse.rewrite import Builder, Match, Op, Options, PassContext, Rule, Var
from opfuse.rewrite.driver import REWRITE_BUDGET_MIN, Driver
from opfuse.rewrite.registry import PassInfo
from opfuse.rewrite.stats import EffectLog

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def run(model: ir.Model, *rules: Rule) -> EffectLog:
    log = EffectLog()
    ctx = PassContext(model, Options(), log)
    info = PassInfo("TestFusionPass", "test", rules=rules)
    Driver(ctx, [info]).run()
    return log


class NegNeg(Rule):
    """Neg(Neg(x)) ==> x"""

    name = "neg_neg"
    pattern = Op("Neg", Op("Neg", Var("x")))

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        return [m.value("x")]


class ReluToNeg(Rule):
    name = "relu_to_abs"
    pattern = Op("Relu", Var("x"))

    def rewrite(self, m, b, ctx):
        return [b.op("Abs", [m.value("x")])]


class AbsToRelu(Rule):
    name = "abs_to_relu"
    pattern = Op("Abs", Var("x"))

    def rewrite(self, m, b, ctx):
        return [b.op("Relu", [m.value("x")])]


def chain(n: int) -> ir.Model:
    body = "\n".join(f"t{i + 1} = Neg(t{i})" for i in range(n))
    return model_from_text(f"{HEAD}\ng (float[2] t0) => (float[2] t{n}) {{\n{body}\n}}")


def test_worklist_reaches_the_fixpoint_in_one_run():
    model = chain(8)
    log = run(model, NegNeg())
    # the last pair would forward the graph input to the graph output: refused
    assert op_types(model) == {"Neg": 2}
    stats = next(iter(log))
    assert stats.effected == 3
    assert any("graph input" in r for r in stats.reasons)


def test_odd_chain_keeps_one_node_and_output_name():
    model = chain(5)
    run(model, NegNeg())
    assert op_types(model) == {"Neg": 1}
    assert model.graph.outputs[0].name == "t5"


def test_rules_that_undo_each_other_stop_with_a_clear_error():
    model = model_from_text(
        f"{HEAD}\ng (float[2] x) => (float[2] y) {{\n t = Relu(x)\n y = Sigmoid(t)\n}}"
    )
    with pytest.raises(
        EngineError,
        match="did not converge.*relu_to_abs.*abs_to_relu|did not converge.*abs_to_relu.*relu_to_abs",
    ):
        run(model, ReluToNeg(), AbsToRelu())


def test_check_reason_is_recorded_and_nothing_changes():
    class Refuse(NegNeg):
        name = "refuse"

        def check(self, m, ctx):
            return "not today"

    model = chain(2)
    log = run(model, Refuse())
    stats = next(iter(log))
    assert (stats.matched, stats.effected) == (1, 0)
    assert stats.reasons == {"not today": 1}
    assert op_types(model) == {"Neg": 2}


def test_intermediate_with_another_consumer_is_refused_by_the_engine():
    model = model_from_text(
        f"{HEAD}\ng (float[2] x) => (float[2] y, float[2] z) {{\n a = Neg(x)\n y = Neg(a)\n z = Relu(a)\n}}"
    )
    log = run(model, NegNeg())
    stats = next(iter(log))
    assert stats.effected == 0
    assert any("another consumer" in r for r in stats.reasons)


def test_float_constant_of_another_dtype_is_refused():
    class AddConst(Rule):
        name = "add_const"
        pattern = Op("Add", Var("x"), Var("c"))
        constants = ("c",)

        def rewrite(self, m, b, ctx):
            return [m.value("x")]

    model = model_from_text(
        f"{HEAD}\ng (float[2] x) => (float[2] y) {{\n c = Constant<value=double[2] {{0.0, 0.0}}>()\n"
        " d = Cast<to=1>(c)\n y = Add(x, d)\n}"
    )
    log = run(model, AddConst())
    assert "c is not a constant" in next(iter(log)).reasons


def test_rewrites_apply_inside_subgraphs():
    then_branch = "then_g () => (float[2] a) { a = Neg(n1) }"
    model = model_from_text(
        f"""{HEAD}
        g (float[2] x, bool c) => (float[2] y) {{
          n0 = Neg(x)
          n1 = Neg(n0)
          y = If(c) <then_branch = {then_branch}, else_branch = else_g () => (float[2] b) {{
             e0 = Neg(x)
             e1 = Neg(e0)
             b = Relu(e1)
          }}>
        }}"""
    )
    log = run(model, NegNeg())
    assert next(iter(log)).effected == 2  # n0/n1 in the main graph, e0/e1 in the else body
    assert op_types(model) == {"If": 1, "Neg": 1, "Relu": 1}


def test_outer_value_used_by_a_subgraph_has_another_consumer():
    model = model_from_text(
        f"""{HEAD}
        g (float[2] x, bool c) => (float[2] y, float[2] z) {{
          n0 = Neg(x)
          y = Neg(n0)
          z = If(c) <then_branch = t () => (float[2] a) {{ a = Relu(n0) }},
                     else_branch = e () => (float[2] b) {{ b = Sigmoid(n0) }}>
        }}"""
    )
    log = run(model, NegNeg())
    assert next(iter(log)).effected == 0


def test_cost_is_linear_in_graph_size():
    """Rule attempts per node stay constant as the graph grows (no rescans per match)."""
    calls = {"n": 0}

    class Counting(NegNeg):
        name = "counting"

        def match(self, node, ctx):
            calls["n"] += 1
            return super().match(node, ctx)

    per_node = []
    for n in (200, 2000):
        calls["n"] = 0
        run(chain(n), Counting())
        per_node.append(calls["n"] / n)
    assert per_node[1] <= per_node[0] * 1.1
    assert REWRITE_BUDGET_MIN > 0


def test_builder_constants_are_registered_only_on_commit():
    class MakesConstThenRefuses(Rule):
        name = "refuse_late"
        pattern = Op("Neg", Var("x"))

        def rewrite(self, m, b, ctx):
            b.const(np.ones(2, np.float32), "never")
            return [m.value("x")]  # graph input -> graph output: refused by the engine

    model = model_from_text(f"{HEAD}\ng (float[2] x) => (float[2] y) {{\n y = Neg(x)\n}}")
    log = run(model, MakesConstThenRefuses())
    assert "never" not in model.graph.initializers
    assert next(iter(log)).effected == 0


def test_replacement_value_takes_the_replaced_type_and_shape():
    """A new node's output carries the type and shape of the value it replaces, so the
    rules after it see them before the next shape inference."""
    model = model_from_text(
        f"""{HEAD}
        g (float[2,3] x) => (float[2,3] y) {{
          r = Relu(x)
          y = Sigmoid(r)
        }}"""
    )
    relu_out = next(iter(model.graph)).outputs[0]
    relu_out.type, relu_out.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([2, 3])
    run(model, ReluToNeg())
    (abs_node,) = [n for n in model.graph if n.op_type == "Abs"]
    assert abs_node.outputs[0].dtype == ir.DataType.FLOAT
    assert list(abs_node.outputs[0].shape) == [2, 3]


class DropRelu(Rule):
    """Relu(x) ==> x (wrong, but it shows what the engine lets through)"""

    name = "drop_relu"
    pattern = Op("Relu", Var("x"))

    def rewrite(self, m, b, ctx):
        return [m.value("x")]


def test_branch_output_never_becomes_a_value_of_the_enclosing_graph():
    model = model_from_text(
        f"""{HEAD}
        g (float[2] x, bool c) => (float[2] z) {{
          r = Neg(x)
          z = If(c) <then_branch = t () => (float[2] a) {{ a = Relu(r) }},
                     else_branch = e () => (float[2] b) {{ b = Sigmoid(r) }}>
        }}"""
    )
    log = run(model, DropRelu())
    stats = next(iter(log))
    assert stats.effected == 0
    assert any("enclosing graph" in reason for reason in stats.reasons)


class ReluToIf(Rule):
    """Relu(x) ==> If(c) {Abs(Neg(Neg(x)))} else {Abs(x)}: a rewrite that adds control flow."""

    name = "relu_to_if"
    pattern = Op("Relu", Var("x"))

    def rewrite(self, m, b, ctx):
        x = m.value("x")
        first = ir.Node("", "Neg", [x])
        second = ir.Node("", "Neg", [first.outputs[0]])
        third = ir.Node("", "Abs", [second.outputs[0]])
        then_branch = ir.Graph([], third.outputs, nodes=[first, second, third], name="then_g")
        other = ir.Node("", "Abs", [x])
        else_branch = ir.Graph([], [other.outputs[0]], nodes=[other], name="else_g")
        cond = ctx.model.graph.inputs[1]
        return [b.op("If", [cond], {"then_branch": then_branch, "else_branch": else_branch})]


def test_a_flat_model_that_gains_control_flow_has_its_subgraphs_walked():
    model = model_from_text(f"{HEAD}\ng (float[2] x, bool c) => (float[2] y) {{ y = Relu(x) }}")
    ctx = PassContext(model, Options(), EffectLog())
    assert ctx.graphs() == [model.graph]  # flat: the main graph alone
    Driver(ctx, [PassInfo("MakeIfFusionPass", "test", rules=(ReluToIf(),))]).run()
    assert len(ctx.graphs()) == 3
    log = EffectLog()
    ctx.log = log
    Driver(ctx, [PassInfo("TestFusionPass", "test", rules=(NegNeg(),))]).run()
    assert next(iter(log)).effected == 1  # Neg(Neg(x)) inside the new then branch
    (node,) = model.graph
    assert [n.op_type for n in node.attributes["then_branch"].value] == ["Abs"]


def test_a_value_a_rewrite_makes_takes_the_replaced_name():
    """Lifted constants and fused outputs keep the tensor names of what they replace."""
    model = model_from_text(
        f"""{HEAD}
        g (float[2] x) => (float[2] y) {{
          c = Constant <value = float[2] {{1.0, 2.0}}> ()
          n0 = Neg(x)
          n1 = Neg(n0)
          r = Relu(n1)
          y = Add(r, c)
        }}"""
    )
    from opfuse.rules.constant_folding import ConstantNodeRule

    run(model, ConstantNodeRule(), NegNeg(), ReluToNeg())
    assert list(model.graph.initializers) == ["c"]  # not "c_1"
    (abs_node, add) = model.graph
    assert abs_node.outputs[0].name == "r"  # Relu's output, made again by Abs
    assert [v.name for v in add.inputs] == ["r", "c"]
    # NegNeg's replacement is a value that was already there: it keeps its own name
    assert abs_node.inputs[0].name == "x"


def test_a_replaced_value_whose_node_stays_keeps_its_name():
    class FirstOutputOnly(Rule):
        """Split's first output ==> Identity(x): the Split stays for its second output."""

        name = "first_output"
        pattern = Op("Split", Var("x"), Var("sizes"))

        def rewrite(self, m, b, ctx):
            return {m.root.outputs[0]: b.op("Identity", [m.value("x")])}

    model = model_from_text(
        f"""{HEAD}
        g (float[4] x) => (float[2] y, float[2] z) {{
          sizes = Constant <value = int64[2] {{2, 2}}> ()
          a, z = Split(x, sizes)
          y = Abs(a)
        }}"""
    )
    run(model, FirstOutputOnly())
    identity = next(n for n in model.graph if n.op_type == "Identity")
    assert identity.outputs[0].name != "a"  # "a" still names the Split's output
    split = next(n for n in model.graph if n.op_type == "Split")
    assert split.outputs[0].name == "a"


def test_fresh_names_walk_the_model_only_when_a_name_is_made():
    from opfuse.rewrite.builder import NameScope

    m = model_from_text(f"{HEAD}\ng (float[2] x) => (float[2] y) {{\n a = Neg(x)\n y = Neg(a)\n}}")
    m.graph.node(0).name = "n0"
    walked = []

    def graphs():
        walked.append(1)
        yield m.graph

    names = NameScope(graphs())
    names.forget_node("nothing yet")
    assert walked == []  # a pass that makes nothing never collects the names
    assert names.value("a") == "a_1" and names.value("x") == "x_1" and names.value("b") == "b"
    assert names.node("n0") == "n0_1" and names.node("n1") == "n1"
    assert walked == [1]
