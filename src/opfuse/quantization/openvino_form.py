"""The QDQ form OpenVINO runs in int8, made from onnxruntime's QDQ form.

onnxruntime's ``quantize_static`` (QDQ) wraps every op it handles in QuantizeLinear/
DequantizeLinear: the inputs *and outputs* of a Conv, its int32 bias behind a
DequantizeLinear, MaxPool/Relu/Reshape between pairs of the same scale. onnxruntime's
load-time QDQ fusion turns those groups into its integer kernels. OpenVINO reads the same
Q/DQ pairs as FakeQuantize ops and its low-precision transformations run a compute op in
int8 where its *inputs* are quantized; a pair on an output that feeds no quantized input
is a requantization it executes in float (a rounding step and time spent).

NNCF, OpenVINO's own quantizer, writes the convention this module writes (NNCF's ONNX
backend, ``nncf/common/hardware/setups/cpu.py`` and the min-max algorithm's insertion
points): Q/DQ on the data inputs of the compute ops -- activations and weights, weights
int8 with zero point 0 (symmetric), per output channel as onnxruntime made them -- and on
the input of an average pooling; biases and outputs in float. (NNCF's CPU setup also
lists the elementwise ops; kept quantized they made OpenVINO slower or lost a detector's
output on the measured models, see DEFAULT_OPS; ``ops`` adds them.)

:func:`openvino_form` keeps the pair of a tensor where one of its readers is such an input
(the other readers read the float tensor), removes the others, turns a DequantizeLinear of
a constant that no kept input reads (an int32 bias, the constant operand of an Add) into a
float constant of the same values, and re-quantizes a weight with a non-zero zero point
symmetrically. onnxruntime's quantizer folds a Relu or Clip into the pair after the op
before it (the pair's range, starting at 0, clamps instead); where such a pair goes and
nothing after it clamps, a Clip to that range takes its place (OpenVINO fuses it into the op
before it); quantizing with :data:`QUANTIZE_EXTRA_OPTIONS` keeps those activations and needs
no Clip. The scales are onnxruntime's calibration: the int8 model computes the same
function on the kept inputs, with fewer roundings (what it drops is a rounding of a float
value onnxruntime already computed), so its outputs are those of the onnxruntime form within
the steps of the dropped pairs. Main graph only (a subgraph's pairs are left as they are);
the model's inputs, outputs and node names are kept (a removed pair's names go with it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from opfuse.model.graphs import DEFAULT_DOMAINS

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
# op type -> the input positions whose Q/DQ pair is kept (data inputs; a bias is float)
COMPUTE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Conv": (0, 1),
    "ConvTranspose": (0, 1),
    "MatMul": (0, 1),
    "Gemm": (0, 1),
}
# elementwise ops whose inputs are kept quantized when every input is an activation
ELTWISE_OPS = frozenset({"Add", "Mul", "Sub", "Div"})
POOL_OPS = frozenset({"AveragePool", "GlobalAveragePool", "ReduceMean"})
# measured on the PP-OCRv4 recognizer and detector (onnxruntime's QDQ model of 10-17 real
# samples; OpenVINO 2026.4 CPU, one thread, AVX-512 VNNI, ratio to the float model at f32):
# the compute ops and pooling 0.58x and 0.55x, the detector's map IoU 64% on OpenVINO (82% on
# onnxruntime); with the residual Add kept quantized too, as fast, but the detector's output
# on OpenVINO is lost (map IoU 0%, 82% on onnxruntime); with Mul/Sub/Div too (the decomposed
# HardSwish's) 1.07x and 0.64x and the detector lost on both runtimes
DEFAULT_OPS = frozenset(COMPUTE_INPUTS) | POOL_OPS
# ops whose output is >= 0 whatever their input (a pair starting at 0 after them clamps nothing)
NON_NEGATIVE_OPS = frozenset(
    {"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "HardSigmoid", "Softplus", "Sqrt"}
)
# ops that keep every output value among (or pooled from) their data inputs' values:
# op type -> how many leading inputs are data (0: all)
MOVES: Mapping[str, int] = {
    "MaxPool": 1,
    "AveragePool": 1,
    "GlobalAveragePool": 1,
    "GlobalMaxPool": 1,
    "ReduceMax": 1,
    "ReduceMean": 1,
    "Reshape": 1,
    "Flatten": 1,
    "Transpose": 1,
    "Squeeze": 1,
    "Unsqueeze": 1,
    "Identity": 1,
    "Slice": 1,
    "Split": 1,
    "Resize": 1,
    "Upsample": 1,
    "DepthToSpace": 1,
    "SpaceToDepth": 1,
    "Gather": 1,
    "Concat": 0,
}
# readers that clamp at 0 themselves: the float tensor they read needs no Clip
CLAMPS = frozenset({"Relu", "Clip"})
# onnxruntime quantize_static extra_options for a model this module rewrites: the Relu and
# Clip nodes stay (onnxruntime otherwise folds them into the pair after the op before them,
# and the int8 form needs a Clip to keep their clamp)
QUANTIZE_EXTRA_OPTIONS: Mapping[str, object] = {"QDQKeepRemovableActivations": True}


@dataclass
class FormReport:
    """What :func:`openvino_form` did, counted."""

    kept_activation_pairs: int = 0
    removed_activation_pairs: int = 0
    kept_weights: int = 0
    float_constants: int = 0  # DequantizeLinear of a constant turned into a float constant
    requantized_weights: int = 0  # asymmetric weights made symmetric
    symmetric_activations: int = 0
    kept_tensors: list[str] = field(default_factory=list)  # activations still quantized

    def to_json(self) -> dict[str, object]:
        return {
            "kept_activation_pairs": self.kept_activation_pairs,
            "removed_activation_pairs": self.removed_activation_pairs,
            "kept_weights": self.kept_weights,
            "float_constants": self.float_constants,
            "requantized_weights": self.requantized_weights,
            "symmetric_activations": self.symmetric_activations,
        }


def openvino_form(
    qdq_model: onnx.ModelProto,
    *,
    ops: Iterable[str] = DEFAULT_OPS,
    symmetric_activations: bool = False,
) -> onnx.ModelProto:
    """A copy of ``qdq_model`` (onnxruntime's QDQ form) in the form OpenVINO runs in
    int8 (see the module). ``ops``: the op types whose inputs stay quantized (the compute
    ops always, their bias excepted; elementwise ops when all their inputs are activations);
    ``symmetric_activations``: re-quantize the kept activations with zero point 0 (uint8 when
    the calibrated range starts at 0, else int8 over the larger side), NNCF's performance
    preset, at the cost of a coarser step on a one-sided range."""
    return openvino_form_report(qdq_model, ops=ops, symmetric_activations=symmetric_activations)[0]


def openvino_form_report(
    qdq_model: onnx.ModelProto,
    *,
    ops: Iterable[str] = DEFAULT_OPS,
    symmetric_activations: bool = False,
) -> tuple[onnx.ModelProto, FormReport]:
    """:func:`openvino_form` and what it did."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq_model)
    form = _Form(model.graph, frozenset(ops))
    form.run(symmetric_activations)
    return model, form.report


class _Form:
    def __init__(self, graph: onnx.GraphProto, ops: frozenset[str]) -> None:
        self.graph = graph
        self.ops = ops
        self.report = FormReport()
        self.inits = {t.name: t for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            for i, name in enumerate(node.input):
                self.readers[name].append((node, i))
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name for i in graph.input}
        self.removed: set[int] = set()  # id() of removed nodes
        self.after: dict[int, list[onnx.NodeProto]] = defaultdict(list)  # id(anchor) -> nodes
        self.new_inits: list[onnx.TensorProto] = []

    # -------------------------------------------------------------- what stays quantized

    def _constant(self, name: str) -> bool:
        """An initializer, or a DequantizeLinear of one (a quantized constant)."""
        if name in self.inits:
            return True
        node = self.producer.get(name)
        return node is not None and node.op_type == DEQUANTIZE and node.input[0] in self.inits

    def _keeps(self, node: onnx.NodeProto, index: int) -> bool:
        """Whether input ``index`` of ``node`` stays quantized."""
        if node.op_type not in self.ops:
            return False
        if node.domain not in DEFAULT_DOMAINS:
            return False
        if node.op_type in COMPUTE_INPUTS:
            return index in COMPUTE_INPUTS[node.op_type]
        if node.op_type in ELTWISE_OPS:
            return not any(self._constant(name) for name in node.input if name)
        return index == 0  # pooling: its data input

    # ------------------------------------------------------------------------ the rewrite

    def run(self, symmetric_activations: bool) -> None:
        for node in list(self.graph.node):
            if node.op_type != DEQUANTIZE or node.domain not in DEFAULT_DOMAINS:
                continue
            if node.input[0] in self.inits:
                self._constant_dq(node)
            else:
                source = self.producer.get(node.input[0])
                if source is not None and source.op_type == QUANTIZE:
                    self._activation_pair(source, node, symmetric_activations)
        for node in list(self.graph.node):  # a QuantizeLinear nothing reads any more
            if (
                node.op_type == QUANTIZE
                and id(node) not in self.removed
                and not any(id(r) not in self.removed for r, _ in self.readers[node.output[0]])
                and node.output[0] not in self.outputs
            ):
                self.removed.add(id(node))
        kept = []
        for node in self.graph.node:
            if id(node) not in self.removed:
                kept.append(node)
            kept += self.after.get(id(node), [])
        del self.graph.node[:]
        self.graph.node.extend(kept)
        self.graph.initializer.extend(self.new_inits)
        used = {name for n in self.graph.node for name in n.input} | self.outputs
        used |= _subgraph_inputs(self.graph)
        keep = [t for t in self.graph.initializer if t.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep)

    def _live_readers(self, name: str) -> list[tuple[onnx.NodeProto, int]]:
        return [(n, i) for n, i in self.readers[name] if id(n) not in self.removed]

    def _constant_dq(self, dq: onnx.NodeProto) -> None:
        """A quantized constant: kept for the inputs that stay quantized (a weight),
        a float constant of the same values for the others (a bias, an Add's operand)."""
        out = dq.output[0]
        readers = self._live_readers(out)
        keep = [(n, i) for n, i in readers if self._keeps(n, i)]
        drop = [(n, i) for n, i in readers if not self._keeps(n, i)]
        if keep:
            self.report.kept_weights += 1
            self._symmetric_weight(dq)
        if not drop and (keep or out not in self.outputs):
            return
        values = _dequantize(dq, self.inits)
        if not keep:  # the whole DequantizeLinear becomes its float value, under its name
            self.removed.add(id(dq))
            self.new_inits.append(numpy_helper.from_array(values, out))
            self.report.float_constants += 1
            return
        name = self._fresh(f"{out}_float")
        self.new_inits.append(numpy_helper.from_array(values, name))
        self.report.float_constants += 1
        for reader, i in drop:
            reader.input[i] = name

    def _symmetric_weight(self, dq: onnx.NodeProto) -> None:
        """A weight with a non-zero zero point, re-quantized to int8 with zero point 0
        over the larger side of each channel (what OpenVINO's int8 kernels take)."""
        if len(dq.input) < 3 or not dq.input[2] or dq.input[2] not in self.inits:
            return
        zero = numpy_helper.to_array(self.inits[dq.input[2]])
        if not zero.any():
            return
        values = _dequantize(dq, self.inits)
        axis = _axis(dq, values.ndim)
        scale = numpy_helper.to_array(self.inits[dq.input[1]]).astype(np.float32)
        if scale.ndim == 1 and scale.size > 1:
            reduce = tuple(d for d in range(values.ndim) if d != axis)
            bound = np.abs(values).max(axis=reduce)
        else:
            bound = np.abs(values).max().reshape(scale.shape)
        new_scale = np.where(bound > 0, bound / 127.0, 1.0).astype(np.float32)
        shape = [1] * values.ndim
        if new_scale.ndim == 1 and new_scale.size > 1:
            shape[axis] = -1
        q = np.clip(np.round(values / new_scale.reshape(shape)), -127, 127).astype(np.int8)
        names = (
            self._fresh(f"{dq.input[0]}_symmetric"),
            self._fresh(f"{dq.input[1]}_symmetric"),
            self._fresh(f"{dq.input[2]}_symmetric"),
        )
        self.new_inits += [
            numpy_helper.from_array(q, names[0]),
            numpy_helper.from_array(new_scale, names[1]),
            numpy_helper.from_array(np.zeros_like(new_scale, dtype=np.int8), names[2]),
        ]
        dq.input[0], dq.input[1], dq.input[2] = names
        self.report.requantized_weights += 1

    def _activation_pair(
        self, q: onnx.NodeProto, dq: onnx.NodeProto, symmetric_activations: bool
    ) -> None:
        """Keep the pair for the readers whose input stays quantized; the others read the
        float tensor (clamped where the pair clamped a folded activation, see
        :meth:`_clamp`); the pair goes when none is left."""
        source, out = q.input[0], dq.output[0]
        readers = self._live_readers(out)
        keep = [(n, i) for n, i in readers if self._keeps(n, i)]
        drop = [(n, i) for n, i in readers if not self._keeps(n, i)]
        if not keep:
            self.removed.add(id(dq))
            self.report.removed_activation_pairs += 1
        else:
            self.report.kept_activation_pairs += 1
            self.report.kept_tensors.append(source)
        floating = source
        bounds = None
        if out in self.outputs or any(n.op_type not in CLAMPS for n, _ in drop):
            bounds = self._clamp(q, source)  # (a Relu reading the float tensor clamps itself)
        if bounds is not None:
            # a removed DequantizeLinear's graph output is made by the Clip itself
            removed_output = out in self.outputs and not keep
            floating = out if removed_output else self._fresh(f"{source}_clamped")
            self._insert_after(q, "Clip", [source, *self._bounds(bounds, q)], floating)
        for reader, i in drop:
            reader.input[i] = floating
            self.readers[floating].append((reader, i))
        if keep and symmetric_activations:
            self._symmetric_activation(q, dq)
        if out in self.outputs and floating != out:
            self._output_from(q, floating, out, renamed=keep != [])

    def _clamp(self, q: onnx.NodeProto, source: str) -> tuple[float, float] | None:
        """The range a removed pair clamped ``source`` to, where that clamp may be an
        activation onnxruntime folded into it (its quantizer removes a Relu or Clip whose
        input is quantized and lets the pair's range, starting at 0, clamp instead): a
        range starting at 0 on a tensor its producer does not already keep >= 0. The
        int8 form keeps that clamp as a Clip, which OpenVINO fuses into the op before it."""
        if len(q.input) < 2 or q.input[1] not in self.inits:
            return None
        scale = numpy_helper.to_array(self.inits[q.input[1]]).astype(np.float64)
        if scale.size != 1:
            return None
        if len(q.input) > 2 and q.input[2] in self.inits:
            zero = numpy_helper.to_array(self.inits[q.input[2]])
        else:
            zero = np.zeros((), np.uint8)
        info = np.iinfo(zero.dtype)
        if int(zero.reshape(-1)[0]) != info.min:
            return None  # the range holds negative values: no activation was folded
        if self._non_negative(source):
            return None
        return 0.0, (float(info.max) - float(info.min)) * float(scale.reshape(-1)[0])

    def _non_negative(self, name: str, depth: int = 0) -> bool:
        """``name`` is >= 0 in the int8 form: made by an op whose output is, or moved or
        pooled from tensors that are (a pair starting at 0 is, kept or clamped)."""
        producer = self.producer.get(name)
        if producer is None or depth > 32:
            return False
        if producer.op_type in NON_NEGATIVE_OPS:
            return True
        if producer.op_type == DEQUANTIZE:
            zero = producer.input[2] if len(producer.input) > 2 else ""
            if zero not in self.inits:
                return not zero  # no zero point: uint8 from 0
            z = numpy_helper.to_array(self.inits[zero])
            return z.size == 1 and int(z.reshape(-1)[0]) == np.iinfo(z.dtype).min
        if producer.op_type in MOVES:
            data = producer.input[: MOVES[producer.op_type]] or producer.input
            return all(self._non_negative(n, depth + 1) for n in data if n)
        return False

    def _bounds(self, bounds: tuple[float, float], q: onnx.NodeProto) -> list[str]:
        dtype = numpy_helper.to_array(self.inits[q.input[1]]).dtype
        names = [self._fresh(f"{q.input[0]}_clamp_min"), self._fresh(f"{q.input[0]}_clamp_max")]
        for name, value in zip(names, bounds, strict=True):
            self.new_inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return names

    def _insert_after(self, anchor: onnx.NodeProto, op: str, inputs: list[str], out: str) -> None:
        """A node placed right after ``anchor`` (whose input it reads: every reader of
        ``anchor``'s pair comes later)."""
        node = onnx.helper.make_node(op, inputs, [out], name=self._fresh(f"{out}_{op}"))
        self.after[id(anchor)].append(node)
        self.producer[out] = node

    def _output_from(self, q: onnx.NodeProto, floating: str, out: str, renamed: bool) -> None:
        """The graph output ``out`` (a removed or shared DequantizeLinear's) made from the
        float tensor ``floating``: that tensor renamed ``out`` where a node of the main
        graph makes it and nothing else names it (onnxruntime's
        ``<out>_QuantizeLinear_Input``), else an Identity. ``renamed``: the
        DequantizeLinear stays for its quantized readers, under another name."""
        dq = self.producer[out]
        if renamed:
            inner = self._fresh(f"{out}_dequantized")
            for reader, i in self._live_readers(out):
                reader.input[i] = inner
            self.readers[inner] = self.readers.pop(out, [])
            dq.output[0] = inner
            self.producer[inner] = dq
        maker = self.producer.get(floating)
        if (
            not renamed
            and maker is not None
            and floating not in self.outputs | self.inputs
            and floating not in _subgraph_inputs(self.graph)
        ):
            for reader, i in self._live_readers(floating):
                reader.input[i] = out
            maker.output[list(maker.output).index(floating)] = out
            infos = [v for v in self.graph.value_info if v.name != floating]
            del self.graph.value_info[:]
            self.graph.value_info.extend(infos)  # ``out`` is described by the graph output
            return
        self._insert_after(q, "Identity", [floating], out)

    def _symmetric_activation(self, q: onnx.NodeProto, dq: onnx.NodeProto) -> None:
        if len(q.input) < 3 or q.input[1] not in self.inits or q.input[2] not in self.inits:
            return
        scale = numpy_helper.to_array(self.inits[q.input[1]]).astype(np.float64)
        zero = numpy_helper.to_array(self.inits[q.input[2]])
        if scale.size != 1 or not zero.any():
            return
        info = np.iinfo(zero.dtype)
        lo = (float(info.min) - float(zero.item())) * float(scale.item())
        hi = (float(info.max) - float(zero.item())) * float(scale.item())
        if lo >= 0:  # cannot happen with a zero point inside the range; kept for clarity
            return
        bound = max(-lo, hi)
        new_scale = np.array(bound / 127.0, np.float32).reshape(scale.shape)
        new_zero = np.zeros(zero.shape, np.int8)
        names = (self._fresh(f"{q.input[1]}_symmetric"), self._fresh(f"{q.input[2]}_symmetric"))
        self.new_inits += [
            numpy_helper.from_array(new_scale, names[0]),
            numpy_helper.from_array(new_zero, names[1]),
        ]
        q.input[1], q.input[2] = names
        dq.input[1], dq.input[2] = names
        self.report.symmetric_activations += 1

    def _fresh(self, base: str) -> str:
        taken = self._taken()
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        return name

    def _taken(self) -> set[str]:
        if not hasattr(self, "_names"):
            names = set(self.inits) | self.inputs | self.outputs
            for node in self.graph.node:
                names.update(node.output)
                names.add(node.name)
            self._names = names
        return self._names


def _axis(dq: onnx.NodeProto, rank: int) -> int:
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    return axis + rank if axis < 0 else axis


def _dequantize(dq: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> np.ndarray:
    """A DequantizeLinear of constants, computed: (x - zero_point) * scale, per axis when
    the scale is a vector."""
    x = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    zero = np.zeros_like(scale)
    if len(dq.input) > 2 and dq.input[2]:
        zero = numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64)
    if scale.ndim == 1 and scale.size > 1 and x.ndim > 0:
        shape = [1] * x.ndim
        shape[_axis(dq, x.ndim)] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    dtype = numpy_helper.to_array(inits[dq.input[1]]).dtype
    return ((x - zero) * scale).astype(dtype)


def _subgraph_inputs(graph: onnx.GraphProto) -> set[str]:
    """Names the subgraphs of ``graph``'s nodes read (outer-scope references)."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                names.update(name for n in sub.node for name in n.input)
                names |= _subgraph_inputs(sub)
    return names
