"""The advisor on a quantized (QDQ) model: findings in the advisor's form (what, why it
costs, what to do), read from the model, from the graph onnxruntime runs after its QDQ
fusion (``quantization.kernels``), from the profile's times and from the CPU's features:

- Q/DQ pairs the runtime cannot fuse (float ops left between DequantizeLinear and
  QuantizeLinear: every such op converts its input to float and back);
- requantization: an int8 op's output dequantized only to be quantized again;
- Conv/MatMul/Gemm left in float, with what they cost in the profile;
- channel counts that are not multiples of the int8 kernels' vector width;
- "int8 does not pay on this CPU", where a paired measurement against the same model
  with its Q/DQ removed (float weights, the dequantized values) says so."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from onnx import numpy_helper

from opfuse.errors import OpfuseError
from opfuse.model.graphs import proto_wiring
from opfuse.quantization.kernels import (
    COMPUTE_OPS,
    DEQUANTIZE,
    QUANTIZE,
    compute_macs,
    integer_coverage,
)
from opfuse.runtime import Runtime
from opfuse.runtime.cpu import REDUCTION_MULTIPLE, CpuFeatures, cpu_features

MAX_NODES = 8  # node names listed per finding


class PairedLatency(Protocol):
    """What ``int8_pays`` reads of a paired measurement (tuning.measure's ``Measurement``)."""

    @property
    def runtime(self) -> str: ...

    @property
    def noise(self) -> float: ...

    @property
    def threshold(self) -> float: ...

    def ratio(self, label: str) -> float: ...


# measure(original, {label: path}, runtime, seconds=..., input_shapes=...)
MeasurePair = Callable[..., PairedLatency]


def is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in (QUANTIZE, DEQUANTIZE) for n in model.graph.node)


def finding(
    kind: str, finding: str, why: str, what: str, nodes: list[str], cost_us: float = 0.0
) -> dict[str, object]:
    return {
        "kind": kind,
        "finding": finding,
        "why": why,
        "what_to_do": what,
        "nodes": nodes[:MAX_NODES],
        "count": len(nodes),
        "cost_us": round(cost_us, 3),
    }


def unfused_qdq(
    model: onnx.ModelProto,
    providers: list[str] | None,
    cost_of: Callable[[list[str]], float] | None = None,
) -> list[dict[str, object]]:
    """``cost_of``: the profiled time of these model nodes (each kernel counted once)."""
    cov = integer_coverage(model, providers)
    if not cov.float_between_qdq:
        return []
    nodes = [n for n in cov.float_nodes if n] or sorted(cov.float_between_qdq)
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(cov.float_between_qdq.items()))
    return [
        finding(
            "unfused_qdq",
            f"onnxruntime keeps {sum(cov.float_between_qdq.values())} float ops between "
            f"DequantizeLinear and QuantizeLinear ({ops}); {cov.integer_fraction:.0%} of "
            "the Conv/MatMul/Gemm multiply-adds run in integer kernels",
            "each runs in float: its input is dequantized and its output quantized again, "
            "two extra passes over the tensor that a float model does not make",
            "keep these ops in float (exclude them, or their producer, from quantization "
            "so the Q/DQ pair goes away), or use ops onnxruntime has int8 kernels for "
            "(Relu/Clip instead of HardSwish, Sigmoid instead of HardSigmoid)",
            nodes,
            cost_of(nodes) if cost_of is not None else 0.0,
        )
    ]


