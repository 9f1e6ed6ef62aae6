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
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from opfuse.advisor.report_types import NO_CHANGE
from opfuse.model import io
from opfuse.runtime import Runtime
from opfuse.tuning.variants import DEFAULT, Variant, build, probe
from opfuse.verification.compare import FedInputs

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
# a quantized model: no "quantize" advice; the int8 kernels and the Q/DQ left around
# float ops (the quantized findings say which)
QDQ_LEFT = (
    "conversions around ops without int8 kernels: see the quantized findings (float ops "
    "between DequantizeLinear and QuantizeLinear)"
)
INT8_CONV = "align channels to the int8 vector width (the quantized findings name the layers)"
FLOAT_LEFT = "runs in float in this quantized model: see the quantized findings (float layers)"
GUIDE_QUANTIZED = {
    "QLinearConv": INT8_CONV,
    "ConvInteger": INT8_CONV,
    "QGemm": INT8_CONV,
    "QLinearMatMul": INT8_CONV,
    "MatMulInteger": INT8_CONV,
    "QuantizeLinear": QDQ_LEFT,
    "DequantizeLinear": QDQ_LEFT,
    "Conv": FLOAT_LEFT,
    "MatMul": FLOAT_LEFT,
    "Gemm": FLOAT_LEFT,
}


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
    return [(v, why) for v, why, _ in candidates_and_passes(model)]


def candidates_and_passes(model: ir.Model) -> list[tuple[Variant, str, list[str]]]:
    """``candidates``, each with the passes it is for (an opset upgrade's; none else)."""
    found = probe(model)
    out: list[tuple[Variant, str, list[str]]] = [(DEFAULT, "opfuse's default passes", [])]
    out += [
        (Variant(layout=layout), f"an input is re-declared {layout.upper()}, its Transposes go", [])
        for layout in found.layouts
    ]
    for opset in sorted({o for o, _ in found.upgrades.values()}):
        names = [name for name, (o, _) in found.upgrades.items() if o == opset]
        passes = [f"{name}: {found.upgrades[name][1]} matches" for name in names]
        out.append((Variant(target_opset=opset), f"at opset {opset}, {', '.join(passes)}", names))
    return out


@dataclass
class Changes:
    """What each command's output does differently from the default passes' output: the
    names of the default output's nodes it removes or replaces, and the passes it is for."""

    nodes: dict[str, set[str]] = field(default_factory=dict)  # command -> node names
    passes: dict[str, list[str]] = field(default_factory=dict)  # command -> pass names


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


def node_keys(graph: ir.Graph) -> Counter[tuple[object, ...]]:
    """What each node of ``graph`` computes, names and order aside: its op, domain,
    overload, input and output values, attributes (a subgraph's by its own nodes)."""
    return Counter(
        (
            node.domain,
            node.op_type,
            node.overload,
            tuple(v.name if v is not None else "" for v in node.inputs),
            tuple(v.name for v in node.outputs),
            tuple(sorted((name, _attribute_key(a)) for name, a in node.attributes.items())),
        )
        for node in graph
    )


def _attribute_key(attr: ir.Attr) -> object:
    if attr.is_ref():
        return ("ref", attr.ref_attr_name)
    kind = attr.type
    if kind == ir.AttributeType.GRAPH:
        return tuple(sorted(node_keys(attr.as_graph()).items(), key=repr))
    if kind == ir.AttributeType.GRAPHS:
        return tuple(tuple(sorted(node_keys(g).items(), key=repr)) for g in attr.as_graphs())
    if kind == ir.AttributeType.TENSOR:
        return _tensor_key(attr.as_tensor())
    if kind == ir.AttributeType.TENSORS:
        return tuple(_tensor_key(t) for t in attr.as_tensors())
    value = attr.value
    return tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def _tensor_key(tensor: ir.TensorProtocol) -> object:
    return (str(tensor.dtype), tuple(tensor.shape.numpy()), tensor.tobytes())


def same_nodes(a: ir.Model, b: ir.Model) -> bool:
    """Whether ``b`` has ``a``'s nodes (``node_keys``): a command whose output does has
    changed no node of the model, whatever it wrote."""
    return node_keys(a.graph) == node_keys(b.graph)


def trial(
    model_path: str | os.PathLike[str],
    model: ir.Model,
    runtime: Runtime,
    seconds: float = TRIAL_SECONDS,
    step: Callable[[str, int, int], None] | None = None,
    *,
    input_shapes: Mapping[str, list[int]] | None = None,
    changes: Changes | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
) -> tuple[list[dict[str, object]], FedInputs | None]:
    """Each candidate built (optimized and verified, as its command does) and measured
    against the model in one paired, interleaved run, on the arrays of ``inputs_npz`` or
    inputs of ``input_shapes`` (what the advisor profiled); also what they were (None when
    nothing was measured). ``changes`` gets, per command, the nodes of the default passes'
    output it changes (so a report can say which groups a command fuses). A command whose
    output has the model's nodes (``same_nodes``) is not measured and never helps: its
    ``effect`` is NO_CHANGE (``opfuse optimize`` would say "no pass changed the model";
    timing a file identical to the model only measures noise)."""
    from opfuse.pipeline.conductor import op_counts
    from opfuse.tuning.measure import ORIGINAL, measure

    found_passes = candidates_and_passes(model)
    found = [(v, why) for v, why, _ in found_passes]
    names: dict[str, set[str]] = {}
    before = dict(op_counts(model))
    stem = Path(model_path).stem
    as_read = io.read_model(model_path)  # read as each output is, to compare their nodes
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
            result = build(
                model_path,
                variant,
                Path(tmp) / f"{i}.onnx",
                input_shapes=input_shapes,
                inputs_npz=inputs_npz,
            )
            if not result.ok:
                row["error"] = result.failure.splitlines()[0]
                continue
            out_model = io.read_model(result.path)
            if same_nodes(as_read, out_model):
                row["effect"] = NO_CHANGE
            else:
                built[variant.label] = result.path
                row["effect"] = effect(before, dict(op_counts(out_model)))
            names[str(row["command"])] = {n.name for n in out_model.graph if n.name}
            if changes is not None:
                changes.passes[str(row["command"])] = found_passes[i][2]
        if step:
            step("next steps: measuring", 0, 1)
        default = names.get(str(rows[0]["command"]))
        if changes is not None and default is not None:
            for cmd, kept in names.items():
                if cmd != rows[0]["command"]:
                    changes.nodes[cmd] = default - kept
        fed = None
        if built:
            m = measure(
                model_path,
                built,
                runtime,
                seconds=seconds,
                input_shapes=input_shapes,
                inputs_npz=inputs_npz,
            )
            fed = m.inputs
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
    return rows, fed


def dominant(
    op_statistic: Sequence[dict[str, object]], quantized: bool = False
) -> list[dict[str, object]]:
    """The op types with the most time, and the guide's suggestion for each (for a
    quantized model, never "quantize")."""
    guide = {**GUIDE, **GUIDE_QUANTIZED} if quantized else GUIDE
    rows: list[dict[str, object]] = []
    for s in op_statistic:
        share = float(str(s["share"]))
        if share < DOMINANT_SHARE and rows:
            break
        op = str(s["op_type"])
        rows.append(
            {"op_type": op, "share": round(share, 6), "suggestion": guide.get(op, GUIDE_DEFAULT)}
        )
        if len(rows) == 3:
            break
    return rows
