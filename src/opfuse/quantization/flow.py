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
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from opfuse.errors import OpfuseError, first_line
from opfuse.pipeline.conductor import OptimizeResult, optimize_file
from opfuse.pipeline.switch import SwitchTable
from opfuse.quantization import ort_speedups, quantizer_input
from opfuse.quantization._stats import main_opset
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
    """Static QDQ quantization of the file ``fused`` into ``out``; ``exclude``: node names
    in float (``quantize_proto`` on files)."""
    import onnx

    notes: list[str] = []
    model = quantize_proto(
        onnx.load_model(str(fused)), samples, options, list(exclude), name=str(fused), notes=notes
    )
    onnx.save_model(model, str(out))


# a traceback through this function of onnxruntime's QDQ quantizer: its int32-bias
# weight-scale adjustment (it indexes the bias per output channel, so a Gemm bias shaped
# [1, N] makes "The truth value of an array ... is ambiguous"); the option turns it off
INT32_BIAS_ADJUST = "_adjust_weight_scale_for_int32_bias"
INT32_BIAS_OPTION = "QDQDisableWeightAdjustForInt32Bias"
CONTRIB_QDQ = "UseQDQContribOps"
MAX_WORKAROUNDS = 8


def quantize_proto(
    model: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
    options: QuantOptions,
    exclude: list[str],
    *,
    name: str,
    notes: list[str],
    overrides: dict[str, list[dict[str, object]]] | None = None,
    extra_options: dict[str, object] | None = None,
    calibration_cache: os.PathLike[str] | None = None,
) -> onnx.ModelProto:
    """Static QDQ quantization of ``model`` (in memory). ``exclude``: node names kept in
    float; ``overrides``: onnxruntime's ``TensorQuantOverrides`` (activation ranges).

    Never a crash on a valid model: when onnxruntime's quantizer raises, the option or
    node that makes it raise is found from its traceback and worked around (the int32-bias
    weight-scale adjustment turned off with ``QDQDisableWeightAdjustForInt32Bias``; else
    the node being quantized kept in float), and the quantization is run again; each
    workaround is appended to ``notes`` and kept in ``extra_options``/``exclude`` (the
    caller's objects) so later quantizations do not meet it again. A failure no
    workaround gets past is a QuantizeInternalError (exit 3) naming ``name``.
    ``calibration_cache``: a file onnxruntime keeps its calibration ranges in (read when
    it exists: the same float model and samples, not calibrated again)."""
    from opfuse.quantization.workspace import QuantizeInternalError

    extra = extra_options if extra_options is not None else {}
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        # only other domains' operators (ai.onnx.ml's, a converter's own): nothing it
        # quantizes, and it refuses such a model ("Failed to find proper ai.onnx domain")
        _note(notes, "no operator of the default domain: nothing for onnxruntime's quantizer")
        return model
    model, invented = quantizer_input.with_names(model)
    model = quantizer_input.with_ir_for_initializers(model)
    model, flattened = gemm_biases_as_vectors(model)
    if flattened:
        _note(
            notes,
            f"the bias of Gemm {', '.join(flattened)} is given to onnxruntime's quantizer "
            "as a vector [N] instead of [1, N] (the same broadcast): it cannot quantize a "
            "[1, N] bias per channel (it raises, or makes a model it cannot run)",
        )
    other = [n for n in quantizer_input.other_float_nodes(model) if n not in exclude]
    if other:
        _note(notes, f"{len(other)} nodes read or write float16, bfloat16 or double: kept in float")
    opset = main_opset(model)
    if not quantizer_input.qdq_kernels_at(opset) and not extra.get(CONTRIB_QDQ):
        extra[CONTRIB_QDQ] = True
        _note(
            notes,
            f"onnxruntime has no QuantizeLinear/DequantizeLinear kernels at opset {opset}: "
            "written in its com.microsoft domain",
        )
    unnamed: list[str] = []  # workarounds on nodes named here only: never the caller's
    for _ in range(MAX_WORKAROUNDS):
        try:
            made = _quantize_once(
                model,
                samples,
                options,
                [*exclude, *other, *unnamed],
                {**extra, **({"TensorQuantOverrides": overrides} if overrides else {})},
                cache=calibration_cache,
            )
            return quantizer_input.without_names(made, invented)
        except Exception as exc:  # onnxruntime's quantizer raises plain exceptions
            tried = [*exclude, *unnamed]
            fix = _workaround(exc, extra, tried)
            for node in tried[len(exclude) + len(unnamed) :]:
                if node in invented:  # said by what it makes: the name is not the user's
                    unnamed.append(node)
                    fix = (fix or "").replace(
                        f"node {node}", f"the unnamed node making {quantizer_input.made(node)}"
                    )
                else:
                    exclude.append(node)
            if fix is None:
                raise QuantizeInternalError(
                    f"{name}: onnxruntime's quantizer failed: {first_line(exc)}; try "
                    "--exclude with the op type or node it names, --per-tensor, or "
                    "--recipe minmax"
                ) from None
            _note(notes, f"onnxruntime's quantizer raised '{first_line(exc)}' {fix}")
    raise QuantizeInternalError(
        f"{name}: onnxruntime's quantizer still fails after {MAX_WORKAROUNDS} workarounds "
        f"({'; '.join(notes[-2:])}); try --exclude with the op types named"
    )


