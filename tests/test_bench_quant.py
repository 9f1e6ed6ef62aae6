"""The int8 benchmark's harness (bench/quant.py) without downloads: the accuracy figures
against hand-computed values, the text-line finder on a drawn page, a built CNN through
onnxruntime's pipeline and the report, the docs section replaced in place."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdq_models import calibration, cnn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import quant  # noqa: E402


def test_accuracy_figures_by_hand() -> None:
    ref = [np.array([[3.0, 4.0]])]
    got = [np.array([[3.0, 3.0]])]
    acc = quant.accuracy(ref, got, classes=True)
    assert acc["sqnr_db"] == pytest.approx(10 * np.log10(25 / 1))
    assert acc["cosine"] == pytest.approx(21 / (5 * np.sqrt(18)))
    assert acc["max_abs"] == 1.0
    assert acc["top1"] == 0.0  # float says class 1, int8 ties to class 0
    assert "top5" not in acc  # two classes: no top-5


def test_top5_and_the_common_class() -> None:
    # 4 steps of 6 classes: float picks 0 (blank) on 3 steps and 5 on one
    ref = np.zeros((1, 4, 6))
    ref[0, :3, 0] = 1.0
    ref[0, 3, 5] = 1.0
    got = ref.copy()
    got[0, 3] = [0.0, 0.9, 0.8, 0.7, 0.6, 0.5]  # int8's best is 1; 5 is its 5th best
    acc = quant.accuracy([ref], [got], classes=True)
    assert acc["top1"] == 0.75 and acc["top5"] == 1.0
    assert acc["top1_rare"] == 0.0 and acc["common_share"] == 0.75
    assert quant.top1_text(acc) == "75.0% (0.0% off the common class)"


def test_text_lines_of_a_drawn_page() -> None:
    from PIL import Image

    page = np.full((100, 200), 230, np.uint8)
    page[10:22, 5:190] = 20  # two lines of "ink", 12 rows each
    page[50:62, 5:150] = 20
    lines = quant.text_lines(Image.fromarray(page).convert("RGB"))
    assert [ln.size for ln in lines] == [(200, 18), (200, 18)]  # 3 rows of margin
    crops = quant.text_crops(lines, 48, 96, rotate=True)
    assert all(c.shape == (1, 3, 48, 96) for c in crops)
    assert min(c.min() for c in crops) >= -1.0 and max(c.max() for c in crops) <= 1.0


def test_a_built_cnn_through_onnxruntime_and_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # quant_pre_process may leave files in the cwd
    model = cnn()
    path = tmp_path / "cnn.onnx"
    onnx.save_model(model, str(path))
    samples = calibration(model, 8)
    case = quant.Case("cnn", path, samples[:4], samples[4:], True, "a built CNN")
    out = tmp_path / "int8.onnx"
    quant.ort_quantize(case, out, tmp_path)
    ref = quant.outputs(path, case.evaluation)
    acc = quant.accuracy(ref, quant.outputs(out, case.evaluation), True)
    assert acc["sqnr_db"] > 15 and acc["cosine"] > 0.97
    results = {
        "cpu": "AVX2; no VNNI, no AMX",
        "models": {
            "cnn": {
                "note": case.note,
                "float_nodes": 7,
                "tools": {
                    "onnxruntime": {"quantize_s": 1.0, "nodes": 20, "accuracy": acc},
                    "nncf": {"error": "RuntimeError: nncf is not installed"},
                },
                "latency": {"onnxruntime": {"noise": 0.01, "ratio": {"onnxruntime": 0.8}}},
            }
        },
    }
    section = quant.table(results, "python -m bench.quant --models cnn")
    assert section.startswith(quant.MARK_BEGIN) and section.rstrip().endswith(quant.MARK_END)
    assert "| cnn | onnxruntime |" in section and "0.80x (+-1%)" in section
    assert "| cnn | nncf | RuntimeError: nncf is not installed |" in section
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text("# Benchmarks\n\ntext\n")
    quant.write_docs(docs, section)
    quant.write_docs(docs, section.replace("0.80x", "0.70x"))  # replaced, not appended
    text = docs.read_text()
    assert text.count(quant.MARK_BEGIN) == 1 and "0.70x" in text and "0.80x" not in text
    assert text.startswith("# Benchmarks\n\ntext\n")


def test_unknown_model_or_tool_is_refused() -> None:
    with pytest.raises(SystemExit):
        quant.parse_args(["--models", "nosuch"])
    with pytest.raises(SystemExit):
        quant.parse_args(["--tools", "nosuch"])


def test_probability_map_iou_at_the_detectors_threshold() -> None:
    ref = np.array([[0.0, 0.5, 0.9, 0.2]])
    got = np.array([[0.4, 0.1, 0.8, 0.2]])  # above 0.3: ref {1, 2}, got {0, 2}
    acc = quant.accuracy([ref], [got], classes=False)
    assert acc["map_iou"] == pytest.approx(1 / 3)
    assert quant.top1_text(acc) == "map IoU 33.3%"
    assert "map_iou" not in quant.accuracy([ref * 3], [got * 3], classes=False)  # not a map
