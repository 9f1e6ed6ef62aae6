"""The HTML report renders in headless Chromium without errors and its chart, in the first
screen, shows the top UB groups. CI installs Debian's chromium (.ci/run); there a missing
browser fails the test instead of skipping it."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import numpy as np
import onnx
import pytest
from advisor_models import (
    FIXTURES,
    SWISH_TIMES,
    long_chain_net,
    long_chain_target,
    make_model,
    ort_profile,
    swish_net,
    write_json,
)
from onnx import helper

from opfuse.advisor.conductor import AdviseOptions, advise
from opfuse.advisor.html import group_graph, label_lines, shorten
from opfuse.advisor.render import render_html
from opfuse.advisor.report import fold_columns


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
    text = page.read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", text), "not self-contained"
    dom, log, shot = render(page, tmp_path)
    assert "Uncaught" not in log and 'data-error="' not in dom
    rendered = re.search(
        r'data-rendered="bars=(\d+);groups=(\d+);chart-in-view=(\w+);steps-top=(\d+)"', dom
    )
    assert rendered, "the page's load script did not run"
    bars, groups, in_view = int(rendered[1]), int(rendered[2]), rendered[3]
    top = report["ub_fusion"]
    assert groups == min(10, len({g["fusion_type"] for g in top}))  # one card per type
    assert bars >= min(10, len(top))
    assert in_view == "yes"  # the group chart is in the screenshot's first screen
    # Next steps come first: above the group chart, in the first screen
    assert 0 < int(rendered[4]) < 900
    assert text.index('id="steps"') < text.index('id="group-chart"')
    chart = dom[dom.index('id="group-chart"') :]
    chart = chart[: chart.index("</svg>")]
    for g in top:
        assert g["fusion_type"] in chart
    # human titles with msadvisor's names as subtitles, a legend, units
    assert 'Groups a backend could fuse</h2><p class="sub">msadvisor: UBModel' in text
    assert 'class="legend"' in text and "us per run" in text
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1200, 900)


def many_groups(tmp_path):  # type: ignore[no-untyped-def]
    """Eleven Conv+Relu groups of 10 us (110 us of that type) and one Conv+Tanh of 100 us:
    the report lists the Conv+Relu type first, but the largest group is the Conv+Tanh."""
    n = helper.make_node
    w = {"W": np.ones((4, 4, 1, 1), np.float32)}
    nodes, times, x = [], {}, "x"
    for i in range(11):
        nodes += [
            n("Conv", [x, "W"], [f"c{i}"], name=f"conv{i}"),
            n("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        times.update({f"conv{i}": ("Conv", 8.0), f"relu{i}": ("Relu", 2.0)})
        x = f"r{i}"
    nodes += [n("Conv", [x, "W"], ["ct"], name="conv_t"), n("Tanh", ["ct"], ["y"], name="tanh")]
    times.update(conv_t=("Conv", 90.0), tanh=("Tanh", 10.0))
    path = tmp_path / "many.onnx"
    onnx.save(make_model(nodes, {"x": [1, 4, 2, 2]}, {"y": [1, 4, 2, 2]}, w), path)
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=1, warmup_factor=1.0))
    return advise(
        path, profile_path=prof, options=AdviseOptions(warmup=0, compare_onnxruntime=False)
    )


def svg(page: str, start: str) -> str:
    chart = page[page.index(start) :]
    return chart[: chart.index("</svg>")]


def test_chart_and_cards_show_the_largest_groups(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = many_groups(tmp_path)
    ub = report["ub_fusion"]
    assert ub[0]["fusion_type"] == "Conv+Relu" and ub[-1]["fusion_type"] == "Conv+Tanh"
    page = render_html(report, top=10)
    chart = svg(page, 'id="group-chart"')
    values = [float(v) for v in re.findall(r"<title>[^<]*: ([\d.]+) us</title>", chart)]
    wanted = sorted((g["duration_us"] for g in ub), reverse=True)[:10]
    assert values == pytest.approx(wanted) and values[0] == pytest.approx(100.0)
    assert "Top 10 UB fusion groups by duration" in chart and "Conv+Tanh: conv_t" in chart
    # one card per fusion type, with the count of its groups and their summed time
    cards = re.findall(
        r'<div class="group"><div><b>([^<]+)</b> &times; (\d+): ([\d.]+) us',
        page.replace("<wbr>", ""),
    )
    assert cards == [("Conv+Relu", "11", "110.0"), ("Conv+Tanh", "1", "100.0")]


def test_top_limits_every_list(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_text

    report = many_groups(tmp_path)
    page = render_html(report, top=3)
    for table in re.findall(r"<table>.*?</table>", page):
        assert table.count("<tr>") <= 1 + 3
    assert page.count('<div class="group">') <= 3
    assert "... and 9 more (see --format json)" in page  # 12 UB groups, 3 shown
    buf = StringIO()
    render_text(report, Console(file=buf, width=300, color_system=None), top=3)
    text = buf.getvalue()
    assert text.count("Fusion Type: ") == 3 and "... and 9 more (see --format json)" in text
    assert len(report["ub_fusion"]) == 12 and len(report["top_nodes"]) == 24  # JSON complete


def test_svg_ids_are_unique_and_markers_resolve(tmp_path) -> None:  # type: ignore[no-untyped-def]
    page = render_html(many_groups(tmp_path))
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for drawing in re.findall(r'<svg class="group-graph".*?</svg>', page):
        (own,) = re.findall(r'<marker id="([^"]+)"', drawing)
        assert set(re.findall(r"url\(#([^)]+)\)", drawing)) == {own}


def test_empty_sections_say_so_as_the_text_report_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_text

    n = helper.make_node
    path = tmp_path / "lone.onnx"
    onnx.save(
        make_model([n("Softmax", ["x"], ["y"], name="soft")], {"x": [1, 4]}, {"y": [1, 4]}), path
    )
    prof = write_json(tmp_path / "p.json", ort_profile({"soft": ("Softmax", 1.0)}, runs=1))
    report = advise(path, profile_path=prof, options=AdviseOptions(warmup=0))
    assert not any(report[k] for k in ("ub_fusion", "aipp_fusion", "l2_fusion", "hints"))
    page = render_html(report)
    buf = StringIO()
    render_text(report, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    for message in (
        "No UB fusion group found.",
        "No preprocessing chain in front of the first Conv.",
        "No operator constraint hints.",
    ):
        assert message in text and f'<p class="empty">{message}</p>' in page
    # the L2 section is Ascend's: not shown for the cpu target
    assert "L2Model" not in text and "L2Model" not in page and "AOE" not in text
    assert "Fusion Operator Detail" not in page  # no bare table header
    assert page.count("<table>") == 2  # the op statistic and the slow nodes only


def long_groups(tmp_path, length: int):  # type: ignore[no-untyped-def]
    """The advise report of a Conv -> ``length`` elementwise ops -> Mul -> Relu chain (one
    group of length + 3 nodes, long names) under a target that allows such groups."""
    model = long_chain_net(length)
    path = tmp_path / f"long{length}.onnx"
    onnx.save(model, path)
    times = {n.name: (n.op_type, 10.0 + i) for i, n in enumerate(model.graph.node)}
    prof = write_json(tmp_path / f"p{length}.json", ort_profile(times, runs=2))
    target = long_chain_target(tmp_path / "wide.json")
    opts = AdviseOptions(warmup=1, compare_onnxruntime=False, target=str(target), calibrate=False)
    return advise(path, profile_path=prof, options=opts)


def layout(dom: str) -> dict[str, int]:
    found = re.search(r'data-layout="([^"]+)"', dom)
    assert found, "the page's load script did not measure the layout"
    return {k: int(v) for k, v in (kv.split("=") for kv in found[1].split(";"))}


@pytest.mark.parametrize("length", [1, 5, 11])
def test_group_drawings_stay_inside_their_cards(tmp_path, length) -> None:  # type: ignore[no-untyped-def]
    """Chromium's layout boxes: every drawing of a group (and each of its boxes, labels and
    arrows) inside its card, each op label inside its box, no two cards overlapping, the
    page no wider than the window, whatever the group's length."""
    report = long_groups(tmp_path, length)
    assert len(report["ub_fusion"][0]["nodes"]) == length + 3
    page = tmp_path / "long.html"
    page.write_text(render_html(report), "utf-8")
    dom, log, shot = render(page, tmp_path)
    assert "Uncaught" not in log and 'data-error="' not in dom
    boxes = layout(dom)
    assert boxes["cards"] == 1
    assert boxes["outside"] == 0 and boxes["labels-outside"] == 0 and boxes["overlaps"] == 0
    assert boxes["page-width"] <= 1200


