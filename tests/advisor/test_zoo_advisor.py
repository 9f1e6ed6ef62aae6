"""Zoo acceptance for the advisor (slow: needs ../shared/zoo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opfuse.advisor.advise import AdviseOptions, Advisor
from opfuse.advisor.html import render_html
from opfuse.advisor.report import render_text

pytestmark = pytest.mark.slow
MATERIALIZED = Path("/tmp/zoo")


@pytest.fixture
def zoo(request) -> Path:  # type: ignore[no-untyped-def]
    if (MATERIALIZED / "efficientnet_b0.onnx").exists():
        return MATERIALIZED
    return request.getfixturevalue("zoo_dir")


def test_efficientnet_conv_sigmoid_mul_groups(zoo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    advisor = Advisor(AdviseOptions(runs=3, warmup=1))
    report = advisor.run(zoo / "efficientnet_b0.onnx")
    ub = report["ub_fusion"]
    assert ub[0]["fusion_type"] == "Conv+Sigmoid+Mul"
    swish = [g for g in ub if g["fusion_type"] == "Conv+Sigmoid+Mul"]
    assert len(swish) >= 40
    durations = [g["duration_us"] for g in swish]
    assert durations == sorted(durations, reverse=True) and durations[-1] > 0
    measured = {r.name: r.duration_us for r in advisor.profile.records}
    for g in ub:  # group durations are what the profile measured for their nodes
        assert g["duration_us"] == pytest.approx(sum(measured[n] for n in g["nodes"]), abs=1e-2)
    assert report["profile"]["unmapped_us"] == 0
    assert {g["onnxruntime"]["fuses"] for g in swish} <= {"yes", "partly"}
    page = render_html(report)
    assert "Conv+Sigmoid+Mul" in page[page.index('id="group-chart"') :]


def test_keras_mobilenetv3_first_layer_names_the_normalization(zoo, capsys) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    report = Advisor(AdviseOptions(runs=2, warmup=1)).run(zoo / "keras_mobilenetv3small.onnx")
    (aipp,) = report["aipp_fusion"]
    assert aipp["normalization"] == ["/Mul", "/Add"]
    assert aipp["op_types"][:4] == ["Cast", "Cast", "Mul", "Add"]
    assert aipp["opfuse"]["pass"] == "AippFusionPass"
    render_text(report, Console(width=300, color_system=None))
    text = capsys.readouterr().out
    section = text[text.index("====AippFusionModel====") : text.index("====L2Model====")]
    assert "/Cast+/Cast_1+/Mul+/Add" in section and "input normalization: /Mul, /Add" in section


def test_resnet_residual_add_joins_its_conv(zoo) -> None:  # type: ignore[no-untyped-def]
    report = Advisor(AdviseOptions(runs=2, warmup=1)).run(zoo / "resnet18.onnx")
    types = [g["fusion_type"] for g in report["ub_fusion"]]
    assert types.count("Conv+Add+Relu") == 8  # every basic block's second Conv
    assert "Add+Relu" not in types
    for g in report["ub_fusion"]:
        if g["fusion_type"] == "Conv+Add+Relu":  # onnxruntime runs each as one kernel
            assert g["onnxruntime"]["fuses"] == "yes"
