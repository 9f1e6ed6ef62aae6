"""Activation ranges chosen by opfuse, handed to onnxruntime's quantizer as per-tensor
overrides (``extra_options={"TensorQuantOverrides": to_overrides(ranges)}``): the quantizer
computes each tensor's scale and zero point from the (rmin, rmax) given here exactly as
from its own calibration (``qdq_quantizer.calc_quant_params`` -> ``compute_scale_zp``).

The estimators (``METHODS``), per tensor:

- ``minmax``: the global extremes over the calibration samples (onnxruntime's default);
- ``mean-minmax``: the mean over samples of each sample's min and max (NNCF's default for
  activations): one sample's rare outlier moves the range by 1/N of its size, not all of it;
- ``percentile``: the values at ``percentile`` and 100 - ``percentile`` of all the values
  seen (asymmetric; a tensor without negative values keeps rmin = 0), read from a streaming
  histogram;
- ``mse``: the clipping range that minimizes the tensor's own quantize-dequantize mean
  squared error on the calibration values (the histogram's, each bin's values taken as
  uniform in the bin: rounding noise and clipping error in closed form), searched on the
  same integer grid onnxruntime will use (scale and zero point as ``compute_scale_zp``
  rounds them), rmax and rmin in turn.

Every estimator keeps fixed-size running state per tensor (a few scalars and, for
percentile and mse, two histograms of ``BINS`` bins, one for the positive values and one
for the negatives' magnitudes, whose upper edge doubles, merging bins pairwise, when a larger
value arrives): memory does not grow with the number of samples. Exact zeros are counted
apart (a Relu's output is mostly zeros, which quantize without error).

A Softmax's output keeps the [0, 1] onnxruntime's quantizer gives it, whatever the method
(on PP-OCRv4's recognizer a percentile or least-error range clips the attention's peaks:
the held-out SQNR fell from 15.4 to 12 dB). Always rmin <= 0 <= rmax (as onnxruntime's
quantizer needs).

A bounded activation's output (Sigmoid, HardSigmoid, Tanh) keeps its global extremes
whatever the method: it has no outliers to clip, and a narrower range saturates the
decisions made on it. On PP-OCRv4's detector, 7 of 10 calibration images hold no text
(the score map's maximum about 0) and 3 do (1.0): the mean of the per-sample maxima put
the score map's range at [0, 0.300], every text pixel then read 0.3 (PaddleOCR keeps a
box whose mean score is 0.6 or more: none would be kept).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from opfuse.errors import OpfuseError
from opfuse.quantization._stats import Feed, tensor_values

METHODS = ("minmax", "mean-minmax", "percentile", "mse")
BINS = 4096  # per sign: the histograms of percentile and mse
MSE_GRID = 400  # candidate clipping fractions per search (geometric, 1e-4 .. 1)
MSE_ROUNDS = 2  # rmax then rmin, twice
QRANGES = {"uint8": (0, 255), "int8": (-128, 127)}  # asymmetric activations, as onnxruntime
# outputs whose range onnxruntime's quantizer fixes (base_quantizer.adjust_tensor_ranges):
# kept whatever the method (a percentile or least-error range would clip attention peaks)
FIXED_RANGES = {"Softmax": (0.0, 1.0)}
BOUNDED = frozenset({"Sigmoid", "HardSigmoid", "Tanh"})  # their global extremes, any method


class _Histogram:
    """Counts of |x| for one sign in ``BINS`` equal bins over [0, top]; ``top`` doubles
    (adjacent bins merged: the edges stay edges) when a larger value arrives."""

    def __init__(self, bins: int) -> None:
        self.counts = np.zeros(bins, np.float64)
        self.top = 0.0

    def add(self, magnitudes: np.ndarray) -> None:
        if magnitudes.size == 0:
            return
        peak = float(magnitudes.max())
        bins = self.counts.size
        if self.top == 0.0:
            self.top = peak
        elif peak > self.top:
            factor = 1
            while self.top * factor < peak:
                factor *= 2
            self.top *= factor
            merged = self.counts.reshape(-1, min(factor, bins)).sum(axis=1)
            self.counts = np.zeros(bins, np.float64)
            self.counts[: merged.size] = merged
        index = np.minimum((magnitudes * (bins / self.top)).astype(np.int64), bins - 1)
        self.counts += np.bincount(index, minlength=bins)

    def edges(self) -> np.ndarray:
        return np.linspace(0.0, self.top, self.counts.size + 1)


class RangeStatistics:
    """The running statistics of one tensor, fixed in size whatever the number of samples."""

    def __init__(self, histogram: bool, bins: int = BINS) -> None:
        self.samples = 0
        self.low = math.inf  # global extremes
        self.high = -math.inf
        self.low_sum = 0.0  # sums over samples of each sample's min and max
        self.high_sum = 0.0
        self.zeros = 0.0
        self.positive = _Histogram(bins) if histogram else None
        self.negative = _Histogram(bins) if histogram else None

    def add(self, value: np.ndarray) -> None:
        x = np.asarray(value)
        if x.dtype.kind != "f":
            raise OpfuseError(f"a range is asked of a {x.dtype} tensor (float tensors only)")
        x = x.astype(np.float32, copy=False).ravel()
        if x.size and not np.isfinite(x).all():
            x = x[np.isfinite(x)]
        if x.size == 0:
            return
        low, high = float(x.min()), float(x.max())
        self.samples += 1
        self.low, self.high = min(self.low, low), max(self.high, high)
        self.low_sum += low
        self.high_sum += high
        if self.positive is not None and self.negative is not None:
            self.zeros += float(np.count_nonzero(x == 0))
            self.positive.add(x[x > 0])
            self.negative.add(-x[x < 0])

    def minmax(self) -> tuple[float, float]:
        if not self.samples:
            return 0.0, 0.0
        return min(self.low, 0.0), max(self.high, 0.0)

    def mean_minmax(self) -> tuple[float, float]:
        if not self.samples:
            return 0.0, 0.0
        return min(self.low_sum / self.samples, 0.0), max(self.high_sum / self.samples, 0.0)

    def _bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lower edges, upper edges, counts) of every value seen, ascending: the
        negatives' bins, the exact zeros (a bin of width 0), the positives' bins; the outer
        edges clamped to the values' extremes."""
        assert self.positive is not None and self.negative is not None
        neg_edges = self.negative.edges()
        pos_edges = self.positive.edges()
        lower = np.concatenate([-neg_edges[1:][::-1], [0.0], pos_edges[:-1]])
        upper = np.concatenate([-neg_edges[:-1][::-1], [0.0], pos_edges[1:]])
        counts = np.concatenate([self.negative.counts[::-1], [self.zeros], self.positive.counts])
        lower = np.clip(lower, self.low, self.high)
        upper = np.clip(upper, self.low, self.high)
        keep = counts > 0
        return lower[keep], upper[keep], counts[keep]

    def quantile(self, q: float) -> float:
        """The value below which a share ``q`` of the values lie (linear within a bin)."""
        lower, upper, counts = self._bins()
        cdf = np.cumsum(counts)
        target = q * cdf[-1]
        i = min(int(np.searchsorted(cdf, target, side="left")), counts.size - 1)
        before = cdf[i] - counts[i]
        frac = min(max((target - before) / counts[i], 0.0), 1.0)
        return float(lower[i] + frac * (upper[i] - lower[i]))

    def percentile(self, percentile: float) -> tuple[float, float]:
        if not self.samples:
            return 0.0, 0.0
        share = percentile / 100.0
        return min(self.quantile(1.0 - share), 0.0), max(self.quantile(share), 0.0)

    def mse(self, activation_type: str) -> tuple[float, float]:
        """The (rmin, rmax) of least expected quantize-dequantize error on the histogram:
        searched with the usual noise model (clipping error exact per bin, s^2/12 per value
        inside the range, by prefix sums: cheap for many candidates), rmax and rmin in turn;
        the best few then compared with the exact model (and min/max kept unless beaten)."""
        if not self.samples:
            return 0.0, 0.0
        lower, upper, counts = self._bins()
        model = _ClipModel(lower, upper, counts)
        rmin, rmax = self.minmax()
        fractions = np.geomspace(1e-4, 1.0, MSE_GRID)
        tried = [(rmin, rmax)]
        for round_ in range(MSE_ROUNDS):
            for side in ("high", "low"):
                full = self.high if side == "high" else self.low
                if (side == "high" and full <= 0) or (side == "low" and full >= 0):
                    continue
                cand = np.append(fractions * full, rmax if side == "high" else rmin)
                lows = np.full(cand.shape, rmin) if side == "high" else cand
                highs = cand if side == "high" else np.full(cand.shape, rmax)
                k = int(np.argmin(model.errors(lows, highs, activation_type)))
                rmin, rmax = float(lows[k]), float(highs[k])
                if round_ == MSE_ROUNDS - 1:  # the neighbours of the last choices
                    near = {max(k - 1, 0), min(k + 1, cand.size - 1)}
                    tried += [(float(lows[j]), float(highs[j])) for j in sorted(near)]
        tried = list(dict.fromkeys([*tried, (rmin, rmax)]))
        lows, highs = np.array([t[0] for t in tried]), np.array([t[1] for t in tried])
        exact = _qdq_mse(lower, upper, counts, lows, highs, activation_type)
        k = int(np.argmin(exact))
        return min(float(lows[k]), 0.0), max(float(highs[k]), 0.0)


