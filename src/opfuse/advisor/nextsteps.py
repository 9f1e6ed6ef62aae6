"""Next steps: the ``opfuse optimize`` commands worth trying on this model, each measured in a
short trial on this machine, and, when none helps, the ops that dominate with what the
tuning guide suggests for them.

Built on the tune machinery: ``opfuse.tuning.variants.probe`` says which settings apply (a layout
that re-declares an input, an opset upgrade that lets a pass run), ``variants.build``
optimizes and verifies each as ``opfuse optimize`` does, and ``opfuse.tuning.measure.measure``
times them paired and interleaved with the original on a ``Runtime`` (onnxruntime at
ORT_ENABLE_ALL; ``FakeRuntime`` in tests). A candidate's command prints exactly the options
it was built with."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx_ir as ir

from opfuse.model import io
from opfuse.runtime import Runtime
from opfuse.tuning.variants import DEFAULT, Variant, build, probe

TRIAL_SECONDS = 3.0  # the measurement's budget (at least 5 interleaved rounds)
DOMINANT_SHARE = 0.10  # op types above this share of the time are named when nothing helps

# op type -> what the tuning guide suggests when opfuse cannot make it faster
GUIDE = {
    "MatMul": "change parameters: a smaller hidden size, or quantize to int8 (compute-bound)",
    "Gemm": "change parameters: a smaller hidden size, or quantize to int8 (compute-bound)",
    "Conv": "align channels to the target's multiple, or quantize to int8",
    "ConvTranspose": "replace by Resize + Conv, or align channels",
    "Transpose": "export in the runtime's layout so the Transposes are not needed",
    "Reshape": "fix the input shapes so shape arithmetic folds away (--input-shape)",
    "Resize": "align the sizes so the scale is an integer",
    "Softmax": "split long sequences, or use the runtime's fused attention",
    "LayerNormalization": "convert to opset 17+ so it runs as one kernel",
    "Einsum": "replace by MatMul with Transpose/Reshape",
    "Pow": "replace by Mul (PowToMulFusionPass)",
}
GUIDE_DEFAULT = "split the op, or change its parameters (sizes, dtype)"


def flags(variant: Variant) -> list[str]:
    """The ``opfuse optimize`` options that build the variant (next steps use no switches)."""
    out = []
    if variant.layout != "keep":
        out += ["--layout", variant.layout]
    if variant.target_opset is not None:
        out += ["--target-opset", str(variant.target_opset)]
    return out


def candidates(model: ir.Model) -> list[tuple[Variant, str]]:
    """The default passes, each layout that re-declares an input, each opset upgrade that
    lets a pass run: with what in the model each is for."""
    found = probe(model)
    out = [(DEFAULT, "opfuse's default passes")]
    out += [
        (Variant(layout=layout), f"an input is re-declared {layout.upper()}, its Transposes go")
        for layout in found.layouts
    ]
    for opset in sorted({o for o, _ in found.upgrades.values()}):
        passes = [f"{name}: {n} matches" for name, (o, n) in found.upgrades.items() if o == opset]
        out.append((Variant(target_opset=opset), f"at opset {opset}, {', '.join(passes)}"))
    return out


def command(model: str, output: str, options: Sequence[str]) -> str:
    return shlex.join(["opfuse", "optimize", model, "-o", output, *options])


def effect(before: dict[str, int], after: dict[str, int]) -> str:
    """What changed in the op counts, what appeared first: 'Gelu +18, Mul -36, Erf -18'."""
    changes = []
    for op in sorted(set(before) | set(after)):
        d = after.get(op, 0) - before.get(op, 0)
        if d:
            changes.append((d < 0, -abs(d), f"{op} {d:+d}"))
    changes.sort(key=lambda c: c[:2])
    return ", ".join(text for *_, text in changes[:5]) or "no change to the graph"


def trial(
    model_path: str | os.PathLike[str],
    model: ir.Model,
    runtime: Runtime,
    seconds: float = TRIAL_SECONDS,
    step: Callable[[str, int, int], None] | None = None,
) -> list[dict[str, object]]:
    """Each candidate built (optimized and verified, as its command does) and measured
    against the model in one paired, interleaved run."""
    from opfuse.pipeline.run import op_counts
    from opfuse.tuning.measure import ORIGINAL, measure

    found = candidates(model)
    before = dict(op_counts(model))
    stem = Path(model_path).stem
    rows: list[dict[str, object]] = []
    built: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="opfuse-next-") as tmp:
        for i, (variant, why) in enumerate(found):
            if step:
                step("next steps: building the candidates", i, len(found))
            options = flags(variant)
            suffix = "".join(f".{o.lstrip('-')}" for o in options) or ".opt"
            row: dict[str, object] = {
                "command": command(str(model_path), f"{stem}{suffix}.onnx", options),
                "flags": options,
                "why": why,
                "ratio": None,
                "noise": None,
                "runs": 0,
                "effect": None,
                "helps": False,
                "error": None,
            }
            rows.append(row)
            result = build(model_path, variant, Path(tmp) / f"{i}.onnx")
            if not result.ok:
                row["error"] = result.failure.splitlines()[0]
                continue
            built[variant.label] = result.path
            row["effect"] = effect(before, dict(op_counts(io.read_model(result.path))))
        if step:
            step("next steps: measuring", 0, 1)
        if built:
            m = measure(model_path, built, runtime, seconds=seconds)
            labels = [v.label for v, _ in found]
            for row, label in zip(rows, labels, strict=True):
                if label in built:
                    row.update(
                        ratio=round(m.ratio(label), 4),
                        noise=round(m.noise, 4),
                        runs=m.rounds,
                        helps=m.faster(label, ORIGINAL),
                    )
        if step:
            step("next steps: measuring", 1, 1)
    return rows


def dominant(op_statistic: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The op types with the most time, and the guide's suggestion for each."""
    rows: list[dict[str, object]] = []
    for s in op_statistic:
        share = float(s["share"])  # type: ignore[arg-type]
        if share < DOMINANT_SHARE and rows:
            break
        op = str(s["op_type"])
        rows.append(
            {"op_type": op, "share": round(share, 6), "suggestion": GUIDE.get(op, GUIDE_DEFAULT)}
        )
        if len(rows) == 3:
            break
    return rows
