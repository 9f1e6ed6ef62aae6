"""The HTML report renders in headless Chromium without errors and its chart, in the first
screen, shows the top UB groups. CI installs Debian's chromium (.ci/run); there a missing
browser fails the test instead of skipping it."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import onnx
import pytest
from advisor_models import FIXTURES, SWISH_TIMES, ort_profile, swish_net, write_json

from opfuse.advisor.advise import AdviseOptions, advise
from opfuse.advisor.html import render_html


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing under CI=true (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def render(html_path, tmp_path):  # type: ignore[no-untyped-def]
    shot = tmp_path / "shot.png"
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,900",
        "--enable-logging=stderr",
        "--v=0",
        f"--screenshot={shot}",
        "--dump-dom",
        html_path.as_uri(),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, run.stderr, shot


@pytest.mark.parametrize("source", ["onnxruntime-json", "op_summary"])
def test_html_report_renders_in_chromium(source, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if source == "op_summary":
        report = advise(None, op_summary=FIXTURES / "op_summary_0_1.csv")
    else:
        model = tmp_path / "swish.onnx"
        onnx.save(swish_net(), model)
        prof = write_json(tmp_path / "p.json", ort_profile(SWISH_TIMES, runs=2))
        report = advise(
            model, profile_path=prof, options=AdviseOptions(warmup=1, compare_onnxruntime=False)
        )
    page = tmp_path / "report.html"
    page.write_text(render_html(report), "utf-8")
    assert not re.search(r"(src|href)=\"(https?:)?//", page.read_text()), "not self-contained"
    dom, log, shot = render(page, tmp_path)
    assert "Uncaught" not in log and 'data-error="' not in dom
    rendered = re.search(r'data-rendered="bars=(\d+);groups=(\d+);chart-in-view=(\w+)"', dom)
    assert rendered, "the page's load script did not run"
    bars, groups, in_view = int(rendered[1]), int(rendered[2]), rendered[3]
    top = report["ub_fusion"]
    assert groups == min(10, len(top)) and bars >= len(top)
    assert in_view == "yes"  # the group chart is in the screenshot's first screen
    chart = dom[dom.index('id="group-chart"') :]
    chart = chart[: chart.index("</svg>")]
    for g in top:
        assert g["fusion_type"] in chart
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1200, 900)
