"""Slow: every zoo model optimizes with the default passes, passes onnx.checker, verifies
within the default tolerances, and has no Identity, Dropout or Conv->BatchNormalization."""

from __future__ import annotations

import onnx
import pytest

from opfuse.pipeline.conductor import optimize_file
from zoo import ZOO_MODELS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_model_optimizes_and_verifies(zoo_dir, tmp_path, name):
    out = tmp_path / f"{name}.onnx"
    result = optimize_file(zoo_dir / f"{name}.onnx", out)
    assert result.verify is not None and result.verify.ok, result.verify
    onnx.checker.check_model(str(out))
    model = onnx.load_model(str(out), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert "Identity" not in ops and "Dropout" not in ops
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    bn_after_conv = [
        n.name
        for n in model.graph.node
        if n.op_type == "BatchNormalization"
        and producers.get(n.input[0]) in ("Conv", "ConvTranspose")
    ]
    assert not bn_after_conv
