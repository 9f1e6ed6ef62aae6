"""StripUnusedFusionPass (Grappler's strip_unused_nodes): keep what --outputs need,
cut the graph at --inputs."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import copy_model, effected, model_from_text, op_types, run_model, run_passes
from opfuse.errors import OpfuseError
from opfuse.rewrite import Options

PASS = "StripUnusedFusionPass"
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x, float[2,3] aux) => (float[2,3] y, float[2,3] side) {
  a = Relu(x)
  b = Sigmoid(a)
  y = Neg(b)
  side = Abs(aux)
}"""


def test_outputs_keep_only_what_they_need():
    model = model_from_text(TEXT)
    result = run_passes(model, PASS, options=Options(keep_outputs=["b"]))
    assert [v.name for v in model.graph.outputs] == ["b"]
    assert op_types(model) == {"Relu": 1, "Sigmoid": 1}
    assert effected(result, PASS) == 2
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        run_model(model, {"x": x, "aux": x})["b"], 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6
    )


def test_inputs_cut_the_graph():
    model = model_from_text(TEXT)
    original = copy_model(model)
    run_passes(model, PASS, options=Options(keep_inputs=["a"], keep_outputs=["y"]))
    assert [v.name for v in model.graph.inputs] == ["a"]
    assert op_types(model) == {"Sigmoid": 1, "Neg": 1}
    a = np.abs(np.random.default_rng(1).standard_normal((2, 3))).astype(np.float32)  # a = Relu(x)
    np.testing.assert_allclose(
        run_model(model, {"a": a})["y"], run_model(original, {"x": a, "aux": a})["y"]
    )


def test_nothing_requested_changes_nothing():
    model = model_from_text(TEXT)
    result = run_passes(model, PASS)
    assert effected(result, PASS) == 0 and sum(op_types(model).values()) == 4


@pytest.mark.parametrize(
    "options,message",
    [
        (
            Options(keep_outputs=["nope"]),
            "tensor 'nope' given to --keep-inputs/--keep-outputs is not in the model",
        ),
        (Options(keep_inputs=["a"], keep_outputs=["y", "side"]), "need input 'aux'"),
    ],
)
def test_bad_requests_are_errors(options, message):
    with pytest.raises(OpfuseError, match=message):
        run_passes(model_from_text(TEXT), PASS, options=options)
