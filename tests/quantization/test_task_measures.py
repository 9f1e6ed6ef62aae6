"""Accuracy as the task measures it (issue 41): NaN or infinite samples refused, a NaN in
an output failing the gate, a map recognized through float rounding."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from test_quantize import sensitive_mlp

from opfuse.errors import OpfuseError
from opfuse.quantization.accuracy import OutputAccuracy, compare_output, is_map
from opfuse.quantization.conductor import quantize_file
from opfuse.quantization.gate import Gate


def _data(path, values):  # type: ignore[no-untyped-def]
    np.savez(path, x=np.asarray(values, np.float32))
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["calibration", "eval"])
def test_nan_or_inf_samples_are_refused_naming_the_array_and_sample(tmp_path, bad, where):
    model = sensitive_mlp(tmp_path / "m.onnx")
    good = np.random.default_rng(0).uniform(0.5, 1.0, (12, 16))
    broken = good.copy()
    broken[5, 3] = bad
    calib = _data(tmp_path / "c.npz", broken if where == "calibration" else good)
    held = _data(tmp_path / "e.npz", broken if where == "eval" else good)
    out = tmp_path / "out.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "opfuse", "quantize", str(model), "-o", str(out),
         "--calibration", str(calib), "--eval", str(held), "--no-benchmark"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()
    what = "NaN" if np.isnan(bad) else "an infinity"
    assert f"--{where} {tmp_path}" in line and f"sample 5, array 'x' holds {what}" in line
    assert not out.exists()


def test_all_nan_eval_data_in_memory_is_refused(tmp_path):
    model = sensitive_mlp(tmp_path / "m.onnx")
    calib = {"x": np.random.default_rng(0).uniform(0.5, 1.0, (12, 16)).astype(np.float32)}
    held = {"x": np.full((4, 16), np.nan, np.float32)}
    with pytest.raises(OpfuseError, match="eval: sample 0, array 'x' holds NaN"):
        quantize_file(model, tmp_path / "o.onnx", calib, eval=held, benchmark=False)
    assert not (tmp_path / "o.onnx").exists()


def test_a_nan_in_an_output_fails_every_gate():
    ref = np.ones((2, 4), np.float32)
    got = np.array([[1, np.nan, 1, 1], [1, 1, 1, 1]], np.float32)
    figures = compare_output("y", ref, got)
    assert np.isnan(figures.sqnr_db)
    for gate in ("auto", "sqnr=5", "top1=60%"):
        assert Gate.parse(gate).misses([figures]) == ["y: NaN in the output"]
    assert Gate.parse("off").misses([figures]) == []
    fine = OutputAccuracy("y", 30.0, 1.0, 0.0)
    assert not Gate.parse("auto").misses([fine])


def test_a_map_a_hair_above_one_is_still_a_map():
    """A float Sigmoid's 1.0000001 (PP-OCRv4's detector on one photo) keeps the output a
    map, judged by its IoU, not by its SQNR; a value well above 1 is no probability."""
    probs = np.random.default_rng(1).uniform(0, 1, (1, 1, 8, 8)).astype(np.float32)
    probs[0, 0, 0, 0] = np.float32(1.0000001)
    assert probs.max() > 1.0 and is_map(probs)
    assert not is_map(probs * 1.5)
    assert not is_map(probs - 0.01)  # below 0 by more than rounding