def test_cards_side_by_side_do_not_overlap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "many.html"
    page.write_text(render_html(many_groups(tmp_path)), "utf-8")
    boxes = layout(render(page, tmp_path)[0])
    assert boxes["cards"] == 2 and boxes["outside"] == 0 and boxes["overlaps"] == 0


def test_a_long_group_wraps_onto_rows_of_four() -> None:
    types = ["Conv", "DequantizeLinear", "QLinearGlobalAveragePool", "Mul", "Add", "Relu"]
    group = {"op_types": types, "nodes": [f"n{i}" for i in range(6)], "edges": [[0, 1]]}
    drawing = group_graph(group["op_types"], group["nodes"], group["edges"])
    width = int(re.search(r'width="(\d+)"', drawing)[1])  # type: ignore[index]
    assert width <= 560  # a card's width, at any length
    assert len(set(re.findall(r'<rect x="[\d.]+" y="([\d.]+)"', drawing))) == 2  # two rows
    # labels: whole words, two lines where one does not fit; every letter kept
    assert label_lines("DequantizeLinear", 14) == ["Dequantize", "Linear"]
    assert "".join(label_lines("QLinearGlobalAveragePool", 14)) == "QLinearGlobalAveragePool"
    assert label_lines("Mul", 14) == ["Mul"]


