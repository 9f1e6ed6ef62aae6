"""Zoo acceptance for issue 3, items 6-10 (slow: needs ../shared/zoo)."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from opfuse.pipeline.conductor import optimize_file
from opfuse.rewrite.context import Options

pytestmark = pytest.mark.slow


def ops(path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def opset(path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def test_googlenet_sibling_convs_merge(zoo_dir, tmp_path):
    src = zoo_dir / "googlenet.onnx"
    without = optimize_file(src, tmp_path / "a.onnx")  # off by default
    merged = optimize_file(src, tmp_path / "b.onnx", enable=["ConvConcatFusionPass"])
    assert without.verify is not None and without.verify.ok
    assert merged.verify is not None and merged.verify.ok
    assert ops(tmp_path / "b.onnx")["Conv"] < ops(tmp_path / "a.onnx")["Conv"]
    assert ops(tmp_path / "b.onnx")["Conv"] < ops(src)["Conv"]
    onnx.checker.check_model(str(tmp_path / "b.onnx"), full_check=True)


def test_bert_small_keeps_opset_and_erf_by_default(zoo_dir, tmp_path):
    src = zoo_dir / "bert_small.onnx"
    result = optimize_file(src, tmp_path / "a.onnx")
    assert result.verify is not None and result.verify.ok
    assert opset(tmp_path / "a.onnx") == opset(src) == 17
    assert ops(tmp_path / "a.onnx")["Erf"] == ops(src)["Erf"] > 0
    assert "Gelu" not in ops(tmp_path / "a.onnx")


def test_bert_small_target_opset_20_has_gelu(zoo_dir, tmp_path):
    src = zoo_dir / "bert_small.onnx"
    result = optimize_file(src, tmp_path / "b.onnx", options=Options(target_opset=20))
    assert result.verify is not None and result.verify.ok
    out = ops(tmp_path / "b.onnx")
    assert opset(tmp_path / "b.onnx") == 20
    assert out["Gelu"] == ops(src)["Erf"] and "Erf" not in out
    onnx.checker.check_model(str(tmp_path / "b.onnx"), full_check=True)
