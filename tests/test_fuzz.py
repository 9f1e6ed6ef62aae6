"""Fuzzed equivalence: on random valid graphs (tests/fuzz_graphs.py) ``optimize_model``
keeps every output within tolerance (onnxruntime with its optimizations off on both
sides), the result passes ``onnx.checker``, and a second optimize effects nothing.

CI runs ``OPFUSE_FUZZ_EXAMPLES`` examples (default 300); ``make fuzz`` runs 10,000.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings

from fuzz_graphs import graphs
from opfuse.api import optimize_model
from opfuse.verify import compare_arrays

EXAMPLES = int(os.environ.get("OPFUSE_FUZZ_EXAMPLES", "300"))
RTOL, ATOL = 1e-4, 1e-5


def run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    values = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip([o.name for o in sess.get_outputs()], values, strict=True))


def check_equivalent(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """The property, for one model (also used by the regression tests)."""
    onnx.checker.check_model(proto, full_check=True)  # the generator makes valid graphs
    expected = run(proto, feeds)
    result = optimize_model(ir.from_proto(proto))
    optimized = ir.to_proto(result.model)
    onnx.checker.check_model(optimized, full_check=True)
    assert [i.name for i in optimized.graph.input] == [i.name for i in proto.graph.input]
    got = run(optimized, feeds)
    assert list(got) == list(expected), f"outputs {list(got)} != {list(expected)}"
    bad = [n for n, ref in expected.items() if not compare_arrays(n, ref, got[n], RTOL, ATOL).ok]
    if bad:
        noise = rounding_noise(proto, feeds, expected)
    for name in bad:
        ref, out = expected[name], got[name]
        diff = compare_arrays(name, ref, out, RTOL, ATOL)
        if not diff.detail and within_noise(ref, out, noise[name]):
            continue  # the original's own rounding explains the difference (see below)
        assert diff.ok, (
            f"{name}: max abs {diff.max_abs:g}, rel {diff.max_rel:g} {diff.detail}; "
            f"passes effected: {[(s.pass_name, s.pattern, s.effected) for s in result.log if s.effected]}"
        )
    again = optimize_model(ir.from_proto(optimized))
    changed = [(s.pass_name, s.pattern, s.effected) for s in again.log if s.effected]
    assert not changed, f"a second optimize changed the model again: {changed}"


NOISE_FACTOR = 4
NOISE_TRIALS = 3


def rounding_noise(
    proto: onnx.ModelProto, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """How much each output of the original moves when every float intermediate is
    rounded a few ulp differently.

    A random graph can be ill-conditioned (a LayerNorm over two nearly equal values
    divides a difference of 1e-4 by sqrt(eps)): there a legal reassociation that rounds
    one intermediate 1 ulp differently moves the output far more than rtol allows. The
    original with each float node output scaled by 1 +- 2 ulp moves just as much, so a
    difference is allowed up to NOISE_FACTOR times that movement, element by element.
    A wrong rewrite also differs on well-conditioned elements and still fails.
    """
    inferred = onnx.shape_inference.infer_shapes(proto)
    floats = {
        v.name
        for v in (*inferred.graph.value_info, *inferred.graph.output)
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    rng = np.random.default_rng(0)
    noise = {k: np.zeros(np.shape(v), np.float64) for k, v in expected.items()}
    for _ in range(NOISE_TRIALS):
        moved_run = run(nudged_model(proto, floats, rng), feeds)
        for k, v in moved_run.items():
            moved = np.abs(v.astype(np.float64) - expected[k].astype(np.float64))
            noise[k] = np.fmax(noise[k], np.nan_to_num(moved, nan=0.0, posinf=0.0))
    return noise


def nudged_model(
    proto: onnx.ModelProto, floats: set[str], rng: np.random.Generator
) -> onnx.ModelProto:
    """A copy whose float node outputs are each multiplied by 1 +- 2 ulp."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    nodes = []
    for i, node in enumerate(model.graph.node):
        nodes.append(node)
        for j, out in enumerate(node.output):
            if out not in floats:
                continue
            raw, factor = f"{out}__raw", f"{out}__nudge"
            node.output[j] = raw
            f = np.float32(1 + rng.choice([-2, 2]) * np.finfo(np.float32).eps)
            model.graph.initializer.append(onnx.numpy_helper.from_array(f, factor))
            nodes.append(onnx.helper.make_node("Mul", [raw, factor], [out], name=f"nudge{i}_{j}"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def within_noise(ref: np.ndarray, got: np.ndarray, noise: np.ndarray) -> bool:
    r, g = ref.astype(np.float64), got.astype(np.float64)
    if not np.array_equal(np.isnan(r), np.isnan(g)):
        return False
    finite = np.isfinite(r)
    scale = max(1.0, float(np.max(np.abs(r[finite])))) if finite.any() else 1.0
    allowed = ATOL * scale + RTOL * np.abs(r) + NOISE_FACTOR * noise
    return bool(np.all(np.abs(r - g)[finite] <= allowed[finite]))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES < 1000,  # CI: the same graphs every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(graphs())
def test_optimize_keeps_outputs_and_is_idempotent(case):
    proto, feeds = case
    check_equivalent(proto, feeds)