def test_chart_labels_are_cut_between_words_only() -> None:
    name = "Conv+HardSigmoid+Mul: /backbone/stage3/block.12/expand/activation/Conv_output_0"
    short = shorten(name, 40)
    assert len(short) <= 41 and "…" in short
    head, tail = short.split("…")
    assert name.startswith(head) and name.endswith(tail)
    # each piece ends (and starts) at a word boundary of the original
    assert head[-1] in "/+:_. " or name[len(head)].isupper()
    assert tail[0].isupper() or name[len(name) - len(tail) - 1] in "/+:_. "
    assert shorten("short", 40) == "short"
    assert shorten("x" * 80, 40) == "x" * 80  # one word is never cut


def test_columns_that_say_nothing_are_left_out() -> None:
    headers = ["Name", "removes (us)", "opfuse", "onnxruntime", "Original Node(s)", "us"]
    rows = [
        ["a", "n/a", "opfuse: no pass (the backend's)", "", "=", 1.0],
        ["b", "n/a", "opfuse: no pass (the backend's)", "", "=", 1.0],
    ]
    kept, cells, notes = fold_columns(headers, rows)
    assert kept == ["Name", "us"] and cells == [["a", 1.0], ["b", 1.0]]
    assert notes == [
        "Every row: opfuse: no pass (the backend's)",
        "Original Node(s): every name is the model's own node",
    ]
    # a column that differs, and a table of one row, stay as they are
    rows[1][2] = "opfuse: SomePass applies it"
    assert "opfuse" in fold_columns(headers, rows)[0]
    assert fold_columns(headers, rows[:1])[0] == headers
