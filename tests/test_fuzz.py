"""Fuzzed equivalence: on random valid graphs (tests/fuzz_graphs.py) ``optimize_model``
keeps every output within tolerance (onnxruntime with its optimizations off on both
sides), the result passes ``onnx.checker``, and a second optimize effects nothing.

CI runs ``OPFUSE_FUZZ_EXAMPLES`` examples (default 300); ``make fuzz`` runs 10,000.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings

from fuzz_graphs import graphs
from opfuse.pipeline.conductor import OptimizeResult, optimize_model
from opfuse.verification import tolerance
from opfuse.verification.compare import compare_arrays

EXAMPLES = int(os.environ.get("OPFUSE_FUZZ_EXAMPLES", "300"))
RTOL, ATOL = 1e-4, 1e-5


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = session(proto)
    wanted = {i.name for i in sess.get_inputs()}
    values = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip([o.name for o in sess.get_outputs()], values, strict=True))


def check_equivalent(
    proto: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    optimize: Callable[[ir.Model], OptimizeResult] = optimize_model,
) -> None:
    """The property, for one model (also used by the regression tests). ``optimize`` is
    replaceable so that a test can show a wrong rewrite is still caught."""
    onnx.checker.check_model(proto, full_check=True)  # the generator makes valid graphs
    expected = run(proto, feeds)
    result = optimize(ir.from_proto(proto))
    optimized = ir.to_proto(result.model)
    onnx.checker.check_model(optimized, full_check=True)
    assert [i.name for i in optimized.graph.input] == [i.name for i in proto.graph.input]
    got = run(optimized, feeds)
    assert list(got) == list(expected), f"outputs {list(got)} != {list(expected)}"
    bad = [n for n, ref in expected.items() if not compare_arrays(n, ref, got[n], RTOL, ATOL).ok]
    truth = run_float64(proto, feeds) if bad else {}
    for name in bad:
        ref, out = expected[name], got[name]
        diff = compare_arrays(name, ref, out, RTOL, ATOL)
        if not diff.detail and tolerance.within_rounding(ref, out, truth[name], RTOL, ATOL):
            continue  # no farther from the exact result than the original (see below)
        assert diff.ok, (
            f"{name}: max abs {diff.max_abs:g}, rel {diff.max_rel:g} {diff.detail}; "
            f"passes effected: {[(s.pass_name, s.pattern, s.effected) for s in result.log if s.effected]}"
        )
    again = optimize_model(ir.from_proto(optimized))
    changed = [(s.pass_name, s.pattern, s.effected) for s in again.log if s.effected]
    assert not changed, f"a second optimize changed the model again: {changed}"


def run_float64(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The original graph in float64: the judge of the rounding allowance (opfuse.verification.tolerance;
    a random graph can be ill-conditioned, e.g. a LayerNorm over a row whose values are
    equal within 1 ulp, where a legal reassociation moves the output far more than rtol)."""
    return tolerance.run_float64(proto, feeds, session)


def mistaken(mistake: Callable[[ir.Model], None]) -> Callable[[ir.Model], OptimizeResult]:
    """optimize_model followed by one deliberate mistake."""

    def optimize(model: ir.Model) -> OptimizeResult:
        result = optimize_model(model)
        mistake(result.model)
        return result

    return optimize


def wrong_epsilon(model: ir.Model) -> None:
    """The fused LayerNormalization took epsilon 1e-3 instead of 1e-5."""
    (norm,) = [n for n in model.graph if n.op_type == "LayerNormalization"]
    norm.attributes["epsilon"] = ir.AttrFloat32("epsilon", 1e-3)


def wrong_constant(model: ir.Model) -> None:
    """One element of every float constant is 1% off (a fold that rounded badly)."""
    for value in model.graph.initializers.values():
        array = value.const_value.numpy() if value.const_value is not None else None
        if array is not None and array.dtype == np.float32 and array.size > 1:
            array = array.copy()
            array.flat[0] *= np.float32(1.01)
            value.const_value = ir.tensor(array, name=value.name)


@pytest.mark.parametrize("mistake", [wrong_epsilon, wrong_constant])
def test_check_catches_wrong_rewrites(mistake):
    """The rounding allowance is wide on the ill-conditioned rows of this model; a small
    real mistake is still caught on its well-conditioned elements."""
    from test_regressions import ill_conditioned_layernorm

    proto, feeds = ill_conditioned_layernorm()
    check_equivalent(proto, feeds)  # the real optimizer passes
    with pytest.raises(AssertionError, match="max abs"):
        check_equivalent(proto, feeds, mistaken(mistake))


def test_float64_model_computes_in_double():
    """Every node runs in double but Q/DQ and nodes without a double kernel (Conv)."""
    from test_regressions import ill_conditioned_layernorm

    proto, feeds = ill_conditioned_layernorm()
    truth = run_float64(proto, feeds)
    # in float64 Sub(Add(c, x), x) is c to 1e-16: the normalized rows are zero
    assert np.abs(truth["v25"][0, :4]).max() < 1e-9
    assert np.abs(run(proto, feeds)["v25"][0, :4]).max() > 1e-5  # float32 is not


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
