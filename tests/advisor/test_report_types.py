"""The typed advisor report: every section's to_json gives the keys docs/ADVISOR.md lists
for it (no more, no fewer), the report reads as the JSON mapping it replaced, and the rows
read from JSON (findings, commands, suggestions, pass summaries) round-trip."""

from __future__ import annotations

import json
import re
from pathlib import Path

from opfuse.advisor.pass_verdict import Verdict
from opfuse.advisor.profile_readers import InputShape
from opfuse.advisor.report_types import (
    Activation,
    AdviceReport,
    AippChain,
    BatchSplit,
    Dominant,
    Finding,
    GraphInfo,
    HintRow,
    L2Chain,
    L2Op,
    NextStepLabel,
    NextSteps,
    OpTime,
    OrtFusion,
    PassReason,
    PassRow,
    PeakShare,
    ProfileInfo,
    StepCommand,
    TargetInfo,
    TopNode,
    UBGroup,
    dominant_of,
    finding_of,
    pass_row_of,
    step_command_of,
)
from opfuse.runtime.targets import load_target
from opfuse.verification.compare import FedInputs

DOCS = Path(__file__).parents[2] / "docs" / "ADVISOR.md"
V = Verdict("P", available=True, fires=False, reason="r")
FED = FedInputs({"x": [1, 3]}, None, 0, ("x: 1x3 float, random",), "grown x2", "too short")


def full_report() -> AdviceReport:
    """Every section with one row (every optional part given)."""
    return AdviceReport(
        schema="opfuse.advise/2",
        model="m.onnx",
        target=TargetInfo(load_target("cpu"), "file", None),
        ascend_sections=True,
        quantized=[Finding("channels", "f", "w", "t", ["a"], 3, 1.5)],
        next_steps=NextSteps(
            "t",
            None,
            [StepCommand("opfuse optimize m.onnx", ["-x"], "y", 0.9, 0.01, 5, "Mul -1", True)],
            True,
            [Dominant("Conv", 0.5, "s")],
            FED,
        ),
        graph=GraphInfo("g", 3, 3, False, 0, False),
        profile=ProfileInfo(
            "onnxruntime",
            None,
            3,
            1,
            "CPU",
            "disable",
            10.0,
            10.0,
            1.0,
            None,
            0.0,
            [],
            [InputShape("x", [1, 3], [1, "N"])],
            "--input-shape x:1,3",
            [],
            ["n"],
            FED,
        ),  # fmt: skip
        op_statistic=[OpTime("Conv", 1, 5.0, 5.0, 0.5)],
        top_nodes=[TopNode("c", "Conv", 5.0, 0.1, 0.5, "CPU", ["c"], PeakShare(0.1, 0.2))],
        ub_fusion=[
            UBGroup(
                0,
                "Conv+Relu",
                "Conv+ElementWise",
                ["c", "r"],
                ["Conv", "Relu"],
                [["c"], ["r"]],
                [Activation("a", ["r"])],
                [[0, 1]],
                6.0,
                0.6,
                1.0,
                V,
                OrtFusion("yes", ["c"], ["r"]),
                NextStepLabel("opfuse optimize", 0.9, True),
            )
        ],  # fmt: skip
        aipp_fusion=[AippChain(["cast"], ["Cast"], [], "c", 1.0, V)],
        l2_fusion=[
            L2Chain(
                ["c"],
                5.0,
                2,
                64,
                BatchSplit(2, 1, 2),
                "estimate",
                [
                    L2Op(
                        "c",
                        "Conv",
                        "1,3",
                        {"mac_ratio": 0.5, "vec_ratio": None, "mte2_ratio": 0.1, "mte3_ratio": 0.1},
                        5.0,
                    )
                ],
                V,
            )
        ],  # fmt: skip
        hints=[HintRow("alignment", "c", "Conv", "m", 5.0, 1.0, V)],
        graph_fusion=[PassRow("P", "GraphFusion", 1, 0, [PassReason("p", "why", 1, ["c"])])],
    )


def documented() -> dict[str, set[str]]:
    """Top-level key -> every backticked name in its bullet of the JSON schema section."""
    text = DOCS.read_text("utf-8")
    schema = text[text.index("## JSON schema") : text.index("## Text report")]
    out: dict[str, set[str]] = {}
    for bullet in re.split(r"\n\* ", schema)[1:]:
        key = re.match(r"`(\w+)`", bullet)
        assert key is not None, bullet[:40]
        out[key[1]] = set(re.findall(r"`(\w+)`", bullet)) | set(re.findall(r'"(\w+)"', bullet))
    return out


def keys(value: object) -> set[str]:
    """Every key of the dicts in a JSON value, at any depth."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def test_every_section_gives_the_keys_the_docs_list() -> None:
    report = full_report().to_json()
    docs = documented()
    assert list(report) == [
        "schema", "model", "target", "ascend_sections", "quantized", "next_steps", "graph",
        "profile", "op_statistic", "top_nodes", "ub_fusion", "aipp_fusion", "l2_fusion",
        "hints", "graph_fusion",
    ]  # fmt: skip
    assert set(report) == set(docs)
    # the keys a section gives, except the free-form ones (a target's ub_limits by class,
    # the inputs' shapes by name)
    for key, value in report.items():
        given = keys(value) - (set(load_target("cpu").ub_limits) if key == "target" else set())
        given -= set(FED.shapes)  # the inputs' names
        verdict_keys = {"pass", "available", "fires", "reason"}  # "Recommendations and verdicts"
        assert given - verdict_keys <= docs[key], (key, given - verdict_keys - docs[key])


def test_the_report_reads_as_its_json() -> None:
    report = full_report()
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data
    assert dict(report) == data  # the read-only mapping advise() returned before
    assert report["ub_fusion"][0]["next_step"]["command"] == "opfuse optimize"  # type: ignore[index]


def test_rows_read_from_json_round_trip() -> None:
    report = full_report()
    f, c = report.quantized[0], report.next_steps.commands[0]
    assert finding_of(f.to_json()) == f
    assert step_command_of(c.to_json()) == c
    assert dominant_of(report.next_steps.dominant[0].to_json()) == report.next_steps.dominant[0]
    assert pass_row_of(report.graph_fusion[0].to_json()) == report.graph_fusion[0]
    failed = StepCommand("opfuse optimize m.onnx", [], "y", error="boom")
    assert step_command_of(failed.to_json()) == failed
