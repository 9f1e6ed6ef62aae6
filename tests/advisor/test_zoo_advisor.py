"""Zoo acceptance for the advisor (slow: needs ../shared/zoo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opfuse.advisor.conductor import AdviseOptions, advise, analyse
from opfuse.advisor.conductor import report as make_report
from opfuse.advisor.render import render_html, render_text

pytestmark = pytest.mark.slow
MATERIALIZED = Path(os.environ.get("OPFUSE_ZOO", "/tmp/zoo"))


@pytest.fixture
def zoo(request) -> Path:  # type: ignore[no-untyped-def]
    if (MATERIALIZED / "efficientnet_b0.onnx").exists():
        return MATERIALIZED
    return request.getfixturevalue("zoo_dir")


def test_efficientnet_conv_sigmoid_mul_groups(zoo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    analysis = analyse(zoo / "efficientnet_b0.onnx", options=AdviseOptions(runs=3, warmup=1))
    report = make_report(analysis)
    ub = report["ub_fusion"]
    # the depthwise Conv, its SiLU (one member) and the squeeze-excite Mul, as msadvisor
    # groups EfficientNet's blocks; the other Conv+SiLU groups have no squeeze-excite
    assert ub[0]["fusion_type"] == "Conv+Sigmoid+Mul+Mul"
    se = [g for g in ub if g["fusion_type"] == "Conv+Sigmoid+Mul+Mul"]
    assert len(se) == 16
    for g in se:  # Conv, the SiLU's two nodes, then the excite Mul outside the SiLU
        (silu,) = g["activations"]
        assert silu["name"] == "SiLU" and silu["nodes"] == g["nodes"][1:3]
        assert "/block." in g["nodes"][-1] and g["nodes"][-1].endswith("/Mul")
    swish = [g for g in ub if g["fusion_type"].startswith("Conv+Sigmoid+Mul")]
    assert len(swish) >= 40
    durations = [g["duration_us"] for g in se]  # one type, onnxruntime fuses none whole
    assert durations == sorted(durations, reverse=True) and durations[-1] > 0
    measured = {r.name: r.duration_us for r in analysis.profile.records}
    for g in ub:  # group durations are what the profile measured for their nodes
        assert g["duration_us"] == pytest.approx(sum(measured[n] for n in g["nodes"]), abs=1e-2)
    assert report["profile"]["unmapped_us"] == 0
    assert {g["onnxruntime"]["fuses"] for g in swish} <= {"yes", "partly"}
    page = render_html(report)
    assert "Conv+Sigmoid+Mul" in page[page.index('id="group-chart"') :]


def test_keras_mobilenetv3_first_layer_names_the_normalization(zoo, capsys) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    report = advise(zoo / "keras_mobilenetv3small.onnx", options=AdviseOptions(runs=2, warmup=1))
    (aipp,) = report["aipp_fusion"]
    assert aipp["normalization"] == ["/Mul", "/Add"]
    assert aipp["op_types"][:4] == ["Cast", "Cast", "Mul", "Add"]
    assert aipp["opfuse"]["pass"] == "AippFusionPass"
    render_text(report, Console(width=300, color_system=None))
    text = capsys.readouterr().out
    assert "====L2Model====" not in text and "AOE" not in text  # Ascend's, not the cpu's
    section = text[text.index("====AippFusionModel====") : text.index("====Operator constr")]
    assert "/Cast+/Cast_1+/Mul+/Add" in section and "input normalization: /Mul, /Add" in section


def test_resnet_residual_add_joins_its_conv(zoo) -> None:  # type: ignore[no-untyped-def]
    report = advise(zoo / "resnet18.onnx", options=AdviseOptions(runs=2, warmup=1))
    types = [g["fusion_type"] for g in report["ub_fusion"]]
    assert types.count("Conv+Add+Relu") == 8  # every basic block's second Conv
    assert "Add+Relu" not in types
    for g in report["ub_fusion"]:
        if g["fusion_type"] == "Conv+Add+Relu":  # onnxruntime runs each as one kernel
            assert g["onnxruntime"]["fuses"] == "yes"


def test_keras_resnet50_first_screen_is_actionable(zoo) -> None:  # type: ignore[no-untyped-def]
    """On the cpu target: Next steps with measured ratios (--layout nchw among them: the
    Keras export is NHWC), then the groups onnxruntime does not fuse, the others counted."""
    from io import StringIO

    from rich.console import Console

    report = advise(
        zoo / "keras_resnet50.onnx", options=AdviseOptions(runs=2, warmup=1, trial_seconds=1.0)
    )
    steps = report["next_steps"]["commands"]
    assert any(c["flags"] == ["--layout", "nchw"] for c in steps)
    assert all(isinstance(c["ratio"], float) for c in steps)
    buf = StringIO()
    render_text(report, Console(file=buf, width=200, color_system=None), top=3)
    lines = buf.getvalue().splitlines()
    assert lines.index("====Next steps====") < lines.index("====UBModel====") < 25
    assert any("already runs" in ln and "one kernel" in ln for ln in lines[:25])
    assert "too low" not in buf.getvalue()
