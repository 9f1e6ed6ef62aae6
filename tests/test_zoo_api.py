"""The public API on real exported models (slow: needs ../shared/zoo)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import opfuse

pytestmark = pytest.mark.slow


def _ort_all(model: str | bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_small"])
def test_inference_session_on_a_zoo_model(zoo_dir, name):
    path = zoo_dir / f"{name}.onnx"
    before = path.read_bytes()
    sess = opfuse.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert path.read_bytes() == before and sess.optimize_result.changed
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in sess.get_inputs():
        shape = [
            d if isinstance(d, int) else (1 if i == 0 else 32) for i, d in enumerate(spec.shape)
        ]
        if spec.type == "tensor(float)":
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(np.int64)
    want = _ort_all(str(path), feeds)
    got = sess.run(None, feeds)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    if name == "resnet18":  # every fold is one onnxruntime does itself, in its arithmetic
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g)


def test_optimize_a_zoo_model_proto_in_memory(zoo_dir):
    proto = onnx.load(str(zoo_dir / "keras_mobilenetv3small.onnx"))
    result = opfuse.optimize(proto)
    assert isinstance(result.model, onnx.ModelProto)
    assert result.verify is not None and result.verify.ok
    assert sum(result.after.values()) < sum(result.before.values())