class _ClipModel:
    """Expected squared error of clipping to [lo, hi] plus uniform rounding noise inside,
    for many candidates at once: prefix sums of each bin's moments (values uniform in a
    bin), the exact values (zero-width bins: the zeros) free of rounding noise."""

    def __init__(self, lower: np.ndarray, upper: np.ndarray, counts: np.ndarray) -> None:
        self.lower, self.upper, self.counts = lower, upper, counts
        self.total = float(counts.sum())
        width = upper - lower
        self.m1 = np.concatenate([[0.0], np.cumsum(counts * (lower + upper) / 2)])
        self.m2 = np.concatenate(
            [[0.0], np.cumsum(counts * (lower**2 + lower * upper + upper**2) / 3)]
        )
        self.m0 = np.concatenate([[0.0], np.cumsum(counts)])
        self.points = float(counts[width <= 0].sum())

    def errors(self, lows: np.ndarray, highs: np.ndarray, activation_type: str) -> np.ndarray:
        qmin, qmax = QRANGES[activation_type]
        lows, highs = np.minimum(lows, 0.0), np.maximum(highs, 0.0)
        scale = (highs - lows) / (qmax - qmin)
        # bins wholly beyond an edge: lower edge above hi, upper edge below lo; the bin
        # holding the edge (lower <= hi < upper, lower < lo <= upper) is clipped in part
        above = np.searchsorted(self.lower, highs, side="right")
        below = np.searchsorted(self.upper, lows, side="left")
        top_err, top_count = self._partial(above - 1, highs, upper_side=True)
        low_err, low_count = self._partial(below, lows, upper_side=False)
        err = self._outside(above, self.lower.size, highs) + self._outside(0, below, lows)
        clipped = self.m0[-1] - self.m0[above] + self.m0[below] + top_count + low_count
        inside = np.maximum(self.total - clipped - self.points, 0.0)
        return (err + top_err + low_err + inside * scale**2 / 12.0) / self.total

    def _outside(
        self, start: np.ndarray | int, stop: np.ndarray | int, edge: np.ndarray
    ) -> np.ndarray:
        """Sum over bins start..stop-1 (wholly outside) of the integral of (x - edge)^2."""
        m0 = self.m0[stop] - self.m0[start]
        m1 = self.m1[stop] - self.m1[start]
        m2 = self.m2[stop] - self.m2[start]
        return np.maximum(m2 - 2 * edge * m1 + edge**2 * m0, 0.0)

    def _partial(
        self, j: np.ndarray, edge: np.ndarray, upper_side: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """(clipping error, count) of the part of bin j beyond ``edge`` where it holds it."""
        a, b, c = self.lower, self.upper, self.counts
        jj = np.clip(j, 0, a.size - 1)
        lo, hi = a[jj], b[jj]
        w = hi - lo
        if upper_side:
            holds = (lo <= edge) & (edge < hi)
            beyond = hi - edge
        else:
            holds = (lo < edge) & (edge <= hi)
            beyond = edge - lo
        holds &= (j >= 0) & (j < a.size) & (w > 0)
        safe = np.where(w > 0, w, 1.0)
        err = np.where(holds, c[jj] * beyond**3 / (3 * safe), 0.0)
        return err, np.where(holds, c[jj] * beyond / safe, 0.0)


def qparams(rmin: float, rmax: float, activation_type: str = "uint8") -> tuple[np.float32, int]:
    """(scale, zero point) onnxruntime's quantizer derives from (rmin, rmax) for an
    asymmetric activation (``quant_utils.compute_scale_zp``, float32 ranges)."""
    qmin, qmax = QRANGES[activation_type]
    low = min(np.float32(rmin), np.float32(0.0))
    high = max(np.float32(rmax), np.float32(0.0))
    scale = np.float64(high) - np.float64(low)
    scale /= qmax - qmin
    if scale < np.finfo(np.float32).tiny:
        return np.float32(1.0), 0
    zero = int(np.round(qmin - np.float64(low) / scale))
    return np.float32(scale), zero


def _qdq_mse(
    lower: np.ndarray,
    upper: np.ndarray,
    counts: np.ndarray,
    rmins: np.ndarray,
    rmaxs: np.ndarray,
    activation_type: str,
) -> np.ndarray:
    """Per candidate (rmins[k], rmaxs[k]): the expected squared quantize-dequantize error
    of the values (each bin's values uniform in [lower, upper]; zero-width bins are points),
    on the grid onnxruntime derives: multiples of the scale from (qmin - zp) to (qmax - zp)."""
    qmin, qmax = QRANGES[activation_type]
    rmins = np.minimum(rmins, 0.0)
    rmaxs = np.maximum(rmaxs, 0.0)
    exact = (rmaxs - rmins) / (qmax - qmin)  # the zero point comes from the float64 scale
    tiny = exact < np.finfo(np.float32).tiny
    zero = np.where(tiny, 0.0, np.round(qmin - rmins / np.where(tiny, 1.0, exact)))
    scale = np.where(tiny, 1.0, exact.astype(np.float32).astype(np.float64))
    lo = ((qmin - zero) * scale)[:, None]
    hi = ((qmax - zero) * scale)[:, None]
    s = scale[:, None]
    a, b = lower[None, :], upper[None, :]
    width = b - a

    def clipped_below(x0: np.ndarray, x1: np.ndarray) -> np.ndarray:  # integral of (x - lo)^2
        x0, x1 = np.minimum(x0, lo), np.minimum(x1, lo)
        return ((x1 - lo) ** 3 - (x0 - lo) ** 3) / 3.0

    def clipped_above(x0: np.ndarray, x1: np.ndarray) -> np.ndarray:  # integral of (x - hi)^2
        x0, x1 = np.maximum(x0, hi), np.maximum(x1, hi)
        return ((x1 - hi) ** 3 - (x0 - hi) ** 3) / 3.0

    def rounding(x: np.ndarray) -> np.ndarray:  # integral from 0 of (x - s*round(x/s))^2
        u = x / s
        k = np.floor(u + 0.5)
        r = u - k
        return s**3 * (k / 12.0 + (r**3 + 0.125) / 3.0)

    inside = rounding(np.clip(b, lo, hi)) - rounding(np.clip(a, lo, hi))
    total = clipped_below(a, b) + inside + clipped_above(a, b)
    point = width <= 0  # exact values (the zeros, a constant tensor's bin): the error itself
    with np.errstate(invalid="ignore", divide="ignore"):
        per_value = np.where(point, 0.0, total / np.where(point, 1.0, width))
    xs = np.broadcast_to(a, per_value.shape)
    rounded = np.clip(np.round(xs / s) * s, lo, hi)
    per_value = np.where(point, (xs - rounded) ** 2, per_value)
    return (per_value * counts[None, :]).sum(axis=1) / counts.sum()


def activation_ranges(
    model: onnx.ModelProto,
    samples: Sequence[Feed],
    tensors: Sequence[str],
    method: str,
    *,
    activation_type: str = "uint8",
    percentile: float = 99.999,
) -> dict[str, tuple[float, float]]:
    """Per tensor, (rmin, rmax) by ``method`` (one of METHODS) over ``samples``, streamed
    one sample at a time; a tensor no sample gives a value to gets (0.0, 0.0); a Softmax's
    output (0.0, 1.0); a Sigmoid's, HardSigmoid's or Tanh's its global min and max."""
    if method not in METHODS:
        raise OpfuseError(f"range method {method!r}: one of {', '.join(METHODS)}")
    if activation_type not in QRANGES:
        raise OpfuseError(f"activation type {activation_type!r}: one of {', '.join(QRANGES)}")
    if not 50.0 < percentile <= 100.0:
        raise OpfuseError(f"percentile {percentile}: above 50 and at most 100")
    fixed = {o for n in model.graph.node if n.op_type in FIXED_RANGES for o in n.output[:1]}
    names = [n for n in dict.fromkeys(tensors) if n not in fixed]
    histogram = method in ("percentile", "mse")
    stats = {n: RangeStatistics(histogram) for n in names}
    if names:
        for values in tensor_values(model, names, samples):
            for name in names:
                stats[name].add(values[name])
    out: dict[str, tuple[float, float]] = {}
    producer = {o: n.op_type for n in model.graph.node for o in n.output[:1]}
    for name in dict.fromkeys(tensors):
        if name in fixed:
            out[name] = FIXED_RANGES[producer[name]]
    for name, st in stats.items():
        if method == "minmax" or producer.get(name) in BOUNDED:
            out[name] = st.minmax()
        elif method == "mean-minmax":
            out[name] = st.mean_minmax()
        elif method == "percentile":
            out[name] = st.percentile(percentile)
        else:
            out[name] = st.mse(activation_type)
    return out


def quantized_activations(model: onnx.ModelProto) -> list[str]:
    """The float activation tensors of the main graph onnxruntime's static quantizer
    calibrates and quantizes: the inputs and outputs (not initializers) of the nodes of the
    op types it handles (``quantize_static``'s default: its QDQ and QLinear registries),
    float or float16 by shape inference, in graph order."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    op_types = set(QDQRegistry) | set(QLinearOpsRegistry)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx's inference raises plain exceptions: keep what the model says
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type for v in (*graph.value_info, *graph.output, *graph.input)}
    inits = {t.name for t in graph.initializer}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    found: dict[str, None] = {}
    for node in graph.node:
        if node.op_type not in op_types:
            continue
        for name in (*node.input, *node.output):
            kind = types.get(name)
            if (
                name
                and name not in inits
                and kind is not None
                and kind.HasField("tensor_type")
                and kind.tensor_type.elem_type in floats
            ):
                found.setdefault(name)
    return list(found)


def to_overrides(ranges: dict[str, tuple[float, float]]) -> dict[str, list[dict[str, object]]]:
    """onnxruntime's ``extra_options["TensorQuantOverrides"]``: one per-tensor dict of
    float32 ``rmin``/``rmax`` per tensor (its ``compute_scale_zp`` reads their dtype)."""
    return {
        name: [{"rmin": np.float32(min(lo, 0.0)), "rmax": np.float32(max(hi, 0.0))}]
        for name, (lo, hi) in ranges.items()
    }
