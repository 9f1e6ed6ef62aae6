"""The Ascend msprof op_summary CSV: the committed fixture gives the three sections; column
names that drift between CANN versions are accepted and missing ones reported."""

from __future__ import annotations

import csv

import pytest
from advisor_models import FIXTURES

from opfuse.advisor.conductor import advise
from opfuse.advisor.profile_readers import read_op_summary
from opfuse.errors import OpfuseError

CSV = FIXTURES / "op_summary_0_1.csv"


def test_fixture_gives_the_three_sections() -> None:
    report = advise(None, op_summary=CSV)
    assert report["target"]["name"] == "ascend310"
    assert report["profile"]["missing_columns"] == []
    ub = report["ub_fusion"]
    assert ub[0]["fusion_type"] == "DepthwiseConv2D+Sigmoid+Mul"
    assert ub[0]["duration_us"] == pytest.approx(180.0 + 60.3 + 55.1)
    assert [g["duration_us"] for g in ub] == sorted((g["duration_us"] for g in ub), reverse=True)
    # the Pow ran on the AI CPU: not UB-fusible with AI Core ops, and a fallback hint
    assert all("block1a_se_reduce/Pow" not in g["nodes"] for g in ub)
    kinds = {(h["kind"], h["node"]) for h in report["hints"]}
    assert ("fallback", "block1a_se_reduce/Pow") in kinds
    assert ("replace", "block1a_se_reduce/Pow") in kinds
    (aipp,) = report["aipp_fusion"]
    assert aipp["nodes"] == ["trans_Cast_0", "trans_TransData_1"]
    assert aipp["first_conv"].startswith("stem_conv/convolution")
    l2 = report["l2_fusion"]
    assert l2 and l2[0]["ratios_source"] == "op_summary"
    op = next(o for c in l2 for o in c["ops"] if o["name"] == "block1a_dwconv/depthwise")
    assert op["mac_ratio"] == pytest.approx(0.175088)
    assert op["mte3_ratio"] == pytest.approx(0.185707)  # from aiv_mte3_ratio
    assert op["input_shapes"] == "8,2,112,112,16;2,3,3,1,16,16;32"
    assert l2[0]["batch"] == 8 and l2[0]["batch_split"]["runs"] > 1


def test_text_report_has_the_advisor_wording() -> None:
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_text

    buf = StringIO()
    render_text(advise(None, op_summary=CSV), Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    order = [
        text.index(s) for s in ("====UBModel====", "====AippFusionModel====", "====L2Model====")
    ]
    assert order == sorted(order)
    assert (
        "Fusion Type: DepthwiseConv2D+Sigmoid+Mul; Fusion Operator Detail: block1a_dwconv/"
        "depthwise, block1a_activation/Sigmoid, block1a_activation/mul; Fusion Operator "
        "Duration: 295.400000;" in text
    )
    assert "1. trans_Cast_0+trans_TransData_1+stem_conv/convolution" in text
    assert (
        "Op Name: block1a_dwconv/depthwise; OP Type: DepthwiseConv2D; Input Shapes: "
        "8,2,112,112,16;2,3,3,1,16,16;32; mac_ratio: 0.175088; vec_ratio: 0.119661; "
        "mte2_ratio: 0.879285; mte3_ratio: 0.185707;" in text
    )


def rewrite_header(tmp_path, rename: dict[str, str], drop: set[str]):  # type: ignore[no-untyped-def]
    with open(CSV, newline="") as f:
        rows = list(csv.reader(f))
    keep = [i for i, c in enumerate(rows[0]) if c not in drop]
    out = tmp_path / "op_summary_drift.csv"
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([rename.get(rows[0][i], rows[0][i]) for i in keep])
        for row in rows[1:]:
            w.writerow([row[i] for i in keep])
    return out


def test_column_name_drift_and_missing_columns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = rewrite_header(
        tmp_path,
        {
            "Op Name": "op_name",
            "Task Duration(us)": "Task Duration",
            "aiv_mte3_ratio": "mte3_ratio",
            "aic_mac_ratio": "mac_ratio",
        },
        {"aic_vec_ratio", "Input Shapes"},
    )
    profile = read_op_summary(path)
    # the columns as msprof spells them, not opfuse's field names
    assert profile.missing_columns == ["Input Shapes", "aic_vec_ratio"]
    assert profile.notes[0] == "op summary columns missing: Input Shapes, aic_vec_ratio"
    dw = next(r for r in profile.records if r.name == "block1a_dwconv/depthwise")
    assert dw.duration_us == pytest.approx(180.0)
    assert dw.ratios == pytest.approx(
        {"mac_ratio": 0.175088, "mte2_ratio": 0.879285, "mte3_ratio": 0.185707}
    )


def test_missing_required_column_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = rewrite_header(tmp_path, {}, {"Task Duration(us)"})
    with pytest.raises(OpfuseError, match=r"lacks the column\(s\) Task Duration\(us\) \("):
        read_op_summary(path)
