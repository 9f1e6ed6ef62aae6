"""Shared test tools: build small models from ONNX text, run chosen passes, and compare
outputs with onnxruntime at ORT_DISABLE_ALL (so its own fusions hide nothing)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from opfuse.pipeline.conductor import OptimizeResult, optimize_model
from opfuse.rewrite.context import Options
from opfuse.verification.compare import compare_arrays

RTOL, ATOL = 1e-4, 1e-5


def model_from_text(text: str, initializers: Mapping[str, np.ndarray] | None = None) -> ir.Model:
    """A model from the ONNX text format; ``initializers`` adds named numpy constants."""
    tensors = [ir.tensor(v, name=k) for k, v in (initializers or {}).items()]
    model = ir.from_onnx_text(text, initializers=tensors)
    onnx.checker.check_model(ir.to_proto(model), full_check=True)
    return model


def copy_model(model: ir.Model) -> ir.Model:
    return ir.from_proto(ir.to_proto(model))


def only(*names: str) -> dict[str, dict[str, bool]]:
    """A switch table running just ``names`` (and the mandatory passes)."""
    return {"GraphFusion": {"ALL": False, **dict.fromkeys(names, True)}}


def run_passes(model: ir.Model, *names: str, options: Options | None = None) -> OptimizeResult:
    """Run only the named passes (plus the mandatory ones) on ``model`` in place."""
    return optimize_model(model, switch_table=only(*names), options=options)


def op_types(model: ir.Model) -> Counter[str]:
    return Counter(node.op_type for node in ir.traversal.RecursiveGraphIterator(model.graph))


def effected(result: OptimizeResult, pass_name: str, pattern: str | None = None) -> int:
    return sum(
        s.effected for s in result.log if s.pass_name == pass_name and pattern in (None, s.pattern)
    )


def reasons(result: OptimizeResult, pass_name: str) -> list[str]:
    return [r for s in result.log if s.pass_name == pass_name for r in s.reasons]


def _session(model: ir.Model) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )


def random_feeds(model: ir.Model, seed: int = 0, dims: int = 2) -> dict[str, np.ndarray]:
    """Seeded inputs; symbolic dims become ``dims``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.inputs:
        if value.name in model.graph.initializers:
            continue
        shape = [d if isinstance(d, int) else dims for d in value.shape]
        dtype = value.dtype.numpy()
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, 3, shape).astype(dtype)
    return feeds


def run_model(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = _session(model)
    wanted = {i.name for i in sess.get_inputs()}
    values = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip([o.name for o in sess.get_outputs()], values, strict=True))


def assert_same_outputs(
    original: ir.Model,
    optimized: ir.Model,
    feeds: Mapping[str, np.ndarray] | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> None:
    """Both models give the same outputs (by name) on the same inputs."""
    onnx.checker.check_model(ir.to_proto(optimized), full_check=True)
    feeds = feeds if feeds is not None else random_feeds(original)
    ref, got = run_model(original, feeds), run_model(optimized, feeds)
    assert list(ref) == list(got), f"outputs differ: {list(ref)} vs {list(got)}"
    for name in ref:
        diff = compare_arrays(name, ref[name], got[name], rtol, atol)
        assert diff.ok, f"{name}: max abs {diff.max_abs:g}, rel {diff.max_rel:g} {diff.detail}"


def check_rule(
    model: ir.Model, *names: str, options: Options | None = None, feeds=None
) -> tuple[ir.Model, OptimizeResult]:
    """Run the passes on a copy, check numbers against the original and idempotence.

    Returns the optimized model and the result of the first run.
    """
    result = run_passes(copy_model(model), *names, options=options)
    optimized = result.model  # a new model when options.target_opset converted it
    assert_same_outputs(model, optimized, feeds)
    again = run_passes(copy_model(optimized), *names, options=options)
    changed = {(s.pass_name, s.pattern): s.effected for s in again.log if s.effected}
    changed = {k: v for k, v in changed.items() if k[0] in names}
    assert not changed, f"second run changed the model again: {changed}"
    return optimized, result


def graph_text(model: ir.Model) -> str:
    return ir.to_onnx_text(model)


def names_of(values: Iterable[ir.Value]) -> list[str]:
    return [v.name or "" for v in values]


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``opfuse ARGS`` in this process (``cli.main``): its exit status and its stderr."""
    monkeypatch.delenv("OPFUSE_DEBUG", raising=False)
    status, _, err = run_command(args, monkeypatch, capsys)
    return status, err


def run_command(args: Iterable[object], monkeypatch, capsys) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """``opfuse ARGS`` through the console entry point in this process: (exit status,
    stdout, stderr)."""
    import sys

    from opfuse import cli

    monkeypatch.setattr(sys, "argv", ["opfuse", *map(str, args)])
    status = 0
    try:
        cli.main()
    except SystemExit as exc:
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err
