"""Statistics sessions shared by the recovery methods (ranges, bias correction, equalization,
smoothing): onnxruntime CPU sessions with graph optimizations OFF on a copy of the model whose
outputs include the tensors asked for, fed one sample at a time.

Memory does not grow with the number of samples: ``tensor_values`` yields one sample's
tensors at a time (the caller keeps running statistics), and ``channel_moments`` reduces
each tensor per channel inside the graph (a sum and a sum of squares per channel, the
element count), so only those small vectors leave onnxruntime; the running totals are
float64 vectors of one entry per channel.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opfuse.errors import OpfuseError

if TYPE_CHECKING:
    import onnxruntime as ort

Feed = dict[str, np.ndarray]
PREFIX = "opfuse_stats__"  # the names of what this module adds to a copy of the model


def main_opset(model: onnx.ModelProto) -> int:
    from opfuse.model.io import default_opset

    return default_opset(model) or 1


def session(model: onnx.ModelProto, outputs: Sequence[str]) -> ort.InferenceSession:
    """A CPU session without graph optimizations on a copy of ``model`` whose graph outputs
    are ``outputs`` (the model's own, or any tensor inside it; the model is not changed)."""
    from opfuse.model.sessions import open_session

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.output[:]
    copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(outputs))
    return open_session(copy, graph_opt="off", threads=0, errors="onnxruntime")


def tensor_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor name of the main graph: inputs, initializers, node outputs."""
    graph = model.graph
    return (
        {i.name for i in graph.input}
        | {t.name for t in graph.initializer}
        | {o for n in graph.node for o in n.output if o}
    )


def tensor_values(
    model: onnx.ModelProto, names: Sequence[str], samples: Sequence[Feed]
) -> Iterator[dict[str, np.ndarray]]:
    """Per sample, the values of ``names`` (graph inputs are taken from the feed, the rest
    from one session): one sample's tensors at a time."""
    missing = sorted(set(names) - tensor_names(model))
    if missing:
        raise OpfuseError(f"no tensor {missing[0]!r} in the model ({len(missing)} unknown)")
    inputs = {i.name for i in model.graph.input}
    feeds = [n for n in names if n in inputs]
    computed = [n for n in dict.fromkeys(names) if n not in inputs]
    sess = session(model, computed) if computed else None
    needed = {i.name for i in sess.get_inputs()} if sess is not None else set()
    for sample in samples:
        values = {n: np.asarray(sample[n]) for n in feeds}
        if sess is not None:
            feed = {k: v for k, v in sample.items() if k in needed}
            values.update(zip(computed, sess.run(computed, feed), strict=True))
        yield values


@dataclass
class Moments:
    """Running per-channel count, sum and sum of squares (float64, one entry per channel)."""

    count: np.ndarray = field(default_factory=lambda: np.zeros(0))
    total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    squares: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, total: np.ndarray, squares: np.ndarray, count: float) -> None:
        total = np.asarray(total, np.float64).ravel()
        squares = np.asarray(squares, np.float64).ravel()
        if self.total.size == 0:
            self.total, self.squares = total.copy(), squares.copy()
            self.count = np.full(total.shape, float(count))
            return
        if total.shape != self.total.shape:
            raise OpfuseError(
                f"a tensor's channel count changed between samples ({self.total.size} -> {total.size})"
            )
        self.total += total
        self.squares += squares
        self.count += count

    @property
    def mean(self) -> np.ndarray:
        return self.total / np.maximum(self.count, 1)

    @property
    def var(self) -> np.ndarray:
        return np.maximum(self.squares / np.maximum(self.count, 1) - self.mean**2, 0.0)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.var)


def add_channel_sums(
    model: onnx.ModelProto, name: str, axis: int, tag: str, squares: bool = True
) -> list[str]:
    """Nodes appended to ``model`` (in place) that reduce tensor ``name`` per channel along
    ``axis`` (1 or -1, any rank >= 2): outputs [sum per channel, (sum of squares per channel,)
    element count]. Their names start with PREFIX + ``tag``."""
    if axis not in (1, -1):
        raise ValueError(f"channel axis {axis}: 1 or -1")
    opset = main_opset(model)
    graph = model.graph
    p = f"{PREFIX}{tag}"
    x = f"{p}_f32"
    graph.node.append(helper.make_node("Cast", [name], [x], to=TensorProto.FLOAT, name=x))
    flat = f"{p}_flat"
    if axis == 1:  # [N, C, ...] -> [N, C, S]; reduce axes 0 and 2
        shape = f"{p}_shape"
        graph.initializer.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), shape))
        graph.node.append(helper.make_node("Reshape", [x, shape], [flat], name=flat))
        axes = [0, 2]
    else:  # [..., C] -> [M, C]; reduce axis 0
        graph.node.append(helper.make_node("Flatten", [x], [flat], axis=-1, name=flat))
        axes = [0]
    outs = []
    sources = [flat]
    if squares:
        sq = f"{p}_sq"
        graph.node.append(helper.make_node("Mul", [flat, flat], [sq], name=sq))
        sources.append(sq)
    axes_name = f"{p}_axes"
    if opset >= 13:
        graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), axes_name))
    for src in sources:
        out = f"{src}_sum"
        if opset >= 13:
            node = helper.make_node("ReduceSum", [src, axes_name], [out], keepdims=0, name=out)
        else:
            node = helper.make_node("ReduceSum", [src], [out], axes=axes, keepdims=0, name=out)
        graph.node.append(node)
        outs.append(out)
    count = f"{p}_count"
    graph.node.append(helper.make_node("Size", [flat], [count], name=count))
    outs.append(count)
    return outs


def channel_moments(
    model: onnx.ModelProto,
    tensors: Mapping[str, int],
    samples: Sequence[Feed],
    *,
    squares: bool = True,
) -> dict[str, Moments]:
    """Per tensor (name -> channel axis, 1 or -1), the running per-channel moments over
    ``samples``, reduced inside onnxruntime (only the per-channel sums leave it)."""
    missing = sorted(set(tensors) - tensor_names(model))
    if missing:
        raise OpfuseError(f"no tensor {missing[0]!r} in the model ({len(missing)} unknown)")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    wanted: dict[str, list[str]] = {}
    for k, (name, axis) in enumerate(tensors.items()):
        wanted[name] = add_channel_sums(copy, name, axis, f"m{k}", squares)
    outputs = [o for outs in wanted.values() for o in outs]
    moments = {name: Moments() for name in tensors}
    if not outputs:
        return moments
    sess = session(copy, outputs)
    needed = {i.name for i in sess.get_inputs()}
    for sample in samples:
        got = dict(
            zip(
                outputs,
                sess.run(outputs, {k: v for k, v in sample.items() if k in needed}),
                strict=True,
            )
        )
        for name, outs in wanted.items():
            total = got[outs[0]]
            sq = got[outs[1]] if squares else np.zeros_like(total)
            channels = max(int(np.asarray(total).size), 1)
            moments[name].add(total, sq, float(got[outs[-1]]) / channels)
    return moments
