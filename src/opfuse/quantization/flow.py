"""Fuse, quantize, clean up: the three steps of ``opfuse quantize`` on files.

1. ``fuse``: opfuse's default passes (the source documents fuse before quantizing:
   Conv+BN, BN small ops into one, bias/scale folding, NHWC Transpose pairs...), verified.
2. ``quantize``: onnxruntime.quantization's static QDQ quantization: int8 weights
   (per channel by default), uint8 or int8 activations, calibrated on the user's samples;
   ``exclude`` node names stay in float.
3. ``clean_up``: opfuse's exact rules for QDQ graphs, verified: Relu6QuantFusionPass (a
   Relu/Clip whose range the QuantizeLinear's saturation already gives is removed),
   QDQMovementFusionPass (Q/DQ around ops that only move data), and the common
   subexpression pass (duplicate Q/DQ pairs of one tensor).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from opfuse.errors import OpfuseError, first_line
from opfuse.pipeline.run import OptimizeResult, optimize_file
from opfuse.pipeline.switch import SwitchTable
from opfuse.rewrite.context import Options

if TYPE_CHECKING:
    import onnx

# the ops whose weights quantize_static quantizes and whose sensitivity is measured
WEIGHTED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
CLEAN_UP = {
    "GraphFusion": {
        "ALL": False,
        "Relu6QuantFusionPass": True,  # Relu/Clip the QuantizeLinear's saturation gives
        "QDQMovementFusionPass": True,  # Q(move(DQ(x))) with the same parameters: move(x)
        "CommonSubexpressionFusionPass": True,  # duplicate Q/DQ pairs of one tensor
    },
    "UBFusion": {"ALL": False},
}
ACTIVATION_TYPES = ("uint8", "int8")
PER_CHANNEL_OPSET = 13  # the axis attribute of QuantizeLinear/DequantizeLinear
CALIBRATE_METHODS = ("minmax", "entropy", "percentile")


@dataclass(frozen=True)
class QuantOptions:
    per_channel: bool = True
    activation_type: str = "uint8"
    calibrate_method: str = "minmax"


def fuse(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    switch_table: SwitchTable | None = None,
    enable: Sequence[str] = (),
    disable: Sequence[str] = (),
    target_opset: int | None = None,
    verify_inputs: str | os.PathLike[str] | None = None,
) -> OptimizeResult:
    """opfuse's default passes (or the switch file's), verified (on ``verify_inputs``, an
    .npz of one sample, when given); ``target_opset``: convert first (per-channel QDQ
    needs opset 13)."""
    return optimize_file(
        model,
        out,
        switch_table=switch_table,
        enable=enable,
        disable=disable,
        options=Options(target_opset=target_opset),
        inputs_npz=verify_inputs,
    )


def default_opset(model: str | os.PathLike[str]) -> int | None:
    import onnx

    proto = onnx.load_model(str(model), load_external_data=False)
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def quantize(
    fused: str | os.PathLike[str],
    out: str | os.PathLike[str],
    samples: Sequence[dict[str, np.ndarray]],
    options: QuantOptions,
    exclude: Sequence[str] = (),
) -> None:
    """Static QDQ quantization of ``fused`` into ``out``; ``exclude``: node names in float."""
    from onnxruntime import quantization as q

    methods = {
        "minmax": q.CalibrationMethod.MinMax,
        "entropy": q.CalibrationMethod.Entropy,
        "percentile": q.CalibrationMethod.Percentile,
    }

    class Reader(q.CalibrationDataReader):  # type: ignore[misc]
        """The samples, one at a time."""

        def __init__(self) -> None:
            self.it: Iterator[dict[str, np.ndarray]] = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

        def rewind(self) -> None:
            self.it = iter(samples)

    reader = Reader()
    from opfuse.runtime.ort import quiet as quiet_onnxruntime

    quiet_onnxruntime()  # the quantizer's own sessions log through its default logger
    quiet = logging.getLogger()  # the quantizer logs "consider pre-processing" on the root
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        q.quantize_static(
            str(fused),
            str(out),
            reader,
            quant_format=q.QuantFormat.QDQ,
            per_channel=options.per_channel,
            activation_type=(
                q.QuantType.QUInt8 if options.activation_type == "uint8" else q.QuantType.QInt8
            ),
            weight_type=q.QuantType.QInt8,
            nodes_to_exclude=list(exclude),
            calibrate_method=methods[options.calibrate_method],
        )
    except Exception as exc:  # onnxruntime's quantizer raises plain exceptions
        raise OpfuseError(f"{fused}: onnxruntime's quantizer failed: {first_line(exc)}") from None
    finally:
        quiet.setLevel(level)


def clean_up(
    qdq: str | os.PathLike[str],
    out: str | os.PathLike[str],
    verify_inputs: str | os.PathLike[str] | None = None,
) -> OptimizeResult:
    """The exact QDQ rules on the quantized model, verified against it (on
    ``verify_inputs`` when given)."""
    return optimize_file(qdq, out, switch_table=CLEAN_UP, inputs_npz=verify_inputs)


def weighted_nodes(model: str | os.PathLike[str]) -> list[str]:
    """Names of the nodes quantize_static quantizes the weights of, in graph order."""
    import onnx

    graph = onnx.load_model(str(model), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in WEIGHTED and n.name]


def quantized_nodes(qdq: str | os.PathLike[str]) -> list[str]:
    """Names of the nodes a QDQ model runs between DequantizeLinear and QuantizeLinear
    (every op the quantizer quantized, with or without weights), in graph order."""
    import onnx

    graph = onnx.load_model(str(qdq), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    quantized = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    return [
        n.name
        for n in graph.node
        if n.name
        and n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and (any(i in dequantized for i in n.input) or any(o in quantized for o in n.output))
    ]


def nothing_quantized(qdq: onnx.ModelProto) -> str | None:
    """Why a quantized model holds no QuantizeLinear at all (said in the summary), or None.
    onnxruntime's QDQ quantizer does not enter If/Loop/Scan bodies."""
    from opfuse.model.graphs import proto_graphs

    graph = qdq.graph
    if any(n.op_type == "QuantizeLinear" for g in proto_graphs(graph) for n in g.node):
        return None
    inside = sum(1 for g in list(proto_graphs(graph))[1:] for n in g.node if n.op_type in WEIGHTED)
    if inside:
        return (
            f"nothing was quantized: the model's {inside} Conv/MatMul/Gemm are inside "
            "If/Loop/Scan bodies, which onnxruntime's QDQ quantizer does not enter; the "
            "int8 model is the float one"
        )
    return "nothing was quantized (no op onnxruntime's quantizer handles): the int8 model is the float one"


def excluded_names(model: str | os.PathLike[str], exclude: Sequence[str]) -> list[str]:
    """``--exclude`` items (op types or node names) as node names of ``model``; an item
    matching nothing is a one-line OpfuseError."""
    import onnx

    graph = onnx.load_model(str(model), load_external_data=False).graph
    names: list[str] = []
    for item in exclude:
        found = [n.name for n in graph.node if item in (n.op_type, n.name) and n.name]
        if not found:
            raise OpfuseError(f"--exclude {item!r}: no op type or node of that name in {model}")
        names += [n for n in found if n not in names]
    return names
