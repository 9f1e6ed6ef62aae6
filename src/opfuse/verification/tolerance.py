"""The verifier's tolerance rule: how far an optimized model's output may be from the
original's before it fails.

An output passes within ``atol * max(1, max|ref|) + rtol * |ref|``, with rtol and atol
raised to the precision of the output's dtype (float16 and bfloat16 cannot hold a
difference smaller than their own ulp: a scale folded in float16 is rounded once where
onnxruntime rounds the original at run time). When that fails, the original graph is run
in float64 as the judge: an output still passes when it is within that tolerance plus
ERROR_FACTOR times the original float32 output's own worst error against float64 on that
output (measured, not estimated), i.e. when the optimized model is about as accurate as
the original. Rounding differences of folded small ops pass; a real mistake (a wrong
epsilon, a constant 1% off) moves well-conditioned elements far more and still fails.
The fuzz harness (tests/test_fuzz.py) judges its random graphs by the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.helper import make_node

ERROR_FACTOR = 4
KEEP_FLOAT32 = frozenset({"QuantizeLinear", "DequantizeLinear"})  # no double in the spec
# the smallest rtol/atol an output of this dtype can be held to: its machine epsilon
DTYPE_EPSILON = {"float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0**-7}


def for_dtype(dtype: np.dtype, rtol: float, atol: float) -> tuple[float, float]:
    """rtol and atol no tighter than the dtype's precision."""
    eps = DTYPE_EPSILON.get(np.dtype(dtype).name)
    return (rtol, atol) if eps is None else (max(rtol, eps), max(atol, eps))


def allowed(ref: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Per-element bound on ``|got - ref|`` (finite float64 ``ref``)."""
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    return atol * scale + rtol * np.abs(ref)


def within_rounding(
    ref: np.ndarray, got: np.ndarray, truth: np.ndarray, rtol: float, atol: float
) -> bool:
    """``|got - truth| <= atol * max(1, max|ref|) + rtol * |ref| + ERROR_FACTOR * E``,
    E = max |ref - truth|: the original's worst float32 error on this output."""
    if ref.shape != got.shape or ref.shape != truth.shape:
        return False
    rtol, atol = for_dtype(ref.dtype, rtol, atol)
    r, g, t = (a.astype(np.float64) for a in (ref, got, truth))
    finite = np.isfinite(r) & np.isfinite(t)
    if not np.array_equal(np.isnan(r), np.isnan(g)) or not finite.any():
        return False
    r, g, t = r[finite], g[finite], t[finite]
    error = float(np.max(np.abs(r - t)))
    return bool(np.all(np.abs(g - t) <= allowed(r, rtol, atol) + ERROR_FACTOR * error))


class NodeArg(Protocol):
    @property
    def name(self) -> str: ...


class RuntimeSession(Protocol):
    """What run_float64 uses of an onnxruntime InferenceSession."""

    def get_inputs(self) -> Sequence[NodeArg]: ...
    def get_outputs(self) -> Sequence[NodeArg]: ...
    def run(self, output_names: Any, input_feed: Any) -> Sequence[Any]: ...


Session = Callable[[onnx.ModelProto], RuntimeSession]  # a model -> an onnxruntime session


def run_float64(
    proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray], session: Session
) -> dict[str, np.ndarray]:
    """The original graph run in float64 under onnxruntime (the same kernels, so the same
    semantics). Nodes onnxruntime has no double kernel for (Conv, AveragePool, Erf, ...)
    and Q/DQ run in float32 between Casts: their own rounding is float32 level, tiny next
    to the errors this judges. Raises when no float64 model loads."""
    islands: set[str] = set()
    for _ in range(len(proto.graph.node) + 1):
        model = float64_model(proto, islands)
        try:
            sess = session(model)
        except Exception as exc:  # no double kernel: the message names the node
            found = re.search(r"node with name '([^']*)'|in node \(([^)]*)\)", str(exc))
            node = found and (found.group(1) or found.group(2))
            if not node or node in islands:
                raise
            islands.add(node)
            continue
        wanted = {i.name for i in sess.get_inputs()}
        values = sess.run(
            None,
            {
                k: (v.astype(np.float64) if v.dtype == np.float32 else v)
                for k, v in feeds.items()
                if k in wanted
            },
        )
        outputs = [o.name for o in sess.get_outputs()]
        return dict(zip(outputs, values, strict=True))
    raise RuntimeError("no float64 model onnxruntime accepts")


def float64_model(proto: onnx.ModelProto, islands: set[str]) -> onnx.ModelProto:
    """A copy computing in double: float inputs, outputs and initializers become double,
    Cast to float casts to double; ``islands`` and Q/DQ nodes stay float32 between Casts.
    Nodes without a name get one, so an island can be named."""
    inferred = onnx.shape_inference.infer_shapes(proto).graph
    floats = {
        v.name
        for v in (*inferred.input, *inferred.value_info, *inferred.output)
        if v.type.tensor_type.elem_type == TensorProto.FLOAT
    } | {t.name for t in inferred.initializer if t.data_type == TensorProto.FLOAT}
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    del graph.value_info[:]
    for v in (*graph.input, *graph.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for i, t in enumerate(graph.initializer):
        if t.data_type == TensorProto.FLOAT:
            array = numpy_helper.to_array(t).astype(np.float64)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(array, t.name))
    nodes = []
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = f"opfuse_f64_{i}"
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.DOUBLE
        if node.op_type not in KEEP_FLOAT32 and node.name not in islands:
            nodes.append(node)
            continue
        for j, name in enumerate(node.input):
            if name in floats:
                node.input[j] = f"{name}__f32_{i}"
                nodes.append(make_node("Cast", [name], [node.input[j]], to=TensorProto.FLOAT))
        after = []
        for j, name in enumerate(node.output):
            if name in floats:
                node.output[j] = f"{name}__f32"
                after.append(make_node("Cast", [node.output[j]], [name], to=TensorProto.DOUBLE))
        nodes += [node, *after]
    del graph.node[:]
    graph.node.extend(nodes)
    return model