def requantizations(model: onnx.ModelProto) -> list[dict[str, object]]:
    """A DequantizeLinear whose output a QuantizeLinear reads directly."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}

    def params(node: onnx.NodeProto) -> list[object]:
        """Scale and zero point: their values where constant, else their names."""
        return [consts[i].tolist() if i in consts else i for i in node.input[1:]]

    same: list[str] = []
    differ: list[str] = []
    for q in graph.node:
        if q.op_type != QUANTIZE or not q.input:
            continue
        dq = producer.get(q.input[0])
        if dq is None or dq.op_type != DEQUANTIZE:
            continue
        (same if params(dq) == params(q) else differ).append(q.name or dq.name)
    out = []
    if same:
        out.append(
            finding(
                "requantize",
                f"{len(same)} DequantizeLinear -> QuantizeLinear pairs with the same scale "
                "and zero point",
                "the pair converts int8 to float and back to the same int8 values: work "
                "with no effect, and it can keep onnxruntime from fusing the ops around it",
                "remove the pair (exact: the values are unchanged); opfuse quantize's QDQ "
                "clean-up does",
                same,
            )
        )
    if differ:
        out.append(
            finding(
                "requantize",
                f"{len(differ)} int8 outputs dequantized only to be quantized again with "
                "another scale",
                "a requantization through float: two passes over the tensor, and rounding twice",
                "give the producer the consumer's scale (calibrate them as one tensor), or "
                "let the producer's int8 op write the second scale directly",
                differ,
            )
        )
    return out


def float_layers(
    model: onnx.ModelProto, times_us: Mapping[str, float], total_us: float
) -> list[dict[str, object]]:
    """Conv/MatMul/Gemm with no DequantizeLinear before them: left in float."""
    dq_out = {o for n in model.graph.node if n.op_type == DEQUANTIZE for o in n.output}
    left = [
        n.name
        for n in model.graph.node
        if n.op_type in COMPUTE_OPS and not any(i in dq_out for i in n.input)
    ]
    if not left:
        return []
    left.sort(key=lambda name: -times_us.get(name, 0.0))
    cost = sum(times_us.get(name, 0.0) for name in left)
    macs = compute_macs(model)
    share = sum(macs.get(n, 0) for n in left) / (sum(macs.values()) or 1)
    timed = f", {cost:.1f} us ({cost / total_us:.0%} of the profile)" if total_us else ""
    return [
        finding(
            "float_layer",
            f"{len(left)} Conv/MatMul/Gemm left in float ({share:.0%} of the multiply-adds{timed})",
            "they run the float kernels, and the int8 tensors around them are converted "
            "to float and back",
            "quantize them unless they must stay float for accuracy (opfuse quantize's "
            "sensitivity fallback names the layers that must, and what each costs)",
            left,
            cost,
        )
    ]


def channel_counts(
    model: onnx.ModelProto, cpu: CpuFeatures, times_us: Mapping[str, float]
) -> list[dict[str, object]]:
    """Quantized Conv/Gemm/MatMul whose output channels are not a multiple of the CPU's
    int8 channel multiple, or whose input channels per group are not a multiple of 4."""
    graph = model.graph
    consts = {t.name: list(t.dims) for t in graph.initializer}
    weight_shape = {
        n.output[0]: consts[n.input[0]]
        for n in graph.node
        if n.op_type == DEQUANTIZE and n.input and n.input[0] in consts
    }
    m = cpu.channel_multiple
    odd, wasted = [], 0.0
    for n in graph.node:
        if n.op_type not in COMPUTE_OPS or len(n.input) < 2 or n.input[1] not in weight_shape:
            continue
        w = weight_shape[n.input[1]]
        if n.op_type == "Conv":
            cout, cin = w[0], w[1] if len(w) > 1 else 1
        else:  # MatMul [K, N]; Gemm [K, N] or, transB, [N, K]
            trans_b = any(a.name == "transB" and a.i for a in n.attribute)
            cin, cout = (w[-1], w[-2]) if trans_b else (w[-2], w[-1])
        if n.op_type == "Conv" and cin == 1:
            continue  # depthwise: the channels are the vector lanes, no reduction
        pad_out = -(-cout // m) * m
        pad_in = -(-cin // REDUCTION_MULTIPLE) * REDUCTION_MULTIPLE
        waste = 1 - (cout * cin) / (pad_out * pad_in)
        if waste > 0:
            odd.append((n.name, cout, cin, waste))
            wasted += waste * times_us.get(n.name, 0.0)
    if not odd:
        return []
    odd.sort(key=lambda r: -r[3] * max(times_us.get(r[0], 0.0), 1e-9))
    examples = ", ".join(f"{name} ({co} out, {ci} in)" for name, co, ci, _ in odd[:3])
    return [
        finding(
            "channels",
            f"{len(odd)} quantized layers have channel counts that are not multiples of the "
            f"int8 vector width ({m} output channels, {REDUCTION_MULTIPLE} input channels on "
            f"this CPU: {cpu.describe()}), e.g. {examples}",
            f"an int8 kernel fills one vector register with {m} int32 accumulators, each "
            f"summing {REDUCTION_MULTIPLE} byte products: a remainder leaves lanes idle "
            "(padded or a scalar tail) in every output row",
            f"where the architecture allows, round channel counts up to multiples of {m} "
            "(e.g. in a re-designed or re-pruned model); the padding costs the idle lanes "
            "anyway",
            [r[0] for r in odd],
            wasted,
        )
    ]


def dequantized_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model without Q/DQ: each DequantizeLinear of a constant becomes the
    constant it computes (float), each activation QuantizeLinear -> DequantizeLinear pair
    an identity, or a Relu where its range starts at 0 (a quantizer drops a Relu whose
    output it quantizes from zero: the Q clamps instead). What the int8 model would be
    in float, for a paired measurement."""
    graph = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer, consumers = proto_wiring(graph)
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    new_consts: list[onnx.TensorProto] = []
    keep: list[onnx.NodeProto] = []
    for n in graph.node:
        if n.op_type == DEQUANTIZE and n.input[0] in consts:
            x = consts[n.input[0]].astype(np.float32)
            scale = consts[n.input[1]].astype(np.float32)
            zp = consts[n.input[2]].astype(np.float32) if len(n.input) > 2 else np.float32(0)
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            if scale.ndim == 1 and x.ndim > 1:
                shape = [1] * x.ndim
                shape[axis] = -1
                scale, zp = scale.reshape(shape), np.reshape(zp, shape if np.ndim(zp) else ())
            new_consts.append(
                numpy_helper.from_array(((x - zp) * scale).astype(np.float32), n.output[0])
            )
            continue
        if n.op_type == DEQUANTIZE:
            q = producer.get(n.input[0])
            if q is not None and q.op_type == QUANTIZE:
                if _clamps_at_zero(q, consts):  # the quantizer folded a Relu into Q
                    keep.append(onnx.helper.make_node("Relu", [q.input[0]], [n.output[0]],
                                                      name=f"{q.name}_as_Relu"))  # fmt: skip
                else:
                    rename[n.output[0]] = q.input[0]
                continue
        if n.op_type == QUANTIZE and n.output[0] not in outputs:
            readers = consumers.get(n.output[0], [])
            if readers and all(r.op_type == DEQUANTIZE for r in readers):
                continue  # a Q -> DQ pair of an activation, replaced above
        keep.append(n)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for n in keep:
        for i, name in enumerate(n.input):
            while name in rename:
                name = rename[name]
            n.input[i] = name
    out.graph.node.extend(keep)
    for o in out.graph.output:  # a graph output that was a DQ's: its float source
        name = o.name
        if name in rename:
            src = rename[name]
            for n in out.graph.node:
                for i, o2 in enumerate(n.output):
                    if o2 == src:
                        n.output[i] = name
                for i, inp in enumerate(n.input):
                    if inp == src:
                        n.input[i] = name
    used = {i for n in out.graph.node for i in n.input}
    del out.graph.initializer[:]
    out.graph.initializer.extend(t for t in graph.initializer if t.name in used)
    out.graph.initializer.extend(t for t in new_consts if t.name in used)
    del out.graph.value_info[:]
    return out


