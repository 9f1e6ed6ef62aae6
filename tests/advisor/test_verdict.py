"""The four-key verdict every report row carries."""

from __future__ import annotations

from opfuse.advisor.pass_verdict import Verdict


def test_a_verdict_has_the_four_keys_and_reads_back():
    v = Verdict("SoftmaxFusionPass", available=True, fires=False, reason="axis is not last")
    data = v.to_json()
    assert data == {
        "pass": "SoftmaxFusionPass",
        "available": True,
        "fires": False,
        "reason": "axis is not last",
    }
    assert Verdict.from_json(data) == v


def test_a_verdict_not_tried_has_no_fires():
    assert Verdict(None, available=False).to_json() == {
        "pass": None,
        "available": False,
        "fires": None,
        "reason": None,
    }
