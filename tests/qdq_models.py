"""Small float CNNs built with onnx.helper and their QDQ int8 versions made by
onnxruntime's own ``quantize_static`` on fixed calibration data (deterministic)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def cnn(
    channels: Sequence[int] = (16, 32),
    *,
    act: str = "Relu",
    size: int = 8,
    classes: int = 10,
    seed: int = 0,
) -> onnx.ModelProto:
    """x[1,3,size,size] -> (Conv 3x3 -> act) per entry of ``channels`` -> GAP -> Flatten
    -> Gemm -> y[1,classes]; node names conv{i}, act{i}, gap, flat, fc."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    prev, cin = "x", 3
    for i, cout in enumerate(channels, 1):
        w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * (1.0 / (3 * cin) ** 0.5)
        inits += [numpy_helper.from_array(w, f"w{i}")]
        inits += [
            numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"b{i}")
        ]
        nodes.append(
            helper.make_node(
                "Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]
            )
        )
        nodes.append(helper.make_node(act, [f"c{i}"], [f"a{i}"], name=f"act{i}"))
        prev, cin = f"a{i}", cout
    wf = rng.standard_normal((classes, cin)).astype(np.float32) * (1.0 / cin**0.5)
    inits += [
        numpy_helper.from_array(wf, "wf"),
        numpy_helper.from_array(np.zeros(classes, np.float32), "bf"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def calibration(model: onnx.ModelProto, n: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """``n`` fixed samples for the model's one input."""
    rng = np.random.default_rng(seed)
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    return [{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def quantize(
    model: onnx.ModelProto,
    tmp: Path,
    *,
    exclude: Sequence[str] = (),
    per_channel: bool = True,
    extra: dict[str, object] | None = None,
    samples: Sequence[dict[str, np.ndarray]] | None = None,
) -> onnx.ModelProto:
    """The QDQ model onnxruntime's ``quantize_static`` makes of ``model`` (uint8
    activations, int8 weights, MinMax on ``samples``, by default :func:`calibration`)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calibration(model) if samples is None else samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)

    tmp.mkdir(parents=True, exist_ok=True)
    src, dst = tmp / "float.onnx", tmp / "int8.onnx"
    onnx.save_model(model, str(src))
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process, once per call
    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=list(exclude),
        extra_options=extra or {},
    )
    return onnx.load_model(str(dst))
