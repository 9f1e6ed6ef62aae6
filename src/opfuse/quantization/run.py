"""``opfuse quantize`` end to end on files: read the samples, fuse, quantize, clean up,
measure accuracy on held-back samples, gate (falling back to float for the most sensitive
layers), measure the speed, write atomically. Nothing is written when the gate or
``min_speedup`` fails (exit 1) or the input is bad (exit 2)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from opfuse.errors import GateError, OpfuseError
from opfuse.model import io
from opfuse.pipeline.run import OptimizeResult
from opfuse.pipeline.switch import SwitchTable
from opfuse.quantization import calibration, flow
from opfuse.quantization.accuracy import OutputAccuracy, compare_outputs, scoring_outputs
from opfuse.quantization.gate import Gate
from opfuse.quantization.kernels import KernelCoverage, integer_coverage
from opfuse.quantization.preprocess import Preprocess
from opfuse.quantization.sensitivity import activation_candidates
from opfuse.quantization.trace import TensorError, error_trace, largest_drops
from opfuse.runtime import Runtime
from opfuse.runtime.cpu import CpuFeatures, cpu_features
from opfuse.runtime.settings import RuntimeSettings
from opfuse.tuning.measure import Measurement, measure

RANDOM = "random"
RANDOM_SAMPLES = 16
MAX_SENSITIVITY_LAYERS = 48  # layers whose sensitivity is measured (each: one quantization)
MAX_FLOAT_LAYERS = 8  # layers the fallback may keep in float before giving up
MAX_FALLBACK_TRIES = 16  # the most sensitive layers it tries keeping in float, one by one
FLOAT_OPT, INT8 = "float-optimized", "int8"


@dataclass
class KeptFloat:
    node: str  # a node name, or "tensor NAME" (its producer and readers)
    sqnr_db: float  # the figure that ranked it (lower: more sensitive)
    how: str = "alone"  # which figure: sensitivity.Candidate.how
    nodes: tuple[str, ...] = ()  # the nodes kept in float (default: ``node``)

    @property
    def in_float(self) -> tuple[str, ...]:
        return self.nodes or (self.node,)


@dataclass
class QuantizeResult:
    fused: OptimizeResult
    accuracy: list[OutputAccuracy]
    gate: Gate
    calibration_samples: int
    eval_samples: int
    eval_source: str
    kept_float: list[KeptFloat] = field(default_factory=list)
    speed: Measurement | None = None
    cpu: CpuFeatures | None = None
    warnings: list[str] = field(default_factory=list)
    output: Path | None = None
    nodes: dict[str, int] = field(default_factory=dict)
    coverage: KernelCoverage | None = None  # integer kernels after onnxruntime's QDQ fusion
    # where the first int8 model's error grew most (traced only when it missed the gate)
    error_growth: list[TensorError] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        """The float original's latency over the int8 model's (paired)."""
        return None if self.speed is None else 1 / self.speed.ratio(INT8)

    def pays(self) -> bool | None:
        if self.speed is None:
            return None
        return self.speed.faster(INT8, "original") and self.speed.faster(INT8, FLOAT_OPT)

    def to_json(self) -> dict[str, object]:
        speed = None
        if self.speed is not None:
            speed = {
                **self.speed.to_json(),
                "int8_ratio_to_original": self.speed.ratio(INT8),
                "float_optimized_ratio_to_original": self.speed.ratio(FLOAT_OPT),
                "int8_pays": self.pays(),
            }
        return {
            "schema": "opfuse.quantize/1",
            "output": None if self.output is None else str(self.output),
            "calibration_samples": self.calibration_samples,
            "eval_samples": self.eval_samples,
            "eval_source": self.eval_source,
            "gate": self.gate.describe(),
            "accuracy": [a.to_json() for a in self.accuracy],
            "kept_float": [
                {"kept": k.node, "nodes": list(k.in_float), "sqnr_db": k.sqnr_db, "measure": k.how}
                for k in self.kept_float
            ],
            "speed": speed,
            "cpu": None if self.cpu is None else self.cpu.describe(),
            "nodes": self.nodes,
            "integer_kernels": None
            if self.coverage is None
            else {
                "integer_fraction": self.coverage.integer_fraction,
                "integer_ops": self.coverage.integer_ops,
                "float_between_qdq": self.coverage.float_between_qdq,
            },
            "error_growth": [e.to_json() for e in self.error_growth],
            "warnings": self.warnings,
        }

    def lines(self) -> list[str]:
        out = [
            f"calibrated on {self.calibration_samples} samples; accuracy on {self.eval_samples} "
            f"{self.eval_source}",
            *(f"  {a.line()}" for a in self.accuracy),
            f"gate: {self.gate.describe()}" + ("" if self.gate.off else ": passed"),
        ]
        if self.error_growth:
            grows = "; ".join(e.describe() for e in self.error_growth)
            out.append(f"the first int8 try's error grew most at: {grows}")
        if self.kept_float:
            kept = ", ".join(f"{k.node} ({k.sqnr_db:.1f} dB {k.how})" for k in self.kept_float)
            out.append(f"kept in float to pass the gate: {kept}")
        if self.coverage is not None:
            out.append(f"onnxruntime (CPU, after its QDQ fusion): {self.coverage.describe()}")
        if self.speed is not None and self.cpu is not None:
            out.append(
                f"latency vs the float original: int8 {self.speed.ratio(INT8):.2f}x, float "
                f"optimized {self.speed.ratio(FLOAT_OPT):.2f}x (noise +-{self.speed.noise:.0%}) "
                f"on {self.speed.runtime}"
            )
            if not self.pays():
                out.append(
                    f"int8 does not pay on this machine ({self.cpu.describe()}): the float "
                    f"optimized model is the faster choice here. {self.cpu.int8_verdict()}"
                )
        return out + [f"warning: {w}" for w in self.warnings]


def quantize_file(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    calibration_data: str | os.PathLike[str],
    *,
    eval_data: str | os.PathLike[str] | None = None,
    samples_count: int | None = None,
    preprocess: Preprocess | None = None,
    exclude: Sequence[str] = (),
    max_drop: str | None = None,
    min_speedup: float | None = None,
    benchmark: bool = True,
    runtime: RuntimeSettings | Runtime | None = None,
    options: flow.QuantOptions | None = None,
    switch_table: SwitchTable | None = None,
    enable: Sequence[str] = (),
    disable: Sequence[str] = (),
    report: str | os.PathLike[str] | None = None,
) -> QuantizeResult:
    """Quantize ``model`` into ``output`` (see the module)."""
    options = options or flow.QuantOptions()
    gate = Gate.parse(max_drop)
    if options.activation_type not in flow.ACTIVATION_TYPES:
        raise OpfuseError(f"--activation-type {options.activation_type!r}: uint8 or int8")
    if options.calibrate_method not in flow.CALIBRATE_METHODS:
        raise OpfuseError(
            f"--calibrate-method {options.calibrate_method!r}: one of "
            f"{', '.join(flow.CALIBRATE_METHODS)}"
        )
    if min_speedup is not None and (min_speedup <= 0 or not benchmark):
        raise OpfuseError(
            "--min-speedup needs a number above 0 and the benchmark (not --no-benchmark)"
        )
    io.check_outputs(model, [("-o", output), ("--report", report)])
    io.read_proto(model)
    inputs = calibration.model_inputs(model)
    warnings: list[str] = []
    if samples_count is not None and samples_count < 1:
        raise OpfuseError(f"--samples {samples_count}: a count of at least 1")
    if str(calibration_data) == RANDOM:
        samples = calibration.random_samples(inputs, samples_count or RANDOM_SAMPLES)
        warnings.append(
            "calibrated on RANDOM data (--calibration random): the scales and the accuracy "
            "figures say nothing about real inputs; give real samples before shipping"
        )
    else:
        samples = calibration.read_samples(calibration_data, inputs, preprocess)
        samples = calibration.first(samples, samples_count, str(calibration_data))
    if eval_data is not None:
        calib, held = samples, calibration.read_samples(eval_data, inputs, preprocess)
        source = f"samples from {eval_data}"
    else:
        calib, held = calibration.split(samples)
        source = "samples held back from the calibration data (not used to calibrate)"
    with tempfile.TemporaryDirectory(prefix=io.STAGING_PREFIX + "quant-") as tmp:
        work = Path(tmp)
        opset = flow.default_opset(model)
        target = None
        if options.per_channel and opset is not None and opset < flow.PER_CHANNEL_OPSET:
            target = flow.PER_CHANNEL_OPSET
            warnings.append(
                f"converted from opset {opset} to {target}: per-channel QuantizeLinear/"
                "DequantizeLinear (their axis) need it"
            )
        # verified on a real sample: generated inputs can be ones the model refuses (a
        # voice detector's window shorter than its STFT's padding, a rate it has no branch for)
        sample = work / "sample.npz"
        np.savez(sample, **calib[0])  # type: ignore[arg-type]  # numpy stubs: allow_pickle
        fused = flow.fuse(
            model, work / "fused.onnx", switch_table, enable, disable, target, verify_inputs=sample
        )
        excluded = flow.excluded_names(work / "fused.onnx", exclude)
        reference = _run(model, held)
        int8, accuracy, kept, growth = _quantize_gated(
            work, calib, held, reference, options, excluded, gate, sample
        )
        result = QuantizeResult(
            fused,
            accuracy,
            gate,
            len(calib),
            len(held),
            source,
            kept,
            warnings=warnings,
            error_growth=growth,
        )
        int8_model = onnx.load_model(str(int8))
        empty = flow.nothing_quantized(int8_model)
        if empty:
            warnings.append(empty)
        result.nodes = {
            "original": _nodes(model),
            FLOAT_OPT: _nodes(work / "fused.onnx"),
            INT8: len(int8_model.graph.node),
        }
        result.coverage = integer_coverage(int8_model)
        if benchmark:
            settings = runtime if isinstance(runtime, RuntimeSettings) else RuntimeSettings()
            rt = settings.make() if runtime is None or runtime is settings else runtime
            result.speed = measure(
                model,
                {FLOAT_OPT: work / "fused.onnx", INT8: int8},
                rt,  # type: ignore[arg-type]
                seconds=settings.bench_seconds,
                feeds=held[0],
            )
            result.cpu = cpu_features()
            if min_speedup is not None and (result.speedup or 0) < min_speedup:
                raise GateError(
                    f"int8 runs at {result.speedup:.2f}x the float original's speed on "
                    f"{result.speed.runtime} ({result.cpu.describe()}), below --min-speedup "
                    f"{min_speedup:g}: nothing written",
                    report=result,
                )
        io.save_model(io.load_model(int8), output, input_path=model)
        result.output = Path(output)
    if report is not None:
        import json

        io.write_text(report, json.dumps(result.to_json(), indent=2) + "\n", what="report")
    return result


def _quantize_gated(
    work: Path,
    calib: list[calibration.Sample],
    held: list[calibration.Sample],
    reference: list[list[np.ndarray]],
    options: flow.QuantOptions,
    excluded: list[str],
    gate: Gate,
    sample: Path | None = None,
) -> tuple[Path, list[OutputAccuracy], list[KeptFloat], list[TensorError]]:
    """Quantize; when the gate is missed, trace where the error grows and keep the most
    sensitive layers in float one by one until it holds (GateError, naming where the
    error grows, when MAX_FLOAT_LAYERS are not enough)."""
    fused = work / "fused.onnx"
    scoring = _scoring(fused)

    def attempt(exclude: list[str], name: str) -> tuple[Path, list[OutputAccuracy]]:
        qdq, out = work / f"{name}.qdq.onnx", work / f"{name}.onnx"
        flow.quantize(fused, qdq, calib, options, exclude)
        flow.clean_up(qdq, out, sample)
        return out, compare_outputs(_output_names(fused), reference, _run(out, held), scoring)

    path, accuracy = attempt(excluded, "int8")
    misses = gate.misses(accuracy)
    if not misses:
        return path, accuracy, [], []
    growth = largest_drops(error_trace(fused, work / "int8.qdq.onnx", held))
    layers = [n for n in flow.weighted_nodes(fused) if n not in excluded]
    measured = layers[:MAX_SENSITIVITY_LAYERS]
    sensitivity = []
    # alone: every other quantized op in float too, those without weights included (else
    # their error is the floor of every layer's figure)
    everything = list(dict.fromkeys([*layers, *flow.quantized_nodes(work / "int8.qdq.onnx")]))
    for i, layer in enumerate(measured):
        others = [n for n in everything if n != layer]
        _, alone = attempt(excluded + others, f"alone{i}")
        sensitivity.append(KeptFloat(layer, min(a.sqnr_db for a in alone)))
    sensitivity.sort(key=lambda k: k.sqnr_db)
    tensors = [
        KeptFloat(c.label, c.sqnr_db, c.how, c.nodes)
        for c in activation_candidates(fused, work / "int8.qdq.onnx", calib)
        if not set(c.nodes) & set(excluded)
    ]
    # the two figures do not compare (the whole output's SQNR against one tensor's own
    # rounding): the worst of each, taken in turn, tensors first (one float run ranks them
    # all; the layers' figure is measured on the first MAX_SENSITIVITY_LAYERS only)
    sensitivity = [k for pair in zip_longest(tensors, sensitivity) for k in pair if k is not None]
    # a layer stays in float only when that measurably helps: the error a layer adds alone
    # does not always add up (on PP-OCR's recognizer, keeping the 8 worst "alone" layers in
    # float took top-1 agreement from 98.1% down to 95.8%), so each is tried and kept or not
    kept: list[KeptFloat] = []
    best = _standing(gate, accuracy)
    tried = 0
    for k in sensitivity:
        if len(kept) >= MAX_FLOAT_LAYERS or tried >= MAX_FALLBACK_TRIES:
            break
        in_float = list(dict.fromkeys([*excluded, *(n for x in [*kept, k] for n in x.in_float)]))
        if layers and set(layers) <= set(in_float):
            continue  # never every layer: a model with no int8 layer left is not quantized
        tried += 1
        candidate, measured_figures = attempt(in_float, f"fallback{len(kept) + 1}")
        if _standing(gate, measured_figures) <= best:
            continue
        kept.append(k)
        path, accuracy, best = candidate, measured_figures, _standing(gate, measured_figures)
        if not gate.misses(accuracy):
            return path, accuracy, kept, growth
    figures = "; ".join(a.line() for a in accuracy)
    helped = f" ({', '.join(k.node for k in kept)} helped)" if kept else " (none helped)"
    grows = "; ".join(e.describe() for e in growth[:2])
    raise GateError(
        f"the int8 model misses --max-drop ({'; '.join(gate.misses(accuracy))}) even after "
        f"trying its {tried} most sensitive layers in float{helped}: {figures}; "
        + (f"the error grows most at {grows}; " if grows else "")
        + "nothing written"
    )


def _standing(gate: Gate, accuracy: list[OutputAccuracy]) -> tuple[float, ...]:
    """How close the figures are to passing, larger is closer: fewer misses, then the
    lowest top-1 agreement, then the lowest SQNR."""
    top1 = [a.top1 for a in accuracy if a.top1 is not None]
    return (-len(gate.misses(accuracy)), min(top1, default=1.0), min(a.sqnr_db for a in accuracy))


def _scoring(model: Path) -> set[str]:
    """The outputs of ``model`` a classifier head makes (top-1 agreement applies)."""
    return scoring_outputs(onnx.load_model(str(model), load_external_data=False))


def _output_names(model: Path) -> list[str]:
    import onnx

    return [o.name for o in onnx.load_model(str(model), load_external_data=False).graph.output]


def _run(
    model: str | os.PathLike[str], samples: list[calibration.Sample]
) -> list[list[np.ndarray]]:
    """The model's outputs per sample, on onnxruntime CPU at its default optimizations
    (what a deployment runs: its int8 kernels come from its QDQ fusion)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        return [sess.run(None, s) for s in samples]
    except Exception as exc:  # onnxruntime's own exception types
        raise OpfuseError(f"{model}: onnxruntime cannot run it on the samples: {exc}") from None


def _nodes(model: str | os.PathLike[str]) -> int:
    import onnx

    return len(onnx.load_model(str(model), load_external_data=False).graph.node)
