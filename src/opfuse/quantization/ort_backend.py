"""The backend of ``opfuse quantize``: onnxruntime's quantizers (static QDQ, dynamic int8
``quantize_dynamic_proto``, weight-only int4 ``quantize_int4_proto``), behind this
one module (as NNCF keeps its backends' code in ``*_backend.py``): ``quantize_proto`` (the
model in memory, what the quantizer is given by ``quantizer_input``), the workarounds for
where it raises (read from its traceback), and its faster helpers (``ort_speedups``) in
place while it runs. ``kernels`` reads what onnxruntime runs of its output in integer
kernels. No other module of ``quantization/`` calls onnxruntime's quantizer."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opfuse.errors import first_line
from opfuse.model.graphs import DEFAULT_DOMAINS
from opfuse.quantization import ort_speedups, quantizer_input
from opfuse.quantization._stats import main_opset

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class QuantOptions:
    """What onnxruntime's quantizer is told: per-channel weights, the activations' type,
    the calibration method."""

    per_channel: bool = True
    activation_type: str = "uint8"
    calibrate_method: str = "minmax"


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
    if not any(o.domain in DEFAULT_DOMAINS for o in model.opset_import):
        # only other domains' operators (ai.onnx.ml's, a converter's own): nothing it
        # quantizes, and it refuses such a model ("Failed to find proper ai.onnx domain")
        _note(notes, "no operator of the default domain: nothing for onnxruntime's quantizer")
        return model
    model, invented, other = _prepared(model, exclude, extra, notes)
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


def _prepared(
    model: onnx.ModelProto, exclude: list[str], extra: dict[str, object], notes: list[str]
) -> tuple[onnx.ModelProto, set[str], list[str]]:
    """What the quantizer is given: every node named (``invented``: the names made here),
    an IR that holds its initializers, Gemm biases as vectors, the nodes of other float
    types (``other``: kept in float), the contrib Q/DQ where there are no kernels."""
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
    return model, invented, other


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
    with _quiet_files(model, "q-") as (src, out):
        with ort_speedups.faster_quantizer():
            _quantize_static(q, src, out, reader, options, exclude, extra_options, cache)
        return onnx.load_model(str(out))


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


def quantize_dynamic_proto(
    model: onnx.ModelProto, nodes: Sequence[str], per_channel: bool
) -> onnx.ModelProto:
    """onnxruntime's dynamic quantization of the MatMuls ``nodes`` (int8 weights,
    symmetric, per output channel with ``per_channel``; activations quantized at run time:
    onnxruntime fuses each into a DynamicQuantizeMatMul); a MatMul of two activations
    (attention's Q.K^T and P.V) stays float (``MatMulConstBOnly``)."""
    import onnx
    from onnxruntime import quantization as q

    with _quiet_files(model, "dq-") as (src, out):
        q.quantize_dynamic(
            str(src),
            str(out),
            per_channel=per_channel,
            weight_type=q.QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=list(nodes),
            extra_options={"MatMulConstBOnly": True, "WeightSymmetric": True},
        )
        return onnx.load_model(str(out))


INT4_BLOCK = 32  # the weights' block: one scale per 32 input channels of an output column


def quantize_int4_proto(
    model: onnx.ModelProto, nodes: Sequence[str], accuracy_level: int, bits: int = 4
) -> onnx.ModelProto:
    """onnxruntime's weight-only int4 quantization of the MatMuls ``nodes`` (constant 2-D
    weights): each becomes a MatMulNBits (com.microsoft), its weight 4-bit, symmetric, in
    blocks of INT4_BLOCK along the input channels, rounded to nearest (the quantizer's
    DEFAULT algorithm); ``accuracy_level``: MatMulNBits' (4: the activations in int8 for
    the dot products, where the CPU has VNNI; 0: unset, the weights dequantized to float).
    Every other MatMul, ``nodes`` excludes (the user's --exclude, the fallback's parts),
    is in ``nodes_to_exclude``; the activations stay float (no Q/DQ). ``bits=8``: the
    weights int8 the same way (the ``int8-weights`` recipe)."""
    nbits = _nbits_quantizer()
    wanted = set(nodes)
    others = {n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in wanted}
    with _quiet_files(model, "nb-") as (src, _out):
        config = nbits.DefaultWeightOnlyQuantConfig(
            block_size=INT4_BLOCK,
            is_symmetric=True,
            accuracy_level=accuracy_level,
            bits=bits,
        )
        quantizer = nbits.MatMulNBitsQuantizer(
            str(src), nodes_to_exclude=sorted(others), algo_config=config
        )
        quantizer.process()
        made: onnx.ModelProto = quantizer.model.model
        return made


def _nbits_quantizer() -> Any:
    """onnxruntime's ``matmul_nbits_quantizer`` module, imported without its
    ``logging.basicConfig(level=INFO)`` taking the root logger (it does so at import: a
    handler on stderr and the root at INFO for the rest of the process); a handler on
    the root meanwhile makes that call do nothing."""
    import sys

    name = "onnxruntime.quantization.matmul_nbits_quantizer"
    if name in sys.modules:
        return sys.modules[name]
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        import importlib

        return importlib.import_module(name)
    finally:
        root.removeHandler(guard)


@contextlib.contextmanager
def _quiet_files(model: onnx.ModelProto, prefix: str) -> Iterator[tuple[Path, Path]]:
    """The model saved in a staging folder (a ModelProto given to onnxruntime's quantizer
    loses large tensors) and where it writes its output; its logging quiet meanwhile (its
    sessions log through onnxruntime's default logger, it says "consider pre-processing"
    on the root logger)."""
    import tempfile

    import onnx

    from opfuse.model.io import STAGING_PREFIX
    from opfuse.runtime.ort import quiet as quiet_onnxruntime

    quiet_onnxruntime()
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX + prefix) as tmp:
            src, out = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
            onnx.save_model(model, str(src))
            yield src, out
    finally:
        root.setLevel(level)
