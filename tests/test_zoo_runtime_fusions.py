"""Slow: on every zoo model, onnxruntime (ORT_ENABLE_ALL) makes from opfuse's default
output every fused kernel it makes from the original (Gelu, FusedConv, LayerNormalization,
...), and tune on a small zoo model with the fake runtime writes a verified model whose
switch file and command line rebuild the same graph."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from opfuse.pipeline.conductor import optimize_file
from opfuse.runtime.fake import FakeRuntime
from opfuse.runtime.fused import lost_fusions, lost_text, runtime_kernels
from zoo import ZOO_MODELS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [m for m in ZOO_MODELS if m != "tx100"])
def test_default_optimize_keeps_every_runtime_fusion(zoo_dir, tmp_path, name):
    src, dst = zoo_dir / f"{name}.onnx", tmp_path / f"{name}.onnx"
    optimize_file(src, dst)
    lost = lost_fusions(runtime_kernels(src), runtime_kernels(dst))
    assert not lost, f"{name}: {lost_text(lost)}"


def test_tune_on_a_zoo_model_rebuilds_from_its_switch_file(zoo_dir, tmp_path):
    import shlex

    from click.testing import CliRunner

    from opfuse.cli import app
    from opfuse.tuning import search as tuning

    src = zoo_dir / "transformer_tiny.onnx"
    out, switch = tmp_path / "t.onnx", tmp_path / "t.cfg"
    commands: list[str] = []

    def keep(result, built):
        commands.append(tuning.write_outputs(result, built, src, out, switch))

    # Gelu is cheap, Erf/Div/Mul expensive: the opset-20 variant wins
    runtime = FakeRuntime({"Erf": 0.01, "Div": 0.005, "Mul": 0.005}, default=0.0001)
    result = tuning.tune(src, runtime, tuning.SearchSettings(bench_seconds=0.05), keep=keep)
    assert result.best.target_opset == 20 and result.beat_original
    args = shlex.split(commands[0])
    rebuilt = tmp_path / "rebuilt.onnx"
    args[args.index("-o") + 1] = str(rebuilt)
    run = CliRunner().invoke(app, args[1:])
    assert run.exit_code == 0, run.output

    def ops(path) -> Counter[str]:
        return Counter(n.op_type for n in onnx.load(str(path)).graph.node)

    assert ops(rebuilt) == ops(out) and ops(out)["Gelu"] == 10