def _clamps_at_zero(q: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> bool:
    """A QuantizeLinear whose lowest code dequantizes to 0: uint8 with zero point 0, or
    int8 with zero point -128."""
    if len(q.input) < 3 or q.input[2] not in consts:
        return False
    zp = consts[q.input[2]]
    low = np.iinfo(zp.dtype).min if np.issubdtype(zp.dtype, np.integer) else None
    return low is not None and bool(np.all(zp == low))


def int8_pays(
    model_path: str | os.PathLike[str],
    runtime: Runtime,
    seconds: float,
    cpu: CpuFeatures,
    measure: MeasurePair | None = None,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
) -> list[dict[str, object]]:
    """Measure the QDQ model against its float twin (paired, the original twice); a
    finding when int8 is not faster beyond the noise."""
    if measure is None:
        from opfuse.tuning.measure import measure as measure_fn

        measure = measure_fn
    model = onnx.load_model(str(model_path))
    with tempfile.TemporaryDirectory(prefix="opfuse-int8-pays-") as tmp:
        twin = Path(tmp) / "float.onnx"
        onnx.save_model(dequantized_float(model), str(twin))
        m = measure(
            twin,
            {"int8": str(model_path)},
            runtime,
            seconds=seconds,
            input_shapes=input_shapes,
            inputs_npz=inputs_npz,
        )
    ratio = m.ratio("int8")
    noise = m.threshold
    figures = f"int8 {ratio:.2f}x the float twin's latency (noise +-{m.noise:.0%}, {m.runtime})"
    if ratio < 1 - noise:
        return []
    if cpu.vnni or cpu.amx:
        what = (
            "remove what eats the int8 kernels' gain (the float ops between DQ and Q and the "
            "float layers above), try another runtime (OpenVINO), or ship the float model "
            "optimized (opfuse optimize)"
        )
    else:
        what = (
            "ship the float model optimized (opfuse optimize) on this machine; int8 needs a "
            "CPU with VNNI or AMX, another runtime (OpenVINO), or an accelerator to pay"
        )
    return [
        finding(
            "int8_does_not_pay",
            f"int8 does not pay on this CPU: {figures}",
            f"{cpu.int8_verdict()} (this CPU: {cpu.describe()})",
            what,
            [],
        )
    ]


def quantized_findings(
    model_path: str | os.PathLike[str],
    *,
    times_us: Mapping[str, float] | None = None,
    total_us: float = 0.0,
    providers: list[str] | None = None,
    cpu: CpuFeatures | None = None,
    runtime: Runtime | None = None,
    seconds: float = 0.0,
    cost_of: Callable[[list[str]], float] | None = None,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
) -> list[dict[str, object]]:
    """Every finding on the QDQ model at ``model_path`` ([] for a float model).
    ``times_us``: the profile's time per model node name; ``cost_of``: the time of a set
    of model nodes (each kernel once); ``runtime`` and ``seconds``: measure int8 against
    the float twin (no measurement without them), on inputs of ``input_shapes``."""
    model = onnx.load_model(str(model_path))
    if not is_quantized(model):
        return []
    cpu = cpu or cpu_features()
    times = dict(times_us or {})
    out = unfused_qdq(model, providers, cost_of)
    out += requantizations(model)
    out += float_layers(model, times, total_us)
    out += channel_counts(model, cpu, times)
    if runtime is not None and seconds > 0:
        # a twin the runtime refuses (e.g. integer-only ops): no verdict
        with contextlib.suppress(OpfuseError):
            out += int8_pays(
                model_path,
                runtime,
                seconds,
                cpu,
                input_shapes=input_shapes,
                inputs_npz=inputs_npz,
            )
    return out
