"""Cross-layer equalization with bias absorption (Nagel et al. 2019, "Data-Free Quantization
Through Weight Equalization and Bias Correction"; AIMET's CLE), on the float model before
quantization.

Two consecutive linear layers joined through a positively homogeneous activation f
(f(x / s) = f(x) / s for s > 0: Relu, LeakyRelu with alpha > 0, PRelu with all slopes > 0,
Clip with min 0 and no max, MaxPool, Identity, or nothing at all; PRelu and LeakyRelu are
homogeneous for a negative slope too, left out as the interface asks; Relu6 is not) compute the same function when output
channel c of the first is divided by s_c and input channel c of the second multiplied by s_c.
With s_c = sqrt(r1_c / r2_c) (r1_c: the largest |weight| of channel c's output row of layer 1,
r2_c: of channel c's input column of layer 2) both get the range sqrt(r1_c * r2_c): one
per-tensor int8 scale then suits every channel far better (a channel 100x smaller than the
largest keeps ten times the quantization steps). Pairs along a chain are equalized in turn
until the scales settle.

Layers: Conv (any group, depthwise included), ConvTranspose (group 1), Gemm (transA 0 when it
is the second layer), MatMul with a constant 2-D weight (and its bias Add). Only pairs whose
channel axes line up are taken (a Conv's channels are axis 1, a Gemm's/MatMul's the last axis),
every tensor between them has one consumer and is not a graph output, and both weights are
float32 initializers (not graph inputs); nothing else in the graph is touched, node names are
kept, a weight shared with another node is copied first.

Bias absorption (with samples and ``absorb_bias=True``; off by default, not exact): after a Relu, channel c of layer 1's pre-activation that is
always at least h_c > 0 can give h_c up to layer 2's bias (relu(x - h) + h = relu(x) for
x >= h). h_c = max(0, min(mean_c - 3 std_c, min_c)): the paper's 3-sigma rule, capped at the
smallest value the samples showed, so the model is exact on every calibration sample; an input
driving the channel below that minimum is the one case where the output moves (by at most
h_c through layer 2's weights). Layer 2 must have no padding (a zero-padded border would not
see the constant) and not be a ConvTranspose.

The statistics run the model one sample at a time under onnxruntime with its optimizations off
(quantization._stats; running per-channel sums, minima and maxima, never a list of activations).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from opfuse.model.graphs import DEFAULT_DOMAINS
from opfuse.quantization._stats import Feed, tensor_values

CONV_FAMILY = ("Conv", "ConvTranspose")
DENSE_FAMILY = ("Gemm", "MatMul")
MAX_ROUNDS = 100  # a chain converges in a few dozen rounds at most
TOLERANCE = 1e-3  # a round whose scales all stay within 0.1% of 1 ends the iteration
SCALE_LIMIT = 1e6  # s within [1/SCALE_LIMIT, SCALE_LIMIT]
TINY = 1e-12  # a channel whose range is below TINY x the layer's largest is left alone
SIGMAS = 3.0


# ------------------------------------------------------------------------- graph facts


class Graph:
    """The main graph's producers, consumers, constant initializers, and the weights being
    rewritten (written back by ``commit``)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        g = model.graph
        self.nodes = list(g.node)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in g.output}
        inputs = {i.name for i in g.input}
        self.inits = {t.name: t for t in g.initializer if t.name not in inputs}
        self.uses: dict[str, int] = {}
        for graph in _all_graphs(g):
            for node in graph.node:
                for name in node.input:
                    self.uses[name] = self.uses.get(name, 0) + 1
                for sub in _subgraphs(node):
                    for name in _outer_names(sub):
                        self.uses[name] = self.uses.get(name, 0) + 1
        self.arrays: dict[str, np.ndarray] = {}  # rewritten initializers by name
        self.added: list[onnx.TensorProto] = []
        self.taken = {t.name for t in g.initializer} | set(self.producer) | inputs
        self.node_names = {n.name for n in self.nodes}

    def const(self, name: str) -> np.ndarray | None:
        """A float32 initializer's current value (None: not a constant float32 tensor)."""
        if name in self.arrays:
            return self.arrays[name]
        init = self.inits.get(name)
        if init is None or init.data_type != TensorProto.FLOAT:
            return None
        return numpy_helper.to_array(init)

    def single_use(self, tensor: str, reader: onnx.NodeProto) -> bool:
        """``tensor`` is read by ``reader`` alone and is not a graph output."""
        readers = self.consumers.get(tensor, [])
        return (
            tensor not in self.outputs
            and len(readers) == 1
            and readers[0] is reader
            and self.uses.get(tensor, 0) == 1
        )

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken or name in self.node_names:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def write(self, node: onnx.NodeProto, slot: int, value: np.ndarray) -> None:
        """Set input ``slot`` of ``node`` to ``value`` (an initializer); a tensor shared with
        another reader is copied under a new name first, a missing slot is added."""
        value = np.ascontiguousarray(value, dtype=np.float32)
        name = node.input[slot] if slot < len(node.input) else ""
        if name and self.uses.get(name, 0) <= 1 and (name in self.inits or name in self.arrays):
            self.arrays[name] = value
            return
        if name:
            self.uses[name] -= 1
        new = self.fresh(f"{name or node.name or node.op_type}_{'eq' if name else 'bias'}")
        self.uses[new] = 1
        while len(node.input) <= slot:
            node.input.append("")
        node.input[slot] = new
        self.arrays[new] = value
        self.added.append(numpy_helper.from_array(value, new))

    def commit(self) -> None:
        g = self.model.graph
        added = {t.name for t in self.added}
        for i, init in enumerate(g.initializer):
            if init.name in self.arrays and init.name not in added:
                g.initializer[i].CopyFrom(
                    numpy_helper.from_array(self.arrays[init.name], init.name)
                )
        for t in self.added:
            g.initializer.append(numpy_helper.from_array(self.arrays[t.name], t.name))
        used = {n for graph in _all_graphs(g) for node in graph.node for n in node.input}
        used |= {
            n
            for graph in _all_graphs(g)
            for node in graph.node
            for s in _subgraphs(node)
            for n in _outer_names(s)
        }
        used |= self.outputs
        keep = [t for t in g.initializer if t.name in used or t.name not in self.arrays]
        if len(keep) != len(g.initializer):  # an original left without readers by a copy
            del g.initializer[:]
            g.initializer.extend(keep)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _all_graphs(sub)


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads without defining (its outer scope's)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    read: set[str] = set()
    for node in graph.node:
        read |= {n for n in node.input if n and n not in defined}
        for sub in _subgraphs(node):
            read |= _outer_names(sub) - defined
        defined |= set(node.output)
    read |= {o.name for o in graph.output if o.name not in defined}
    return read


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    a = _attr(node, name)
    return default if a is None else int(a.i)


def attr_float(node: onnx.NodeProto, name: str, default: float) -> float:
    a = _attr(node, name)
    return default if a is None else float(a.f)


def attr_ints(node: onnx.NodeProto, name: str) -> list[int]:
    a = _attr(node, name)
    return [] if a is None else [int(v) for v in a.ints]


def attr_str(node: onnx.NodeProto, name: str, default: str) -> str:
    a = _attr(node, name)
    return default if a is None else a.s.decode()


# ------------------------------------------------------------------------------ layers


@dataclass
class Layer:
    """A linear layer: y[..., o] = sum_i x[..., i] W(i, o) (+ bias), channel-wise views of
    its weight. ``family``: "conv" (channels on axis 1) or "dense" (the last axis)."""

    node: onnx.NodeProto
    family: str
    w_slot: int
    bias_node: onnx.NodeProto | None  # holds the bias (the layer itself or its Add)
    bias_slot: int  # -1: no bias (and none can be given)
    output: str  # the tensor after the bias

    def weight(self, g: Graph) -> np.ndarray:
        w = g.const(self.node.input[self.w_slot])
        assert w is not None
        return w

    def bias(self, g: Graph) -> np.ndarray | None:
        if self.bias_node is None or self.bias_slot >= len(self.bias_node.input):
            return None
        name = self.bias_node.input[self.bias_slot]
        return g.const(name) if name else None

    @property
    def op(self) -> str:
        return self.node.op_type

    def group(self) -> int:
        return attr_int(self.node, "group", 1)

    def out_axis(self) -> int:
        if self.op == "Conv":
            return 0
        if self.op == "Gemm":
            return 0 if attr_int(self.node, "transB", 0) else 1
        return 1  # ConvTranspose (group 1): (C_in, C_out, k...); MatMul (K, N)

    def in_axis(self) -> int:
        return 1 - self.out_axis() if self.op != "Conv" else 1

    def out_channels(self, w: np.ndarray) -> int:
        return int(w.shape[self.out_axis()])

    def in_channels(self, w: np.ndarray) -> int:
        if self.op == "Conv":
            return int(w.shape[1]) * self.group()
        return int(w.shape[self.in_axis()])

    def out_range(self, w: np.ndarray) -> np.ndarray:
        a = np.abs(np.moveaxis(w, self.out_axis(), 0))
        return a.reshape(a.shape[0], -1).max(axis=1)

    def _by_input(self, w: np.ndarray) -> np.ndarray:
        """The weight as (groups, outputs per group, inputs per group, rest)."""
        if self.op == "Conv":
            g = self.group()
            return w.reshape(g, w.shape[0] // g, w.shape[1], -1)
        moved = np.moveaxis(w, self.in_axis(), 1)
        return moved.reshape(1, moved.shape[0], moved.shape[1], -1)

    def in_range(self, w: np.ndarray) -> np.ndarray:
        return np.abs(self._by_input(w)).max(axis=(1, 3)).reshape(-1)

    def scale_out(self, g: Graph, s: np.ndarray) -> None:
        """Output channel c divided by s[c] (weight and bias)."""
        w = self.weight(g)
        shape = [1] * w.ndim
        shape[self.out_axis()] = -1
        g.write(self.node, self.w_slot, w / s.reshape(shape))
        b = self.bias(g)
        if b is not None:
            assert self.bias_node is not None
            g.write(self.bias_node, self.bias_slot, b / s)  # B, C, an Add's: channels last

    def scale_in(self, g: Graph, s: np.ndarray) -> None:
        """Input channel c multiplied by s[c]."""
        w = self.weight(g)
        v = self._by_input(w)
        scaled = v * s.reshape(v.shape[0], 1, v.shape[2], 1)
        if self.op == "Conv":
            out = scaled.reshape(w.shape)
        else:
            moved = np.moveaxis(w, self.in_axis(), 1)
            out = np.moveaxis(scaled.reshape(moved.shape), 1, self.in_axis())
        g.write(self.node, self.w_slot, out)

    def input_sum(self, g: Graph, h: np.ndarray) -> np.ndarray:
        """The output per channel for a constant input h[c] on channel c (no bias)."""
        v = self._by_input(self.weight(g)).astype(np.float64)
        groups, per_out, per_in, _ = v.shape
        return np.einsum("gopr,gp->go", v, h.reshape(groups, per_in)).reshape(groups * per_out)

    def add_to_bias(self, g: Graph, delta: np.ndarray) -> None:
        """The output per channel moved by ``delta`` through the bias; a Conv or Gemm
        without one gets one."""
        assert self.bias_node is not None and self.bias_slot >= 0
        if self.op == "Gemm":  # beta * C
            delta = delta / attr_float(self.node, "beta", 1.0)
        b = self.bias(g)
        if b is None:
            b = np.zeros(delta.shape, np.float32)
        g.write(self.bias_node, self.bias_slot, b + delta)


def as_layer(g: Graph, node: onnx.NodeProto) -> Layer | None:
    """``node`` as a Layer whose weights may be rescaled, or None."""
    if node.domain not in DEFAULT_DOMAINS or not node.input:
        return None
    op = node.op_type
    if op in CONV_FAMILY:
        w = g.const(node.input[1]) if len(node.input) > 1 else None
        if w is None or w.ndim < 3:
            return None
        group = attr_int(node, "group", 1)
        if op == "ConvTranspose" and group != 1:
            return None
        if op == "Conv" and (w.shape[0] % group != 0):
            return None
        bias_name = node.input[2] if len(node.input) > 2 else ""
        if bias_name and g.const(bias_name) is None:
            return None
        return Layer(node, "conv", 1, node, 2, node.output[0])
    if op == "Gemm":
        w = g.const(node.input[1]) if len(node.input) > 1 else None
        if w is None or w.ndim != 2:
            return None
        c_name = node.input[2] if len(node.input) > 2 else ""
        if c_name:
            c = g.const(c_name)
            if (
                c is None
                or c.ndim > 2
                or (c.ndim >= 1 and c.shape[-1] not in (1, _gemm_n(node, w)))
            ):
                return None
        return Layer(node, "dense", 1, node, 2, node.output[0])
    if op == "MatMul":
        w = g.const(node.input[1])
        if w is None or w.ndim != 2:
            return None
        out = node.output[0]
        readers = g.consumers.get(out, [])
        if len(readers) == 1 and g.single_use(out, readers[0]) and readers[0].op_type == "Add":
            add = readers[0]
            slot = 1 if add.input[0] == out else 0
            b = g.const(add.input[slot])
            if b is not None and b.ndim >= 1 and b.shape[-1] in (1, w.shape[1]):
                return Layer(node, "dense", 1, add, slot, add.output[0])
        return Layer(node, "dense", 1, None, -1, out)
    return None


def _gemm_n(node: onnx.NodeProto, w: np.ndarray) -> int:
    return int(w.shape[0] if attr_int(node, "transB", 0) else w.shape[1])


# ------------------------------------------------------------------------------- pairs


def homogeneous(g: Graph, node: onnx.NodeProto) -> bool:
    """f(x / s) = f(x) / s for every s > 0, per channel."""
    if node.domain not in DEFAULT_DOMAINS:
        return False
    op = node.op_type
    if op in ("Relu", "MaxPool", "Identity"):
        return op != "MaxPool" or len(node.output) == 1
    if op == "LeakyRelu":
        return attr_float(node, "alpha", 0.01) > 0
    if op == "PRelu":
        slope = g.const(node.input[1])
        return slope is not None and bool(np.all(slope > 0))
    if op == "Clip":
        return clip_is_relu(g, node)
    return False


def clip_is_relu(g: Graph, node: onnx.NodeProto) -> bool:
    """Clip(min=0, no max): Relu. Relu6 (a max) is not positively homogeneous."""
    if len(node.input) > 1:  # opset 11+: min and max as inputs
        low = g.const(node.input[1]) if node.input[1] else None
        high = node.input[2] if len(node.input) > 2 else ""
        high_v = g.const(high) if high else None
        return bool(
            low is not None
            and low.size == 1
            and float(low.reshape(())) == 0.0
            and (not high or (high_v is not None and np.isposinf(high_v).all()))
        )
    low_a = attr_float(node, "min", -np.inf)
    high_a = attr_float(node, "max", np.inf)
    return low_a == 0.0 and bool(np.isposinf(high_a))


@dataclass
class Pair:
    first: Layer
    second: Layer
    between: list[onnx.NodeProto]
    total: np.ndarray = field(default_factory=lambda: np.ones(0))  # product of the scales

    @property
    def relu(self) -> bool:
        return len(self.between) == 1 and (
            self.between[0].op_type == "Relu" or self.between[0].op_type == "Clip"
        )

    def name(self) -> str:
        return f"{self.first.node.name}->{self.second.node.name}"


def find_pairs(g: Graph) -> list[Pair]:
    """Every pair of layers joined (through homogeneous activations only) in the main graph."""
    pairs = []
    for node in g.nodes:
        first = as_layer(g, node)
        if first is None:
            continue
        w1 = first.weight(g)
        if first.op == "ConvTranspose" and first.group() != 1:
            continue
        tensor, between = first.output, []
        second = None
        for _ in range(4):
            readers = g.consumers.get(tensor, [])
            if len(readers) != 1 or not g.single_use(tensor, readers[0]):
                break
            reader = readers[0]
            if reader.input[0] != tensor or tensor in reader.input[1:]:
                break
            layer = as_layer(g, reader)
            if layer is not None:
                second = layer
                break
            if not homogeneous(g, reader) or len(reader.output) != 1:
                break
            between.append(reader)
            tensor = reader.output[0]
        if second is None or second.family != first.family:
            continue
        if second.op == "Gemm" and attr_int(second.node, "transA", 0):
            continue
        if first.op == "Gemm" and second.family == "conv":
            continue
        w2 = second.weight(g)
        if first.out_channels(w1) != second.in_channels(w2):
            continue
        pairs.append(Pair(first, second, between, np.ones(first.out_channels(w1))))
    return pairs


def equalizable_pairs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """The (first, second) node names of the pairs ``equalize`` would consider (cheap: no
    session; for a step's ``applies``). A pair already equalized is listed too."""
    return [(p.first.node.name, p.second.node.name) for p in find_pairs(Graph(model))]


# ------------------------------------------------------------------------ equalization


def _scales(pair: Pair, g: Graph) -> np.ndarray:
    r1 = pair.first.out_range(pair.first.weight(g)).astype(np.float64)
    r2 = pair.second.in_range(pair.second.weight(g)).astype(np.float64)
    ok = (r1 > TINY * max(float(r1.max()), TINY)) & (r2 > TINY * max(float(r2.max()), TINY))
    s = np.ones_like(r1)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    return np.clip(s, 1 / SCALE_LIMIT, SCALE_LIMIT)


def equalize(
    model: onnx.ModelProto,
    samples: Sequence[Feed] | None = None,
    *,
    absorb_bias: bool = False,
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every eligible pair equalized (see the module) and, with
    ``samples`` and ``absorb_bias``, Relu pairs' biases absorbed; and how many pairs changed.
    Absorption is off by default: it is exact on the calibration samples only (an input
    driving a channel below the smallest value they showed moves the output), and on PP-OCR's
    models it moved held-back outputs beyond the verifier's bound, so ``--recipe cle`` (and
    the auto search) equalize without it."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = Graph(out)
    pairs = find_pairs(g)
    if not pairs:
        return out, 0
    for _ in range(MAX_ROUNDS):
        scales = [_scales(p, g) for p in pairs]
        if max(float(np.max(np.abs(np.log(s)))) for s in scales) < TOLERANCE:
            break
        for pair in pairs:  # each pair on the weights its neighbours left
            s = _scales(pair, g)
            pair.first.scale_out(g, s)
            pair.second.scale_in(g, s)
            pair.total = pair.total * s  # layer 1's channel c is divided by total[c]
    changed = [p for p in pairs if float(np.max(np.abs(np.log(p.total)))) >= TOLERANCE]
    if absorb_bias and samples:
        _absorb(model, g, [p for p in pairs if _can_absorb(p, g)], samples)
    g.commit()
    return out, len(changed)


def _can_absorb(pair: Pair, g: Graph) -> bool:
    second = pair.second
    if not pair.relu or pair.first.bias_slot < 0 or second.bias_slot < 0:
        return False
    if second.op == "ConvTranspose":
        return False
    if second.op == "Conv":
        auto = attr_str(second.node, "auto_pad", "NOTSET")
        if auto not in ("NOTSET", "VALID") or any(attr_ints(second.node, "pads")):
            return False
    return all(
        attr_float(layer.node, "beta", 1.0) != 0.0
        for layer in (pair.first, second)
        if layer.op == "Gemm"
    )


def _absorb(
    original: onnx.ModelProto, g: Graph, pairs: list[Pair], samples: Sequence[Feed]
) -> None:
    """Move h = max(0, min(mean - 3 std, min)) of each channel of a Relu pair's pre-activation
    from layer 1's bias into layer 2's (statistics of the original model, rescaled)."""
    if not pairs:
        return
    stats = channel_stats(
        original, samples, {p.first.output: (1 if p.first.family == "conv" else -1) for p in pairs}
    )
    for pair in pairs:
        st = stats.get(pair.first.output)
        if st is None:
            continue
        scale = pair.total  # layer 1's channel c was divided by total[c]
        mean, std, low = st.mean / scale, st.std / scale, st.min / scale
        h = np.maximum(0.0, np.minimum(mean - SIGMAS * std, low))
        h[h <= 1e-4 * np.abs(st.max_abs / scale)] = 0.0  # a second call: nothing left to move
        if not np.any(h > 0):
            continue
        pair.first.add_to_bias(g, -h)
        delta = pair.second.input_sum(g, h)
        if pair.second.op == "Gemm":
            alpha = attr_float(pair.second.node, "alpha", 1.0)
            delta = delta * alpha
        pair.second.add_to_bias(g, delta)


# --------------------------------------------------------------------------- statistics


@dataclass
class ChannelStats:
    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max_abs: np.ndarray


def channel_stats(
    model: onnx.ModelProto, samples: Sequence[Feed], axes: dict[str, int]
) -> dict[str, ChannelStats]:
    """Per channel (``axes[t]``: the channel axis of tensor t) mean, std, min and max |x| of
    each tensor over every sample and position: running sums, one sample at a time."""
    sums: dict[str, list[np.ndarray]] = {}
    counts: dict[str, int] = {}
    for values in tensor_values(model, list(axes), samples):
        for name, value in values.items():
            v = np.moveaxis(np.asarray(value, np.float64), axes[name], -1)
            v = v.reshape(-1, v.shape[-1])
            part = [v.sum(0), (v * v).sum(0), v.min(0), np.abs(v).max(0)]
            if name not in sums:
                sums[name], counts[name] = part, v.shape[0]
                continue
            acc = sums[name]
            acc[0] += part[0]
            acc[1] += part[1]
            acc[2] = np.minimum(acc[2], part[2])
            acc[3] = np.maximum(acc[3], part[3])
            counts[name] += v.shape[0]
    found = {}
    for name, (s, s2, low, high) in sums.items():
        n = max(counts[name], 1)
        mean = s / n
        found[name] = ChannelStats(mean, np.sqrt(np.maximum(s2 / n - mean * mean, 0.0)), low, high)
    return found
