"""What ``optimize --benchmark`` adds to the summary: the latency line measured on the
runtime, the inputs it timed on (the user's --inputs, or generated: said), the fused
kernels onnxruntime lost, and the opset upgrades that would let a pass fire."""

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
) -> Benchmark:
    """``optimize --benchmark``: the output against the original on the runtime, on the
    user's inputs or generated ones (named), and the fused kernels onnxruntime made from
    the original but not from the output."""
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
    return Benchmark(found, warnings)
