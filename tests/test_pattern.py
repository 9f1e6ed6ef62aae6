"""The pattern language: DAG references, alternatives, predicates, commutation, typed
match state, and the engine's dry run (Driver.explain)."""

from __future__ import annotations

import onnx_ir as ir
from hypothesis import HealthCheck, given, settings

from fuzz_graphs import graphs
from helpers import model_from_text, op_types
from opfuse.rewrite import Builder, Const, Match, Op, Options, Or, PassContext, Rule, Var
from opfuse.rewrite.driver import Driver
from opfuse.rewrite.registry import PassInfo
from opfuse.rewrite.stats import EffectLog

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def graph(body: str, inputs: str = "float[2, 3] x", outputs: str = "float[2, 3] y"):
    return model_from_text(f"{HEAD}\ng ({inputs}) => ({outputs}) {{\n{body}\n}}")


def matches(pattern: Op, model: ir.Model) -> list[Match]:
    """The matches of ``pattern`` rooted at each node of the main graph."""
    found = []
    for node in model.graph:
        m = Match(node)
        if pattern.match_node(node, m):
            found.append(m)
    return found


EXP = Op("Exp", Var("x"), name="exp")
SOFTMAX_LIKE = Op("Div", EXP, Op("ReduceSum", EXP, variadic=True, name="sum"), name="div")


def test_a_named_op_used_twice_is_one_node():
    model = graph("e = Exp(x)\n s = ReduceSum(e)\n y = Div(e, s)")
    (m,) = matches(SOFTMAX_LIKE, model)
    assert [n.op_type for n in m.nodes] == ["Div", "Exp", "ReduceSum"]
    assert m.value("x") is model.graph.inputs[0]


def test_a_named_op_used_twice_refuses_two_different_nodes():
    model = graph("e = Exp(x)\n f = Exp(x)\n s = ReduceSum(f)\n y = Div(e, s)")
    assert matches(SOFTMAX_LIKE, model) == []


def test_or_binds_the_alternative_that_matched():
    d = Var("d")
    square = Or(Op("Pow", d, Const(value=2.0), name="pow"), Op("Mul", d, d, name="mul"))
    pattern = Op("Sqrt", square)
    by_pow = graph(
        "two = Constant <value = float {2.0}> ()\n p = Pow(x, two)\n y = Sqrt(p)",
    )
    by_mul = graph("p = Mul(x, x)\n y = Sqrt(p)")
    not_square = graph("p = Mul(x, z)\n y = Sqrt(p)", inputs="float[2, 3] x, float[2, 3] z")
    cube = graph("three = Constant <value = float {3.0}> ()\n p = Pow(x, three)\n y = Sqrt(p)")
    (m,) = matches(pattern, by_pow)
    assert "pow" in m and "mul" not in m
    (m,) = matches(pattern, by_mul)
    assert "mul" in m and "pow" not in m
    assert matches(pattern, not_square) == []
    assert matches(pattern, cube) == []


def test_const_value_and_where_predicates():
    model = graph(
        "h = Constant <value = float[3] {0.5, 0.5, 0.5}> ()\n y = Mul(x, h)",
    )
    assert matches(Op("Mul", Var("x"), Const(value=0.5)), model)
    assert not matches(Op("Mul", Var("x"), Const(value=0.25)), model)
    assert matches(Op("Mul", Var("x"), Const(value=0.5000001, rtol=1e-5)), model)
    assert not matches(Op("Mul", Var("x"), Const(where=lambda a: a.ndim == 0)), model)
    assert matches(Op("Mul", Var("x"), Const("c", where=lambda a: a.shape == (3,))), model)


def test_attribute_predicates_value_and_callable():
    model = graph("y = Softmax <axis = -1> (x)")
    assert matches(Op("Softmax", Var("x"), attrs={"axis": -1}), model)
    assert not matches(Op("Softmax", Var("x"), attrs={"axis": 1}), model)
    assert matches(Op("Softmax", Var("x"), attrs={"axis": lambda a: a in (-1, 1)}), model)
    # an absent attribute reads as None
    assert not matches(Op("Softmax", Var("x"), attrs={"other": 0}), model)


def test_commutation_is_declared_per_op():
    model = graph(
        "c = Constant <value = float {1.0}> ()\n y = Sub(c, x)",
    )
    assert not matches(Op("Sub", Var("x"), Const("c")), model)
    assert matches(Op("Sub", Var("x"), Const("c"), commute=True), model)
    add = graph("c = Constant <value = float {1.0}> ()\n y = Add(c, x)")
    assert matches(Op("Add", Var("x"), Const("c")), add)  # Add commutes by default
    assert not matches(Op("Add", Var("x"), Const("c"), commute=False), add)


