"""What ``optimize --benchmark`` adds to the summary: the latency line measured on the
runtime, the inputs it timed on (the user's --inputs, or generated: said), the fused
kernels onnxruntime lost (and, where opfuse knows it, what cost each and the option that
keeps it), and the opset upgrades that would let a pass fire."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opfuse.errors import OpfuseError
from opfuse.runtime.settings import RuntimeSettings

if TYPE_CHECKING:
    import onnx_ir as ir

    from opfuse.tuning.measure import Measurement


def opset_hints(model: ir.Model) -> list[str]:
    """``GeluFusionPass would fire at a higher opset: 18 matches at --target-opset 20``"""
    from opfuse.tuning.variants import opset_upgrades

    return [
        f"{name} would fire at a higher opset: {n} match{'' if n == 1 else 'es'} at --target-opset {opset}"
        for name, (opset, n) in opset_upgrades(model).items()
    ]


PathLike = str | os.PathLike[str]
GELU_POW = "PowToMulInGeluFusionPass"  # its rewrite stops onnxruntime's FastGelu


@dataclass
class Benchmark:
    """What ``optimize --benchmark`` measured: the latency of the output against the
    original, the inputs it timed on, and the warnings (lost kernels, generated inputs)."""

    measurement: Measurement
    warnings: list[str]

    def lines(self) -> list[str]:
        """The latency line and the inputs it was timed on."""
        lines = [self.measurement.line("opfuse")]
        if self.measurement.inputs is not None:
            lines.append(self.measurement.inputs.line("timed"))
        return lines

    def to_json(self) -> dict[str, object]:
        m = self.measurement
        return {
            **m.to_json(),
            "ratio": m.ratio("opfuse"),
            "line": m.line("opfuse"),
            "warnings": self.warnings,
        }


def benchmark_of(
    original: str | os.PathLike[str],
    output: str | os.PathLike[str],
    settings: RuntimeSettings,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    effected: Mapping[str, int] | None = None,
) -> Benchmark:
    """``optimize --benchmark``: the output against the original on the runtime, on the
    user's inputs or generated ones (named), and the fused kernels onnxruntime made from
    the original but not from the output, with what cost them where it is known
    (``effected``: the rewrites per pass)."""
    from opfuse.runtime.fused import lost_fusions, lost_text, runtime_kernels
    from opfuse.tuning.measure import measure

    runtime = settings.make()
    found = measure(
        original,
        {"opfuse": output},
        runtime,
        seconds=settings.bench_seconds,
        input_shapes=input_shapes,
        inputs_npz=inputs_npz,
    )
    warnings = list(found.warnings)
    if settings.runtime == "onnxruntime":  # the kernels are onnxruntime's
        provider = settings.provider or "CPUExecutionProvider"
        try:
            before = runtime_kernels(original, provider)
            after = runtime_kernels(output, provider)
        except OpfuseError as exc:  # an EP that cannot save its graph: say so, go on
            warnings.append(f"fused kernels not compared: {exc}")
        else:
            lost = lost_fusions(before, after)
            if lost:
                warnings.append(
                    "onnxruntime fuses fewer kernels from the output than from the original: "
                    f"{lost_text(lost)}"
                )
                warnings += lost_causes(lost, before, after, (original, output), effected or {})
    return Benchmark(found, warnings)


def lost_causes(
    lost: Mapping[str, tuple[int, int]],
    before: Mapping[str, int],
    after: Mapping[str, int],
    files: tuple[PathLike, PathLike],
    effected: Mapping[str, int],
) -> list[str]:
    """What cost the ``lost`` kernels (``runtime.fused.lost_fusions``) where opfuse knows
    it, each with the option that keeps the kernel: shape annotations (value_info) the
    output lacks (SkipLayerNormalization), and the x^3 of tanh GELUs rewritten into Muls
    (FastGelu). ``files``: the original and the output."""
    from opfuse.runtime.fused import ABSORBING

    causes = []
    skip = [op for op in ABSORBING if after.get(op, 0) < before.get(op, 0)]
    if skip:
        import onnx

        from opfuse.model.value_info import described_kept

        original, output = (onnx.load_model(str(f), load_external_data=False) for f in files)
        surviving, kept = described_kept(original, output)
        if kept < surviving:
            counts = ", ".join(f"{op} {before.get(op, 0)} -> {after.get(op, 0)}" for op in skip)
            causes.append(
                f"{counts}: the output lacks the shape annotations (value_info) of "
                f"{surviving - kept} of the {surviving} values the original described (the "
                "summary's note says why), and onnxruntime fuses an Add into the normalization "
                "only where it knows both of its inputs' shapes; --static-shapes with "
                "--input-shape makes every shape known"
            )
    fast = before.get("FastGelu", 0) - after.get("FastGelu", 0)
    if fast > 0 and "Gelu" in lost and effected.get(GELU_POW, 0):
        n = effected[GELU_POW]
        causes.append(
            f"FastGelu {before.get('FastGelu', 0)} -> {after.get('FastGelu', 0)}: {GELU_POW} "
            f"rewrote the x^3 of {n} tanh GELU{'' if n == 1 else 's'} into Muls, and "
            f"onnxruntime fuses such a GELU into FastGelu only while x^3 is a Pow; --disable "
            f"{GELU_POW} keeps it"
        )
    return causes