def _note(notes: list[str], note: str) -> None:
    """``note`` said once (each quantization of a run meets the same)."""
    if note not in notes:
        notes.append(note)


def gemm_biases_as_vectors(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose Gemm biases (C) shaped [1, N] are [N] (exact: C broadcasts
    to [M, N] the same way), and the names of those Gemms; ``model`` itself when none."""
    import onnx
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    found = [
        i
        for i, n in enumerate(model.graph.node)
        if n.op_type == "Gemm"
        and len(n.input) > 2
        and n.input[2] in inits
        and len(inits[n.input[2]].dims) == 2
        and inits[n.input[2]].dims[0] == 1
    ]
    if not found:
        return model, []
    made = onnx.ModelProto()
    made.CopyFrom(model)
    names = []
    for i in found:
        node = made.graph.node[i]
        bias = numpy_helper.to_array(inits[node.input[2]]).reshape(-1)
        name = node.input[2] if readers[node.input[2]] == 1 else f"{node.input[2]}__vector"
        for k, t in enumerate(made.graph.initializer):
            if t.name == name:
                del made.graph.initializer[k]
                break
        made.graph.initializer.append(numpy_helper.from_array(bias, name))
        node.input[2] = name
        names.append(node.name or f"#{i}")
    return made, names


def _workaround(exc: BaseException, extra: dict[str, object], exclude: list[str]) -> str | None:
    """Change ``extra``/``exclude`` so the quantizer does not meet ``exc`` again; what was
    done, or None when nothing in the traceback says what to change."""
    import onnx

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    names = [f.f_code.co_name for f in frames]
    if INT32_BIAS_ADJUST in names and not extra.get(INT32_BIAS_OPTION):
        extra[INT32_BIAS_OPTION] = True
        where = ""
        for frame in frames:
            info = frame.f_locals.get("bias_info")
            if info is not None and getattr(info, "node_name", None):
                where = f" (node {info.node_name})"
        return (
            f"in its int32-bias weight-scale adjustment{where}: quantized with "
            f"{INT32_BIAS_OPTION}=True (the bias is quantized with the weight's scale "
            "as chosen; only a bias too large for int32 at that scale would clip)"
        )
    # the innermost node the quantizer was working on: keep it in float
    for frame in reversed(frames):
        node = frame.f_locals.get("node")
        if isinstance(node, onnx.NodeProto) and node.name and node.name not in exclude:
            exclude.append(node.name)
            return f"while quantizing node {node.name} ({node.op_type}): that node is kept in float"
    return None


def _quantize_once(
    model: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
    options: QuantOptions,
    exclude: Sequence[str],
    extra_options: dict[str, object],
    cache: os.PathLike[str] | None = None,
) -> onnx.ModelProto:
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        """The samples, one at a time."""

        def __init__(self) -> None:
            self.it: Iterator[dict[str, np.ndarray]] = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

        def rewind(self) -> None:
            self.it = iter(samples)

    reader = Reader()
    from opfuse.model.io import STAGING_PREFIX
    from opfuse.runtime.ort import quiet as quiet_onnxruntime

    quiet_onnxruntime()  # the quantizer's own sessions log through its default logger
    quiet = logging.getLogger()  # the quantizer logs "consider pre-processing" on the root
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX + "q-") as tmp:
            src, out = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
            onnx.save_model(model, str(src))  # a ModelProto given to it loses large tensors
            with ort_speedups.faster_quantizer():
                _quantize_static(q, src, out, reader, options, exclude, extra_options, cache)
            return onnx.load_model(str(out))
    finally:
        quiet.setLevel(level)


def _quantize_static(
    q: Any,
    src: os.PathLike[str],
    out: os.PathLike[str],
    reader: Any,
    options: QuantOptions,
    exclude: Sequence[str],
    extra_options: dict[str, object],
    cache: os.PathLike[str] | None,
) -> None:
    """onnxruntime's ``quantize_static`` with opfuse's settings (``q``: its package)."""
    methods = {
        "minmax": q.CalibrationMethod.MinMax,
        "entropy": q.CalibrationMethod.Entropy,
        "percentile": q.CalibrationMethod.Percentile,
    }
    q.quantize_static(
        str(src),
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
        extra_options=dict(extra_options),
        calibration_cache_path=None if cache is None else str(cache),
    )


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