class CountedMatch(Match):
    exponent: float = 0.0  # set by the check, read by the rewrite


class PowToMul(Rule[CountedMatch]):
    """Pow(x, 2) ==> Mul(x, x), with the exponent kept in a typed match field."""

    name = "pow_to_mul"
    pattern = Op("Pow", Var("x"), Const("e"))
    match_type = CountedMatch

    def check(self, m: CountedMatch, ctx: PassContext) -> str | None:
        m.exponent = float(m["e"].reshape(-1)[0])
        return None if m.exponent == 2.0 else f"exponent {m.exponent:g} is not 2"

    def rewrite(self, m: CountedMatch, b: Builder, ctx: PassContext):
        assert m.exponent == 2.0
        return [b.op("Mul", [m.value("x"), m.value("x")])]


def _two_pows() -> ir.Model:
    return graph(
        "two = Constant <value = float {2.0}> ()\n three = Constant <value = float {3.0}> ()\n"
        " a = Pow(x, two)\n y = Pow(a, three)"
    )


def test_typed_state_reaches_the_rewrite():
    model = _two_pows()
    ctx = PassContext(model, Options(), EffectLog())
    Driver(ctx, [PassInfo("PowTestFusionPass", "test", rules=(PowToMul(),))]).run()
    assert op_types(model)["Mul"] == 1 and op_types(model)["Pow"] == 1


def test_explain_is_a_dry_run_with_nodes_and_reasons():
    model = _two_pows()
    before = [n.op_type for n in model.graph]
    log = EffectLog()
    ctx = PassContext(model, Options(), log)
    info = PassInfo("PowTestFusionPass", "test", rules=(PowToMul(),))
    found = Driver(ctx, [info]).explain()
    assert [n.op_type for n in model.graph] == before  # nothing rewritten
    assert all(not s.matched and not s.reasons for s in log)  # nothing recorded
    assert [(e.root.op_type, e.reason) for e in found] == [
        ("Pow", None),
        ("Pow", "exponent 3 is not 2"),
    ]
    assert found[1].nodes == (found[1].root,)
    assert found[0].info is info and isinstance(found[0].rule, PowToMul)


def test_explain_covers_every_node_of_the_match():
    model = graph("e = Exp(x)\n s = ReduceSum(e)\n y = Div(e, s)")

    class Soft(Rule):
        name = "soft"
        pattern = SOFTMAX_LIKE

        def rewrite(self, m, b, ctx):
            return [b.op("Softmax", [m.value("x")], {"axis": -1})]

    ctx = PassContext(model, Options(), EffectLog())
    (e,) = Driver(ctx, [PassInfo("SoftTestFusionPass", "test", rules=(Soft(),))]).explain()
    assert e.reason is None
    assert sorted(n.op_type for n in e.nodes) == ["Div", "Exp", "ReduceSum"]
    assert "Softmax" not in [n.op_type for n in model.graph]


def test_could_match_refuses_nodes_without_the_child_ops():
    model = graph("e = Exp(x)\n s = ReduceSum(e)\n d = Div(e, s)\n t = Relu(x)\n y = Add(d, t)")
    nodes = {n.op_type: n for n in model.graph}
    assert SOFTMAX_LIKE.could_match(nodes["Div"])
    assert not Op("Div", Op("Sqrt", Var("a")), Var("b")).could_match(nodes["Div"])
    assert Op("Add", Or(Op("Relu", Var("a")), Var("v")), Var("b")).could_match(nodes["Add"])
    either = Or(Op("Sigmoid", Var("a")), Op("Tanh", Var("a")))
    assert not Op("Add", either, Var("b")).could_match(nodes["Add"])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs())
def test_could_match_never_refuses_a_match(case):
    """Sound: every registered rule's declared pattern, at every node of random graphs
    (tests/fuzz_graphs.py), matches only where could_match lets it try."""
    from opfuse.model import io
    from opfuse.rules import all_passes

    proto, _ = case
    model = io.from_proto(proto)
    patterns = [r.pattern for info in all_passes() for r in info.rules if r.pattern is not None]
    for node in model.graph:
        for pattern in patterns:
            if pattern.match_node(node, Match(node)):
                assert pattern.could_match(node), (pattern, node.op_type)
