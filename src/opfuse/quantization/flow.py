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

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from opfuse.errors import OpfuseError, first_line
from opfuse.pipeline.conductor import OptimizeResult, optimize_file
from opfuse.pipeline.switch import SwitchTable
from opfuse.quantization import ort_backend
from opfuse.quantization.ort_backend import QuantOptions
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

    from opfuse.model.io import default_opset as opset_of

    return opset_of(onnx.load_model(str(model), load_external_data=False))


def quantize(
    fused: str | os.PathLike[str],
    out: str | os.PathLike[str],
    samples: Sequence[dict[str, np.ndarray]],
    options: QuantOptions,
    exclude: Sequence[str] = (),
) -> None:
    """Static QDQ quantization of the file ``fused`` into ``out``; ``exclude``: node names
    in float (``quantize_proto`` on files)."""
    import onnx

    notes: list[str] = []
    model = ort_backend.quantize_proto(
        onnx.load_model(str(fused)), samples, options, list(exclude), name=str(fused), notes=notes
    )
    onnx.save_model(model, str(out))


def clean_up_proto(
    qdq: onnx.ModelProto,
    verify_inputs: dict[str, np.ndarray] | None = None,
    name: str = "the model",
) -> onnx.ModelProto:
    """``clean_up`` on a model in memory (verified on the sample ``verify_inputs``)."""
    import tempfile
    from pathlib import Path

    import onnx

    from opfuse.model.io import STAGING_PREFIX

    with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX + "clean-") as tmp:
        src, out = Path(tmp) / "qdq.onnx", Path(tmp) / "clean.onnx"
        onnx.save_model(sorted_graph(qdq), str(src))
        sample = None
        if verify_inputs is not None:
            sample = Path(tmp) / "sample.npz"
            np.savez(sample, **cast(dict[str, Any], verify_inputs))  # stubs: allow_pickle
        try:
            clean_up(src, out, sample)
        except OpfuseError as exc:  # the quantized model: a failure here is ours
            from opfuse.quantization.workspace import QuantizeInternalError

            raise QuantizeInternalError(
                f"{name}: the quantized model fails its clean-up: "
                f"{first_line(exc).replace(str(src), 'the int8 model')}; try --exclude with "
                "the op type it names"
            ) from None
        return onnx.load_model(str(out))


def sorted_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes in topological order, counting what a subgraph reads from
    the graph around it: onnxruntime's quantizer sorts by the nodes' own inputs only, and
    leaves an If whose branch reads a tensor made after it (onnx's AffineGrid function,
    expanded), which onnxruntime runs but onnx.checker refuses. ``model`` itself when no
    node has a subgraph (nothing else can be out of order)."""
    import onnx

    from opfuse.model.set_aside import from_proto, to_proto

    graphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    if not any(a.type in graphs for n in model.graph.node for a in n.attribute):
        return model
    in_ir = from_proto(model)  # what onnx-ir cannot hold (a ZipMap's map types) set aside
    in_ir.graph.sort()
    return to_proto(in_ir)


def clean_up(
    qdq: str | os.PathLike[str],
    out: str | os.PathLike[str],
    verify_inputs: str | os.PathLike[str] | None = None,
) -> OptimizeResult:
    """The exact QDQ rules on the quantized model, verified against it (on
    ``verify_inputs`` when given)."""
    return optimize_file(qdq, out, switch_table=CLEAN_UP, inputs_npz=verify_inputs)


def weighted_nodes(model: str | os.PathLike[str] | onnx.ModelProto) -> list[str]:
    """Names of the nodes quantize_static quantizes the weights of, in graph order."""
    graph = as_proto(model).graph
    return [n.name for n in graph.node if n.op_type in WEIGHTED and n.name]


def quantized_nodes(qdq: str | os.PathLike[str] | onnx.ModelProto) -> list[str]:
    """Names of the nodes a QDQ model runs between DequantizeLinear and QuantizeLinear
    (every op the quantizer quantized, with or without weights), in graph order."""
    graph = as_proto(qdq).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    quantized = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    return [
        n.name
        for n in graph.node
        if n.name
        and n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and (any(i in dequantized for i in n.input) or any(o in quantized for o in n.output))
    ]


# what a quantized model holds without a QuantizeLinear: dynamic int8 (the activations
# quantized at run time), weight-only int4
WITHOUT_QDQ = frozenset({"DynamicQuantizeLinear", "MatMulInteger", "MatMulNBits"})


def nothing_quantized(qdq: onnx.ModelProto) -> str | None:
    """Why a quantized model holds no QuantizeLinear at all (said in the summary), or None
    (nor where it holds dynamic int8 or weight-only int4 ops: WITHOUT_QDQ). onnxruntime's
    QDQ quantizer does not enter If/Loop/Scan bodies."""
    from opfuse.model.graphs import proto_graphs

    graph = qdq.graph
    made = {"QuantizeLinear", *WITHOUT_QDQ}
    if any(n.op_type in made for g in proto_graphs(graph) for n in g.node):
        return None
    inside = sum(1 for g in list(proto_graphs(graph))[1:] for n in g.node if n.op_type in WEIGHTED)
    if inside:
        return (
            f"nothing was quantized: the model's {inside} Conv/MatMul/Gemm are inside "
            "If/Loop/Scan bodies, which onnxruntime's QDQ quantizer does not enter; the "
            "int8 model is the float one"
        )
    return "nothing was quantized (no op onnxruntime's quantizer handles): the int8 model is the float one"


LEADING_KEY = "leading="  # --exclude leading=25%: the leading layers up to 25% of the MACs


def excluded_names(
    model: str | os.PathLike[str] | onnx.ModelProto,
    exclude: Sequence[str],
    name: str = "",
    feed: Mapping[str, np.ndarray] | None = None,
) -> list[str]:
    """``--exclude`` items (op types or node names of the fused model, or ``leading=SHARE``:
    the leading layers up to that share of the multiply-adds with the shapes of ``feed``,
    ``float_stem.stem_nodes``) as node names of ``model``; an item matching nothing is a
    one-line OpfuseError naming ``name``."""
    from opfuse.quantization.float_stem import stem_nodes

    proto = as_proto(model)
    graph = proto.graph
    names: list[str] = []
    for item in exclude:
        found = [n.name for n in graph.node if item in (n.op_type, n.name) and n.name]
        if not found and item.startswith(LEADING_KEY):
            found = stem_nodes(proto, feed, leading_share(item))
            if not found:
                raise OpfuseError(
                    f"--exclude {item!r}: the first layer of {name or model} alone is more "
                    "than that share of its multiply-adds, or every layer is within it"
                )
        if not found:
            raise OpfuseError(
                f"--exclude {item!r}: no op type or node of that name in {name or model} "
                "(after fusion)"
            )
        names += [n for n in found if n not in names]
    return names


def leading_share(item: str) -> float:
    """The share of ``leading=SHARE`` (25% or 0.25), between 0 and 1 exclusive."""
    text = item.removeprefix(LEADING_KEY).strip()
    try:
        share = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        share = math.nan
    if not 0 < share < 1:
        raise OpfuseError(
            f"--exclude {item!r}: leading=SHARE takes a share of the multiply-adds above 0 "
            "and below 1, as a percentage (leading=25%) or a fraction (leading=0.25)"
        )
    return share


def as_proto(model: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in memory (a file is loaded without its external data)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load_model(str(model), load_external_data=False)
