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
    for name, ref in expected.items():
        diff = compare_arrays(name, ref, got[name], RTOL, ATOL)
        assert diff.ok, (
            f"{name}: max abs {diff.max_abs:g}, rel {diff.max_rel:g} {diff.detail}; "
            f"passes effected: {[(s.pass_name, s.pattern, s.effected) for s in result.log if s.effected]}"
        )
    again = optimize_model(ir.from_proto(optimized))
    changed = [(s.pass_name, s.pattern, s.effected) for s in again.log if s.effected]
    assert not changed, f"a second optimize changed the model again: {changed}"


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
