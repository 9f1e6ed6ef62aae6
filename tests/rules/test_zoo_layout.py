"""Zoo acceptance for the layout and AIPP passes (slow: needs the materialized zoo).

The Keras exports wrap every Conv in NHWC<->NCHW Transposes; after optimize at most two
Transposes remain with --layout keep, none on the main path with --layout nchw, no Cast
is left and every output verifies against the original."""

from __future__ import annotations

import pytest

from opfuse.pipeline.conductor import optimize_file
from opfuse.rewrite.context import Options

MODELS = ["keras_mobilenetv3small", "keras_resnet50"]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("layout", ["keep", "nchw"])
@pytest.mark.parametrize("name", MODELS)
def test_keras_model_loses_its_transposes(name, layout, zoo_dir, tmp_path):
    src = zoo_dir / f"{name}.onnx"
    result = optimize_file(src, tmp_path / "out.onnx", options=Options(layout=layout))
    assert result.verify is not None and result.verify.ok
    assert result.after["Cast"] == 0
    assert result.after["Transpose"] <= (2 if layout == "keep" else 0) + _constant_transposes(
        result
    )
    if layout == "nchw":
        assert any("NCHW" in note for note in result.notes)
        assert list(result.model.graph.inputs[0].shape)[1] == 3


def _constant_transposes(result) -> int:
    """Transposes that only compute constants (pads arithmetic) when nothing folds them."""
    return sum(
        1
        for node in result.model.graph
        if node.op_type == "Transpose"
        and node.inputs[0] is not None
        and len(node.inputs[0].shape or ()) != 4
    )
