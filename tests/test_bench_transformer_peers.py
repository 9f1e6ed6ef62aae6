"""The transformer benchmark's second encoder and peers without downloads: the weights read
back from a torch.onnx-style export (MatMul weights renamed and transposed), the config
taken from them, onnxsim's command lines, and the OpenVINO cell of the table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import quant_transformers as qt  # noqa: E402
from bench import transformer_models as tm  # noqa: E402
from bench import transformer_peers as tp  # noqa: E402
from tests.test_bench_transformers import CONFIG, tiny_weights  # noqa: E402

PREFIX = "model.0.auto_model."


def exported(weights: dict[str, np.ndarray]) -> Any:
    """bert_graph's model renamed the way torch.onnx.export names a sentence-transformers
    BertModel: named parameters under PREFIX, MatMul weights anonymous."""
    model = tm.bert_graph(weights, CONFIG)
    renames: dict[str, str] = {}
    for k, init in enumerate(model.graph.initializer):
        if init.name.endswith(".weight_T"):
            renames[init.name] = f"onnx::MatMul_{400 + k}"
        elif init.name.split(".")[0] in ("embeddings", "encoder"):
            renames[init.name] = PREFIX + init.name
        init.name = renames.get(init.name, init.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
    return model


def test_weights_from_export_names_and_transposes_matmul_weights_back() -> None:
    w = tiny_weights(np.random.default_rng(1))
    got = tm.weights_from_export(exported(w), PREFIX)
    for name, value in w.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert not any(k.startswith("onnx::") for k in got)


def test_weights_from_export_refuses_a_matmul_without_its_named_bias() -> None:
    model = exported(tiny_weights(np.random.default_rng(2)))
    bias = PREFIX + "encoder.layer.0.attention.self.query.bias"
    for init in model.graph.initializer:
        if init.name == bias:
            init.name = "onnx::Add_9"
    for node in model.graph.node:
        node.input[:] = ["onnx::Add_9" if i == bias else i for i in node.input]
    with pytest.raises(RuntimeError, match="no single named bias"):
        tm.weights_from_export(model, PREFIX)


def test_config_from_weights() -> None:
    w = tiny_weights(np.random.default_rng(3))
    config = tm.config_from_weights(w, {"num_attention_heads": 2, "hidden_size": 99})
    assert config == {"num_attention_heads": 2, "hidden_size": CONFIG["hidden_size"],
                      "vocab_size": CONFIG["vocab_size"],
                      "num_hidden_layers": CONFIG["num_hidden_layers"]}  # fmt: skip


def test_onnxsim_arguments() -> None:
    src, out = Path("a.onnx"), Path("b.onnx")
    assert tp.onnxsim_args("onnxsim-dynamic", src, out) == [
        "-m", "onnxsim", "a.onnx", "b.onnx", "--dynamic-quantize"]  # fmt: skip
    # int4 needs opset 21: without --target-opset onnxsim leaves the weights float
    assert tp.onnxsim_args("onnxsim-int4", src, out)[-3:] == [
        "--weight-only-quantize-int4", "--target-opset", "21"]  # fmt: skip
    assert set(tp.ONNXSIM_FLAGS) <= set(qt.TOOLS) and set(tp.ONNXSIM_FLAGS) <= set(qt.PEERS)


def test_openvino_cell() -> None:
    lat = {"ratio": {"ort-dynamic": 0.61}, "ratio_default": {"ort-dynamic": 0.93},
           "default_ratio": 0.66, "failed": {"onnxsim-int4": "RuntimeError: x"}}  # fmt: skip
    assert tp.ov_text(lat, "float") == "1.00 / 1.00"
    assert tp.ov_text(lat, "ort-dynamic") == "0.61 / 0.93"
    assert tp.ov_text(lat, "onnxsim-int4") == "does not compile"
    assert tp.ov_text(lat, "nncf") == ""  # no model: no cell
    assert tp.ov_text({}, "ort-dynamic") == ""


def test_peer_notes_say_amx_only_where_the_cpu_has_none() -> None:
    assert "bf16 on AMX is not measurable here" in qt.peer_notes("AVX2, AVX-512; no AMX")
    assert "AMX" not in qt.peer_notes("AVX2, AVX-512, AMX")
    assert qt.peer_notes("").endswith(qt.MISSING_CLASSIFIER)


def test_table_separates_encoders_and_shows_openvino() -> None:
    enc = {"calibration": 64, "held_out": 160,
           "latency": {"runtime": "ort", "float_ms": 30.0, "noise": 0.01, "rounds": 9,
                       "ratio": {"ort-dynamic": 0.5}},
           "openvino": {"runtime": "ov", "float_ms": 20.0, "noise": 0.003, "rounds": 8,
                        "default_precision": "bf16", "default_ratio": 0.57,
                        "ratio": {"ort-dynamic": 1.3}, "ratio_default": {"ort-dynamic": 2.2},
                        "failed": {}},
           "rows": {"float": {"cosine_mean": 1.0, "cosine_min": 1.0, "same_neighbour": 1.0},
                    "ort-dynamic": {"cosine_mean": 0.96, "cosine_min": 0.91,
                                    "same_neighbour": 0.82}}}  # fmt: skip
    results = {"cpus": 2, "load_before": "1 1 1", "load_after": "2 2 2",
               "encoders": {"a": {**enc, "note": "first"}, "b": {**enc, "note": "second"}}}  # fmt: skip
    section = qt.table(results, "python -m bench.quant_transformers")
    assert "rounds.\n\nsecond; 64 calibration" in section  # a blank line between encoders
    assert "| 0.960 / 0.910 | 82% | 0.50 | 1.30 / 2.20 |" in section
    assert "default precision here bf16 (the float model at it: 0.57 of f32)" in section
