"""The advisor's pipeline, a straight line of values: the target (with this machine's
peaks), opfuse's trial on the model (``Loaded``), the profile (run here, or read), its
times placed on the graph that ran (the ``Analysis``), then the sections and the report
(sections.py). Returns the JSON report (schema ``opfuse.advise/2``, see docs/ADVISOR.md);
render.py renders it (a text and an HTML renderer per section)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import onnx_ir as ir

from opfuse.advisor.analysis import AdviseOptions, Analysis, Step, ort_providers
from opfuse.advisor.attribution import Attribution, Resolver, attribute, runtime_kernels
from opfuse.advisor.executed_graph import RanGraph, ran_graph
from opfuse.advisor.graph import OpGraph, from_chain, from_model
from opfuse.advisor.machine_peaks import Peaks, machine_peaks
from opfuse.advisor.profile_readers import (
    InputShape,
    OpRecord,
    Profile,
    declared_dim,
    read_op_summary,
    read_ort_profile,
    run_onnxruntime,
)
from opfuse.advisor.report_types import AdviceReport
from opfuse.advisor.sections import SCHEMA, read_outside, report
from opfuse.advisor.trial import Trial
from opfuse.errors import OpfuseError
from opfuse.model import io
from opfuse.model.shapes import infer_shapes
from opfuse.runtime.targets import Target, load_target

__all__ = ["SCHEMA", "AdviseOptions", "Analysis", "advise", "analyse", "read_outside", "report"]

# built-in targets whose peaks are measured on this machine (their files' are approximate)
CALIBRATED = frozenset({"builtin:cpu", "builtin:cuda"})


def default_target(provider: str, op_summary: bool) -> str:
    if op_summary:
        return "ascend310"
    return "cuda" if provider.startswith("CUDA") else "cpu"


def _name_nodes(model: ir.Model) -> None:
    """Give every node a unique name (onnxruntime's profile names nodes by them)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def _ort_graph(path: str | os.PathLike[str], level: str, provider: str, tmp: str) -> OpGraph:
    """The graph onnxruntime runs after its own optimizations at ``level``."""
    from opfuse.model.sessions import open_session

    out = os.path.join(tmp, f"ort_{level}_{Path(path).stem}.onnx")
    open_session(
        path,
        provider=provider,
        cpu_fallback=True,
        threads=0,
        graph_opt=level if level in ("basic", "extended", "all") else "all",
        optimized_path=out,
    )
    return from_model(io.read_model(out))


QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def graph_opt_for(o: AdviseOptions, quantized: bool) -> str:
    """The level to profile at: the one asked for, else ``disable`` (a time per node of
    the model), or for a QDQ model ``all``: the graph onnxruntime deploys, its Q/DQ pairs
    fused into integer kernels (at ``disable`` every Q/DQ runs and every Conv runs in
    float on dequantized weights: times of a graph nobody deploys)."""
    if o.graph_opt is not None:
        return o.graph_opt
    return "all" if quantized else "disable"


@dataclass(frozen=True)
class Loaded:
    """The model, and opfuse's trial optimization of it (the graph the advisor profiles)."""

    original: ir.Model  # node names made unique, shapes inferred
    original_graph: OpGraph
    original_types: dict[str, str]
    trial: Trial
    analysed: OpGraph  # the model after opfuse's default passes
    analysed_path: str  # ... saved for onnxruntime
    path: str | os.PathLike[str] | None = None  # the user's model file (named in errors)

    @property
    def quantized(self) -> bool:
        return any(n.op_type in QDQ_OPS for n in self.original_graph.nodes)


def _check_sources(
    model_path: str | os.PathLike[str] | None,
    profile_path: str | os.PathLike[str] | None,
    op_summary: str | os.PathLike[str] | None,
) -> None:
    if model_path is None and op_summary is None:
        raise OpfuseError("give a MODEL, or --op-summary CSV to advise from msprof alone")
    if profile_path is not None and op_summary is not None:
        raise OpfuseError("give --profile or --op-summary, not both")
    if profile_path is not None and model_path is None:
        raise OpfuseError("--profile needs the MODEL that produced it")


def target_of(o: AdviseOptions, op_summary: bool, step: Step) -> tuple[Target, Peaks | None]:
    """The target; for cpu and cuda with this machine's measured peaks."""
    target = load_target(o.target or default_target(o.provider, op_summary))
    if not (o.calibrate and target.source in CALIBRATED and o.provider in ort_providers()):
        return target, None
    step("measuring this machine's peaks", 0, 1)
    peaks = machine_peaks(o.provider, o.threads, o.measure_peaks)
    target = replace(
        target,
        peak_flops=peaks.flops,
        vector_flops=peaks.flops,
        bandwidth_bytes_per_s=peaks.bandwidth,
    )
    step("measuring this machine's peaks", 1, 1)
    return target, peaks


def load(model_path: str | os.PathLike[str], tmp: str, step: Step) -> Loaded:
    step("opfuse trial optimization", 0, 1)
    original = io.load_model(model_path)
    _name_nodes(original)
    shaped = io.copy_model(original)
    infer_shapes(shaped)
    original_graph = from_model(shaped)
    trial = Trial.run(original)
    analysed = trial.result.model
    _name_nodes(analysed)
    analysed_path = os.path.join(tmp, "analysed.onnx")
    io.save_model(analysed, analysed_path)
    step("opfuse trial optimization", 1, 1)
    return Loaded(
        original=shaped,
        original_graph=original_graph,
        original_types={n.name: n.op_type for n in shaped.graph if n.name is not None},
        trial=trial,
        analysed=from_model(analysed),
        analysed_path=analysed_path,
        path=model_path,
    )


def profile_of(
    o: AdviseOptions,
    loaded: Loaded | None,
    profile_path: str | os.PathLike[str] | None,
    op_summary: str | os.PathLike[str] | None,
    tmp: str,
    step: Step,
) -> Profile:
    """The op summary or onnxruntime profile given, else a profile of the analysed model."""
    if op_summary is not None:
        return read_op_summary(op_summary)
    if profile_path is not None:
        read = replace(read_ort_profile(profile_path, o.warmup), provider=o.provider)
        if loaded is not None:
            read.inputs = inputs_from_records(loaded.original, read.records)
        return read
    assert loaded is not None
    return run_onnxruntime(
        loaded.analysed_path,
        runs=o.runs,
        warmup=o.warmup,
        threads=o.threads,
        provider=o.provider,
        graph_opt=o.graph_opt or "disable",
        input_shapes=o.input_shapes,
        inputs_npz=o.inputs,
        optimized_out=os.path.join(tmp, "profiled_ort.onnx"),
        progress=lambda done, total: step("profiling with onnxruntime", done, total),
        shown_as=loaded.path,
    )


def inputs_from_records(model: ir.Model, records: list[OpRecord]) -> list[InputShape]:
    """The model inputs' shapes in a profile that was given: the input shapes onnxruntime
    recorded for the first profiled node that reads each input."""
    by_name = {r.name: r for r in records}
    out = []
    for value in model.graph.inputs:
        if value.name in model.graph.initializers or value.shape is None:
            continue
        declared = [
            declared_dim(d if isinstance(d, int) else getattr(d, "value", None))
            for d in value.shape
        ]
        for node in model.graph:
            rec = by_name.get(node.name or "")
            k = next((k for k, v in enumerate(node.inputs) if v is value), None)
            if rec is not None and k is not None and len(rec.input_shapes) > k:
                out.append(InputShape(str(value.name), list(rec.input_shapes[k]), declared))
                break
    return out


@dataclass(frozen=True)
class Placement:
    """The graph the groups are grown on, and the profile's times put on it."""

    graph: OpGraph
    times: Attribution
    resolver: Resolver
    ran: RanGraph | None
    ran_kernels_fused: bool
    profile: Profile  # with the notes and graph level the placement found


def place(
    o: AdviseOptions,
    loaded: Loaded | None,
    profile: Profile,
    model_path: str | os.PathLike[str] | None,
    profile_path: str | os.PathLike[str] | None,
    op_summary: str | os.PathLike[str] | None,
    tmp: str,
    step: Step,
) -> Placement:
    """Choose the graph the groups are grown on and put the profile's times on it."""
    records = profile.records
    ran: RanGraph | None = None
    fused = False
    if loaded is None:  # msprof alone: the operators in execution order
        graph = from_chain([r.name for r in records], [r.op_type for r in records])
        resolver = Resolver(graph)
    else:
        graph = loaded.analysed
        if profile.ort_optimized_model:  # kernels of the graph onnxruntime ran
            resolver = Resolver(graph, None, from_model(io.read_model(profile.ort_optimized_model)))
        else:
            resolver = Resolver(graph, loaded.original_graph)
        if op_summary is not None:  # the operators that ran, by their names
            ran = ran_graph(loaded.original_graph, records)
        elif profile.ort_optimized_model and loaded.quantized and profile_path is None:
            ran, profile = _deployed(loaded.analysed, profile)
            fused = True
        elif profile_path is not None:  # the kernels that ran
            assert model_path is not None
            ran, fused, profile = _ran_kernels(
                o, loaded.original_graph, profile, model_path, tmp, step
            )
    if ran is not None:
        graph, times = ran.graph, ran.times
        resolver = Resolver(graph)
    else:
        times = attribute(records, resolver)
    return Placement(graph, times, resolver, ran, fused, profile)


def _deployed(analysed: OpGraph, profile: Profile) -> tuple[RanGraph, Profile]:
    """A QDQ model profiled as deployed: the graph onnxruntime saved while profiling (its
    QDQ fusion done: QLinearConv, QGemm, QLinearAdd ...), one node per kernel, each mapped
    back to the analysed model's nodes it runs (a QLinearConv runs its DequantizeLinears,
    the Conv and the QuantizeLinear after it), with the profile's times on the kernels."""
    assert profile.ort_optimized_model is not None
    runtime = from_model(io.read_model(profile.ort_optimized_model))
    mapper = Resolver(analysed, runtime=runtime)
    runs = {
        n.index: mapper.kernel_nodes(n.name) or _body_of(mapper, runtime, n.index) or [n.name]
        for n in runtime.nodes
    }
    fused = sorted(
        {n.op_type for n in runtime.nodes if n.op_type.startswith("Q") and n.op_type not in QDQ_OPS}
        | {n.op_type for n in runtime.nodes if n.op_type.endswith("Integer")}
    )
    profile = replace(
        profile,
        notes=[
            f"a quantized (QDQ) model: profiled as onnxruntime deploys it, at "
            f"ORT_ENABLE_{profile.graph_opt.upper()} with its QDQ fusion "
            f"({', '.join(fused[:6]) or 'no integer kernels'}); groups are grown on that graph, "
            "each kernel mapped to the model's nodes it runs",
            *profile.notes,
        ],
    )
    return RanGraph(runtime, runs, attribute(profile.records, Resolver(runtime))), profile


def _body_of(mapper: Resolver, runtime: OpGraph, index: int) -> list[str] | None:
    """A kernel of an inlined function body (``HardSigmoid_4``, ``Mul_5`` of a HardSwish,
    reading and making tensors onnxruntime renamed): the function's model node, the first
    of the nodes the next mapped kernel on its path runs (the QuantizeLinear after it runs
    the HardSwish and itself), following the one reader of each output, up to 8 kernels."""
    node = runtime.nodes[index]
    for _ in range(8):
        readers = runtime.consumers.get(node.outputs[0], []) if node.outputs else []
        if len(readers) != 1:
            return None
        node = runtime.nodes[readers[0]]
        nodes = mapper.kernel_nodes(node.name)
        if nodes:
            return nodes[:1]
    return None


def _ran_kernels(
    o: AdviseOptions,
    g: OpGraph,
    profile: Profile,
    model_path: str | os.PathLike[str],
    tmp: str,
    step: Step,
) -> tuple[RanGraph, bool, Profile]:
    """The graph an onnxruntime profile ran: the model's own nodes where every name is
    one of them (a profile at ORT_DISABLE_ALL), else the graph onnxruntime builds at
    ``--graph-opt`` (``all`` by default) whose kernels the names are, each kernel
    mapped to the model's nodes it runs. Also whether it is that fused graph, and the
    profile with the level and a note saying so."""
    own = Resolver(g)
    records = profile.records
    as_model = RanGraph(g, {n.index: [n.name] for n in g.nodes}, attribute(records, own))
    unknown = [r.name for r in records if r.name not in g.by_name]
    if not unknown:
        return as_model, False, profile
    level = o.graph_opt if o.graph_opt not in (None, "disable") else "all"
    step("onnxruntime graph of the profiled model", 0, 1)
    runtime = _ort_graph(model_path, level, o.provider, tmp)
    step("onnxruntime graph of the profiled model", 1, 1)
    if not any(name in runtime.by_name for name in unknown):
        return as_model, False, profile  # names of neither graph stay unmapped
    mapper = Resolver(g, runtime=runtime)
    runs = {n.index: mapper.kernel_nodes(n.name) or [n.name] for n in runtime.nodes}
    profile = replace(
        profile,
        graph_opt=profile.graph_opt or level,
        notes=[
            *profile.notes,
            f"the profiled names are onnxruntime's kernels at ORT_ENABLE_{level.upper()}: "
            "groups are grown on that graph, each kernel mapped to the model's nodes it runs",
        ],
    )
    return RanGraph(runtime, runs, attribute(records, Resolver(runtime))), True, profile


def analyse(
    model_path: str | os.PathLike[str] | None,
    *,
    profile_path: str | os.PathLike[str] | None = None,
    op_summary: str | os.PathLike[str] | None = None,
    options: AdviseOptions | None = None,
    step: Step | None = None,
) -> Analysis:
    """target -> trial (``load``) -> profile -> placement -> onnxruntime's own fusions."""
    _check_sources(model_path, profile_path, op_summary)
    o = options or AdviseOptions()
    step = step or (lambda what, done, total: None)
    target, peaks = target_of(o, op_summary is not None, step)
    with tempfile.TemporaryDirectory(prefix="opfuse-advise-") as tmp:
        loaded = load(model_path, tmp, step) if model_path is not None else None
        quantized = loaded is not None and loaded.quantized
        if profile_path is None and op_summary is None:
            o = replace(o, graph_opt=graph_opt_for(o, quantized))
        profile = profile_of(o, loaded, profile_path, op_summary, tmp, step)
        if quantized and profile.source == "onnxruntime" and profile.graph_opt == "disable":
            profile = replace(
                profile,
                notes=[
                    "a quantized (QDQ) model profiled at --graph-opt disable: onnxruntime's "
                    "QDQ fusion is off, every QuantizeLinear/DequantizeLinear runs and every "
                    "Conv/MatMul runs in float; leave --graph-opt out (or give all) to profile "
                    "the graph onnxruntime deploys",
                    *profile.notes,
                ],
            )
        placed = place(o, loaded, profile, model_path, profile_path, op_summary, tmp, step)
        profile, times, ran = placed.profile, placed.times, placed.ran
        if times.aligned:
            profile = replace(
                profile,
                notes=[
                    *profile.notes,
                    f"{len(times.aligned)} kernels onnxruntime named itself (inlined "
                    f"function bodies such as {times.aligned[0]}) attributed by execution "
                    "order to the node without a time of its own that follows",
                ],
            )
        kernels: dict[int, list[str]] | None = None
        compare: str | os.PathLike[str] | None = None  # the model onnxruntime would fuse
        if loaded is not None and op_summary is None and not placed.ran_kernels_fused:
            compare = loaded.analysed_path if ran is None else model_path
        if compare is not None and o.compare_onnxruntime:
            step("onnxruntime graph at ORT_ENABLE_ALL", 0, 1)
            runtime = _ort_graph(compare, "all", o.provider, tmp)
            kernels = runtime_kernels(Resolver(placed.graph, runtime=runtime))
            step("onnxruntime graph at ORT_ENABLE_ALL", 1, 1)
    return Analysis(
        opts=o,
        step=step,
        model_path=model_path,
        target=target,
        peaks=peaks,
        profile=profile,
        original=loaded.original if loaded is not None else None,
        original_graph=loaded.original_graph if loaded is not None else None,
        original_types=loaded.original_types if loaded is not None else {},
        trial=loaded.trial if loaded is not None else None,
        graph=placed.graph,
        times=times,
        resolver=placed.resolver,
        ran=ran,
        ran_kernels_fused=placed.ran_kernels_fused,
        quantized=quantized,
        node_of=ran.owner() if ran is not None else dict(placed.graph.by_name),
        runtime_kernels=kernels,
    )


def advise(
    model_path: str | os.PathLike[str] | None,
    *,
    profile_path: str | os.PathLike[str] | None = None,
    op_summary: str | os.PathLike[str] | None = None,
    options: AdviseOptions | None = None,
    step: Step | None = None,
) -> AdviceReport:
    """The advisor report, typed (``to_json()``: schema opfuse.advise/2; also a read-only
    mapping of that JSON, as the dict this returned before)."""
    analysis = analyse(
        model_path, profile_path=profile_path, op_summary=op_summary, options=options, step=step
    )
    return report(analysis)
