"""Which stages a round runs again (pipeline.rounds): a stage is skipped only when it left
nothing for itself and nothing it reads has changed since; the result stays a fixpoint."""

from __future__ import annotations

from helpers import model_from_text, op_types
from opfuse.pipeline.conductor import optimize_model
from opfuse.pipeline.rounds import ChangeClock
from opfuse.rewrite.passinfo import PassInfo
from opfuse.rules import get_pass

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def graph_pass(name: str, **declared: object) -> PassInfo:
    return PassInfo(name, "test", run=lambda ctx: None, **declared)  # type: ignore[arg-type]


def test_a_stage_runs_again_only_after_a_change_it_reads():
    cse = graph_pass("CseLikeFusionPass", reads=frozenset({"rewrites"}), complete=True)
    shapes = graph_pass("ShapeReaderFusionPass")
    clock = ChangeClock()
    assert clock.must_run("a", [cse]) and clock.must_run("b", [shapes])  # never ran
    clock.ran("a", [cse], effected=5)  # complete: its own 5 rewrites leave it nothing
    clock.ran("b", [shapes], effected=0)
    assert not clock.must_run("a", [cse]) and not clock.must_run("b", [shapes])
    clock.record("shapes", 3)
    clock.record("removals", 2)
    assert not clock.must_run("a", [cse])  # reads neither
    assert clock.must_run("b", [shapes])
    clock.record("rewrites", 1)
    assert clock.must_run("a", [cse])


def test_a_stage_that_changed_something_runs_again_unless_complete():
    rules = get_pass("IdentityRemovalFusionPass")  # a rule pass: never complete
    clock = ChangeClock()
    clock.ran("r", [rules], effected=1)
    assert clock.must_run("r", [rules])  # a rewrite may enable a match not revisited
    clock.ran("r", [rules], effected=0)
    assert not clock.must_run("r", [rules])


def test_removal_only_effects_count_as_removals():
    dead = get_pass("DeadCodeFusionPass")
    assert dead.removes_only and dead.reads == {"rewrites"} and dead.complete
    # dead-code removal trims unused optional outputs: two nodes can become alike
    assert get_pass("CommonSubexpressionFusionPass").reads == {"rewrites", "removals"}
    clock = ChangeClock()
    clock.ran("dead", [dead], effected=4)
    assert clock.counts["removals"] == 4 and clock.counts["rewrites"] == 0


def _counting(monkeypatch) -> list[str]:
    """The stages the pipeline runs, by label (a rule stage's passes joined by "+")."""
    runs: list[str] = []
    real = ChangeClock.ran

    def ran(self, label, stage, effected):  # type: ignore[no-untyped-def]
        runs.append(label)
        real(self, label, stage, effected)

    monkeypatch.setattr(ChangeClock, "ran", ran)
    return runs


def test_the_confirming_round_skips_dead_code(monkeypatch):
    # round 1: CSE merges the two Negs, dead code has nothing; round 2 runs CSE again (a
    # merge can leave it more: graph outputs), which finds nothing, so dead code is skipped
    runs = _counting(monkeypatch)
    m = model_from_text(
        f"{HEAD}\ng (float[2] x) => (float[2] y) {{\n a = Neg(x)\n b = Neg(x)\n y = Add(a, b)\n}}"
    )
    result = optimize_model(m)
    assert result.rounds == 2
    assert runs.count("CommonSubexpressionFusionPass") == 2
    assert runs.count("DeadCodeFusionPass") == 1
    assert op_types(m) == {"Neg": 1, "Add": 1}


def test_after_a_merge_every_rule_stage_runs_again(monkeypatch):
    # CSE makes Sub read one value twice: a rewrite every rule stage reads, so round 2
    # runs them all, even those that changed nothing in round 1
    runs = _counting(monkeypatch)
    m = model_from_text(
        f"{HEAD}\ng (float[2] x) => (float[2] y) {{\n"
        " a = Identity(x)\n c = Neg(a)\n d = Neg(a)\n y = Sub(c, d)\n}"
    )
    result = optimize_model(m)
    rule_stages = [label for label in runs if "+" in label]
    assert result.rounds == 2 and len(rule_stages) == 2 * len(set(rule_stages))
    assert op_types(m) == {"Neg": 1, "Sub": 1}
    again = optimize_model(m)  # a fixpoint: nothing left for a second run
    assert again.log.effected() == 0


def test_nodes_made_alike_by_dead_code_removal_merge_in_the_next_round():
    # MaxPool a has an unused Indices output, b none: not alike for CSE in round 1; dead
    # code removal trims a's Indices (and removes the unused Neg), so round 2 merges them
    m = model_from_text(
        f"{HEAD}\ng (float[1,1,4,4] x) => (float[1,1,2,2] y) {{\n"
        " p, i = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x)\n"
        " q = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x)\n"
        " unused = Neg(x)\n y = Add(p, q)\n}"
    )
    optimize_model(
        m, switch_table={"GraphFusion": {"ALL": False, "CommonSubexpressionFusionPass": True}}
    )
    assert op_types(m) == {"MaxPool": 1, "Add": 1}


def test_a_trim_alone_is_a_change_the_next_round_sees():
    # dead-code removal removes nothing here, only trims p's unused Indices: CSE must
    # still see the two MaxPools as alike in round 2
    m = model_from_text(
        f"{HEAD}\ng (float[1,1,4,4] x) => (float[1,1,2,2] y) {{\n a = Identity(x)\n"
        " p, i = MaxPool<kernel_shape=[2,2], strides=[2,2]>(a)\n"
        " q = MaxPool<kernel_shape=[2,2], strides=[2,2]>(a)\n y = Add(p, q)\n}"
    )
    result = optimize_model(m)
    assert op_types(m) == {"MaxPool": 1, "Add": 1}
    trims = [s for s in result.log if s.pattern == "unused_optional_slots"]
    assert trims and trims[0].effected == 1
