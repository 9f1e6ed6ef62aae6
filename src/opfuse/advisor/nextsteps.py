"""Next steps: the ``opfuse optimize`` commands worth trying on this model, each measured in a
short trial on this machine (the command's output against the model, paired and
interleaved), and, when none helps, the ops that dominate with what the tuning guide
suggests for them.

The measurement is one injectable callable, ``Compare(original, optimized) -> Ratio``, so
the section is tested with a fake runtime; ``compare_onnxruntime`` is the real one. A
candidate's flags are printed in its command exactly as they were measured: ``options_for``
turns the same flags into the options ``opfuse optimize`` builds from them."""

from __future__ import annotations

import os
import shlex
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir

from opfuse.advisor.activations import find_activations
from opfuse.advisor.graph import from_model
from opfuse.errors import OpfuseError
from opfuse.rewrite.context import Options

GELU_OPSET = 20  # ONNX's Gelu op: onnxruntime runs it as one kernel
HELPS = 0.02  # a ratio must beat 1 by more than this and the noise to count as helping
TRIAL_PAIRS = 15  # interleaved original/optimized runs in a trial
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


@dataclass(frozen=True)
class Ratio:
    value: float  # optimized time / original time (median over the pairs)
    noise: float  # the spread of the per-pair ratios (IQR)
    runs: int


# (original model, optimized model) -> the measured ratio
Compare = Callable[[Path, Path], Ratio]


@dataclass(frozen=True)
class Candidate:
    flags: tuple[str, ...]
    why: str


def options_for(flags: Sequence[str]) -> Options:
    """The options ``opfuse optimize`` builds from these flags (the ones advised here)."""
    options = Options()
    it = iter(flags)
    for flag in it:
        value = next(it)
        if flag == "--layout":
            options.layout = value
        elif flag == "--target-opset":
            options.target_opset = int(value)
        else:
            raise ValueError(f"next steps do not advise {flag}")
    return options


def candidates(model: ir.Model) -> list[Candidate]:
    """The default passes, and the options that change the interface or opset where the
    model shows what they fix."""
    out = [Candidate((), "opfuse's default passes")]
    graph = model.graph
    for value in graph.inputs:
        uses = [u.node for u in value.uses()]
        perm = uses[0].attributes.get("perm") if len(uses) == 1 else None
        if (
            uses
            and uses[0].op_type == "Transpose"
            and perm is not None
            and list(perm.value) == [0, 3, 1, 2]
        ):
            out.append(Candidate(("--layout", "nchw"), f"input {value.name} is NHWC"))
            break
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    if opset < GELU_OPSET:
        gelus = sum(
            1 for a in set(find_activations(from_model(model)).values()) if a.name == "GELU"
        )
        if gelus:
            out.append(
                Candidate(
                    ("--target-opset", str(GELU_OPSET)),
                    f"{gelus} GELU written out at opset {opset}",
                )
            )
    return out


def command(model: str, output: str, flags: Sequence[str]) -> str:
    return shlex.join(["opfuse", "optimize", model, "-o", output, *flags])


def effect(before: dict[str, int], after: dict[str, int]) -> str:
    """What changed in the op counts: 'Transpose -2, Gelu +18'."""
    changes = []
    for op in sorted(set(before) | set(after)):
        d = after.get(op, 0) - before.get(op, 0)
        if d:
            changes.append((abs(d), f"{op} {d:+d}"))
    changes.sort(key=lambda c: -c[0])
    return ", ".join(text for _, text in changes[:4]) or "no change to the graph"


def trial(
    model_path: str | os.PathLike[str],
    found: Sequence[Candidate],
    compare: Compare,
    step: Callable[[str, int, int], None] | None = None,
) -> list[dict[str, object]]:
    """Each candidate optimized (as its command would) and compared with the model."""
    from opfuse.api import optimize_file

    stem = Path(model_path).stem
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="opfuse-next-") as tmp:
        for i, cand in enumerate(found):
            if step:
                step("next steps: trial runs", i, len(found))
            out = Path(tmp) / f"{i}.onnx"
            suffix = "".join(f".{f.lstrip('-')}" for f in cand.flags) or ".opt"
            row: dict[str, object] = {
                "command": command(str(model_path), f"{stem}{suffix}.onnx", cand.flags),
                "flags": list(cand.flags),
                "why": cand.why,
                "ratio": None,
                "noise": None,
                "runs": 0,
                "effect": None,
                "helps": False,
                "error": None,
            }
            try:
                result = optimize_file(model_path, out, options=options_for(cand.flags))
                ratio = compare(Path(model_path), out)
            except OpfuseError as exc:
                row["error"] = str(exc).splitlines()[0]
                rows.append(row)
                continue
            row.update(
                ratio=round(ratio.value, 4),
                noise=round(ratio.noise, 4),
                runs=ratio.runs,
                effect=effect(dict(result.before), dict(result.after)),
                helps=ratio.value < 1 - max(HELPS, ratio.noise),
            )
            rows.append(row)
        if step:
            step("next steps: trial runs", len(found), len(found))
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


def compare_onnxruntime(
    provider: str = "CPUExecutionProvider", threads: int = 0, pairs: int = TRIAL_PAIRS
) -> Compare:
    """Both models at ORT_ENABLE_ALL (what a user deploys), one run of each in turn after a
    warm-up, on seeded random inputs; the ratio's median and IQR over the pairs."""

    def compare(original: Path, optimized: Path) -> Ratio:
        import onnxruntime as ort

        from opfuse.advisor.profile import iqr
        from opfuse.verify import make_inputs, run_model

        def session(path: Path) -> tuple[ort.InferenceSession, dict]:  # type: ignore[type-arg]
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.log_severity_level = 3
            providers = [provider] + (
                ["CPUExecutionProvider"] if provider != "CPUExecutionProvider" else []
            )
            sess = ort.InferenceSession(str(path), opts, providers=providers)
            feeds = make_inputs(sess, model=path)
            run_model(sess, feeds, path)  # warm-up
            return sess, feeds

        sessions = [(session(original), original), (session(optimized), optimized)]
        ratios = []
        for _ in range(pairs):
            took = []
            for (sess, feeds), path in sessions:
                start = time.perf_counter()
                run_model(sess, feeds, path)
                took.append(time.perf_counter() - start)
            ratios.append(took[1] / max(took[0], 1e-12))
        return Ratio(statistics.median(ratios), iqr(ratios), pairs)

    return compare
