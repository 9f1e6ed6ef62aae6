"""Where a quantized model's error grows, for the user whose int8 model misses the gate.

Every activation the QDQ model quantizes is compared, after its DequantizeLinear, with
the float model's same tensor (and every graph output with the int8 model's) on the samples (SQNR in dB, both models run without
onnxruntime's graph optimizations so every tensor is there). A tensor's *drop* is the SQNR
it loses against the worst traced tensor its producer reads (or, through tensors left
unquantized, the nearest traced ones upstream): the error that step and its
quantization add, not the error it inherits. The steps that add the most noise (as a
share of the signal) are where to look.

The cause int8 users meet most is named with each: a tensor whose channels have very
different ranges (one per-tensor scale for all of them: the small channels get a few
integer steps). ``channel_spread`` is the largest channel's absolute maximum over the
median channel's, on the float values (channels: axis 1, or the last axis, whichever
spreads more). On PP-OCRv4's detector the error grows from the first blocks: an Add whose
channels reach 44.6 against a median of 3.9 feeds a Conv whose output falls from 10.6 to
2.9 dB.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:
    import onnxruntime as ort

MAX_SAMPLES = 8  # model runs per measure (here and in sensitivity)
OUTLIER_SPREAD = 8.0  # a channel spread from which the summary names outlier channels


@dataclass(frozen=True)
class TensorError:
    tensor: str
    op_type: str  # the op that makes it in the float model ("input" for a graph input)
    sqnr_db: float  # against the float model, after its DequantizeLinear
    inputs_db: float | None  # the worst traced tensor upstream of it (None: none)
    channel_spread: float | None
    worst_input: str | None = None  # that tensor
    input_spread: float | None = None  # its channel spread

    @property
    def drop_db(self) -> float:
        return 0.0 if self.inputs_db is None else self.inputs_db - self.sqnr_db

    @property
    def added_noise(self) -> float:
        """The noise power this step adds, as a share of the signal's: ranks the drops
        (43 -> 24 dB adds 0.4%, 9.5 -> 0.8 dB adds 72%)."""
        before = 0.0 if self.inputs_db is None else 10 ** (-self.inputs_db / 10)
        return 10 ** (-self.sqnr_db / 10) - before

    def describe(self) -> str:
        where = f"{self.tensor} ({self.op_type}, "
        if self.inputs_db is not None:
            where += f"{self.inputs_db:.1f} -> "
        where += f"{self.sqnr_db:.1f} dB)"
        for name, spread in ((None, self.channel_spread), (self.worst_input, self.input_spread)):
            if spread is not None and spread >= OUTLIER_SPREAD:
                where += (
                    f"{' reading ' + name if name else ''} with outlier channels (the largest "
                    f"{spread:.0f}x the median: one int8 scale for all of them)"
                )
                break
        return where

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "drop_db": self.drop_db}


def error_trace(
    float_model: str | os.PathLike[str] | onnx.ModelProto,
    qdq_model: str | os.PathLike[str] | onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
) -> list[TensorError]:
    """Each activation ``qdq_model`` quantizes, in the float model's node order."""
    fm, qm = onnx.ModelProto(), onnx.ModelProto()  # copies: tensor_session adds outputs
    for made, given in ((fm, float_model), (qm, qdq_model)):
        made.CopyFrom(given if isinstance(given, onnx.ModelProto) else onnx.load_model(str(given)))
    made_by = {o: n for n in qm.graph.node for o in n.output}
    pairs: dict[str, str] = {}  # float tensor -> the QDQ model's dequantized copy
    for node in qm.graph.node:
        if node.op_type == "DequantizeLinear":
            q = made_by.get(node.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                pairs.setdefault(q.input[0], node.output[0])
    int8_outputs = {o.name for o in qm.graph.output}
    for out in fm.graph.output:  # often not quantized (a Gemm's logits), always compared
        if out.name in int8_outputs:
            pairs[out.name] = out.name
    producer = {o: n for n in fm.graph.node for o in n.output}
    graph_inputs = [i.name for i in fm.graph.input]
    order = {name: i for i, name in enumerate(graph_inputs)}
    order.update({o: len(order) + i for i, n in enumerate(fm.graph.node) for o in n.output})
    traced = sorted((t for t in pairs if t in order), key=order.__getitem__)
    if not traced:
        return []
    sqnr, spread = _measure(fm, qm, traced, [pairs[t] for t in traced], samples)
    # the nearest traced tensors upstream of each tensor (through the ones the quantizer
    # left alone, e.g. a Conv's output its Relu reads): the worst of them, in node order
    upstream: dict[str, str | None] = {t: t for t in graph_inputs if t in sqnr}
    for node in fm.graph.node:
        feeding = [u for x in node.input if (u := upstream.get(x)) is not None]
        worst_up = min(feeding, key=sqnr.__getitem__) if feeding else None
        for o in node.output:
            upstream[o] = o if o in sqnr else worst_up
    out = []
    for t in traced:
        node = producer.get(t)
        read = [u for x in (node.input if node is not None else ()) if (u := upstream.get(x))]
        worst = min(read, key=sqnr.__getitem__) if read else None
        out.append(
            TensorError(
                t,
                node.op_type if node is not None else "input",
                sqnr[t],
                None if worst is None else sqnr[worst],
                spread[t],
                worst,
                None if worst is None else spread[worst],
            )
        )
    return out


def largest_drops(trace: Sequence[TensorError], count: int = 3) -> list[TensorError]:
    """The tensors whose step adds the most noise (against what their producer reads)."""
    return sorted((e for e in trace if e.added_noise > 0), key=lambda e: -e.added_noise)[:count]


def _measure(
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    names: list[str],
    int8_names: list[str],
    samples: Sequence[dict[str, np.ndarray]],
) -> tuple[dict[str, float], dict[str, float | None]]:
    """Per tensor, the SQNR of the int8 copy against the float values, and the float
    values' channel spread; one sample at a time (every activation of a large model on
    eight samples would not fit in memory)."""
    float_sess, int8_sess = tensor_session(fm, names), tensor_session(qm, int8_names)
    signal = dict.fromkeys(names, 0.0)
    noise = dict.fromkeys(names, 0.0)
    peaks: dict[str, dict[int, np.ndarray]] = {n: {} for n in names}
    for sample in samples[:MAX_SAMPLES]:
        for name, x, y in zip(
            names, float_sess.run(names, sample), int8_sess.run(int8_names, sample), strict=True
        ):
            x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
            signal[name] += float(np.sum(x64**2))
            noise[name] += float(np.sum((x64 - y64) ** 2))
            for axis, peak in _channel_peaks(np.asarray(x)).items():
                seen = peaks[name].get(axis)
                peaks[name][axis] = peak if seen is None else np.maximum(seen, peak)
    sqnr = {n: sqnr_db(signal[n], noise[n]) for n in names}
    spread = {n: _spread(peaks[n]) for n in names}
    return sqnr, spread


def tensor_session(model: onnx.ModelProto, names: list[str]) -> ort.InferenceSession:
    """An onnxruntime session without graph optimizations whose outputs include ``names``."""
    from opfuse.model.sessions import open_session

    present = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present)
    return open_session(model, graph_opt="off", threads=0, errors="onnxruntime")


def sqnr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise): inf without noise, -inf without signal."""
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf")


def _channel_peaks(x: np.ndarray) -> dict[int, np.ndarray]:
    """Each channel's largest |value|, for channels on axis 1 and on the last axis."""
    if x.ndim < 2 or x.dtype.kind != "f":
        return {}
    return {
        axis: np.abs(np.moveaxis(x, axis, 0)).reshape(x.shape[axis], -1).max(axis=1)
        for axis in {1, x.ndim - 1}
        if x.shape[axis] > 1 and x.size
    }


def _spread(peaks: dict[int, np.ndarray]) -> float | None:
    """The largest channel's peak over the median channel's, on the axis that spreads more."""
    spreads = [
        float(p.max()) / median for p in peaks.values() if (median := float(np.median(p))) > 0
    ]
    return max(spreads, default=None)
