"""Candidate optimize settings for measured tuning: a ``Variant`` is one choice of pass
switches, layout and target opset; ``probe`` finds which choices are worth a trial for a
model; ``build`` makes and verifies one variant's file."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx
import onnx_ir as ir

from opfuse.errors import OpfuseError
from opfuse.model import io
from opfuse.model.graphs import all_graphs
from opfuse.pipeline.conductor import optimize_file, optimize_model
from opfuse.pipeline.switch import SwitchTable
from opfuse.rewrite.context import Options, PassContext
from opfuse.rewrite.rule import Rule
from opfuse.rewrite.stats import EffectLog
from opfuse.rules import all_passes
from opfuse.verification.compare import compare_files

LAYOUTS = ("nchw", "nhwc")


@dataclass(frozen=True)
class Variant:
    """One candidate: ``switches`` are (pass, on) pairs that differ from the passes'
    defaults; ``original`` is the input model unchanged (the other settings unused)."""

    switches: tuple[tuple[str, bool], ...] = ()
    layout: str = "keep"
    target_opset: int | None = None
    static_shapes: bool = False  # inputs re-declared with the --input-shape dims
    original: bool = False

    @property
    def label(self) -> str:
        if self.original:
            return "original"
        parts = [f"{'+' if on else '-'}{name}" for name, on in self.switches]
        if self.layout != "keep":
            parts.append(f"--layout {self.layout}")
        if self.target_opset is not None:
            parts.append(f"--target-opset {self.target_opset}")
        if self.static_shapes:
            parts.append("--static-shapes")
        return " ".join(parts) or "default"

    def flip(self, pass_name: str, default_on: bool) -> Variant:
        """The pass switched the other way from its state in this variant."""
        state = dict(self.switches)
        on = not state.get(pass_name, default_on)
        if on == default_on:
            state.pop(pass_name, None)
        else:
            state[pass_name] = on
        return replace(self, switches=tuple(sorted(state.items())))

    def switch_table(self) -> SwitchTable:
        sections = {p.name: p.section for p in all_passes()}
        table: SwitchTable = {}
        for name, on in self.switches:
            table.setdefault(sections[name], {})[name] = on
        return table

    def switch_file(self) -> dict[str, object]:
        """The CANN-format fusion switch file that reproduces the variant's passes (the
        sections it changes; an empty GraphFusion for the defaults)."""
        table = self.switch_table() or {"GraphFusion": {}}
        return {
            "Switch": {
                section: {name: "on" if on else "off" for name, on in entries.items()}
                for section, entries in table.items()
            }
        }

    def options(self, base: Options | None = None) -> Options:
        return replace(base or Options(), layout=self.layout, target_opset=self.target_opset)

    def command(
        self,
        model: str | os.PathLike[str],
        output: str | os.PathLike[str],
        switch_file: str | os.PathLike[str],
        input_shapes: Mapping[str, list[int]] | None = None,
    ) -> str:
        """The ``opfuse optimize`` command line that rebuilds this variant."""
        if self.original:
            return f"cp {shlex.quote(str(model))} {shlex.quote(str(output))}"
        args = ["opfuse", "optimize", str(model), "-o", str(output)]
        args += ["--fusion-switch-file", str(switch_file)]
        if self.layout != "keep":
            args += ["--layout", self.layout]
        if self.target_opset is not None:
            args += ["--target-opset", str(self.target_opset)]
        if self.static_shapes:
            args.append("--static-shapes")
        for name, dims in (input_shapes or {}).items():
            args += ["--input-shape", f"{name}:{','.join(map(str, dims))}"]
        return shlex.join(args)


ORIGINAL = Variant(original=True)
DEFAULT = Variant()


@dataclass
class Probe:
    """What is worth a trial in one model: the switchable passes whose patterns matched
    (with every pass on), the layouts that change its interface, and the opset upgrades
    that let a matching pass run (pass -> (opset, matches))."""

    matched: list[str] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    upgrades: dict[str, tuple[int, int]] = field(default_factory=dict)
    static_shapes: bool = False  # the user gave --input-shape with --static-shapes

    def flips(self, best: Variant) -> list[Variant]:
        """The variants one choice away from ``best``: opset upgrades and layouts first,
        then passes that are off by default turned on, then the others turned off."""
        defaults = {p.name: p.default for p in all_passes()}
        opsets = sorted({o for o, _ in self.upgrades.values()})
        out = [replace(best, target_opset=o) for o in ([*opsets, None] if opsets else [])]
        out += [replace(best, layout=lay) for lay in [*self.layouts, "keep"]]
        if self.static_shapes:
            out.append(replace(best, static_shapes=not best.static_shapes))
        ordered = sorted(self.matched, key=lambda name: defaults[name])  # off-by-default first
        out += [best.flip(name, defaults[name]) for name in ordered]
        return [v for v in dict.fromkeys(out) if v != best]


def opset_upgrades(model: ir.Model) -> dict[str, tuple[int, int]]:
    """Passes on by default that cannot run at the model's opset but whose patterns match
    in it (a read-only match, no rewrite): pass -> (the lowest opset it runs at, matches).
    ``GeluFusionPass: (20, 18)`` means ``--target-opset 20`` would fuse 18 GELUs."""
    ctx = PassContext(model, Options(), EffectLog())
    opset = ctx.opset
    found: dict[str, tuple[int, int]] = {}
    for info in all_passes():
        if not info.rules or not info.default or info.opset_min <= opset:
            continue  # it runs already, or no upgrade reaches it
        roots: dict[str, list[Rule]] = {}
        for rule in info.rules:
            for op_type in rule.root_types():
                roots.setdefault(op_type, []).append(rule)
        matches = sum(
            any(rule.match(node, ctx) is not None for rule in roots.get(node.op_type, ()))
            for graph in ctx.graphs()
            for node in graph
        )
        if matches:
            found[info.name] = (info.opset_min, matches)
    return found


def probe(model: ir.Model, layouts: Sequence[str] = LAYOUTS) -> Probe:
    """Run the passes in memory (every switchable pass on; each of ``layouts``) to see
    what matches; the model is not changed."""
    every = [p.name for p in all_passes()]
    result = optimize_model(io.copy_model(model), enable=every)
    matched = [p.name for p in all_passes() if not p.mandatory and result.log.matched(p.name)]
    found = []
    for layout in layouts:
        trial = optimize_model(io.copy_model(model), options=Options(layout=layout))
        if any(note.startswith("input ") and " is now " in note for note in trial.notes):
            found.append(layout)
    return Probe(matched, found, opset_upgrades(model))


def interface_changes(
    original: str | os.PathLike[str], written: str | os.PathLike[str]
) -> list[str]:
    """How ``written``'s inputs and outputs differ from ``original``'s (names, element
    types, dims; a symbolic dim and -1 are both dynamic): ``input 'x' is [N,3,224,224],
    was [N,224,224,3]``; empty when a caller of the original can call it unchanged."""
    import onnx

    def signature(path: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, str]]:
        graph = onnx.load_model(str(path), load_external_data=False).graph
        inits = {i.name for i in graph.initializer}
        return (
            {v.name: _value_text(v) for v in graph.input if v.name not in inits},
            {v.name: _value_text(v) for v in graph.output},
        )

    changes = []
    for kind, before, after in zip(
        ("input", "output"), signature(original), signature(written), strict=True
    ):
        for name in before.keys() | after.keys():
            was, now = before.get(name), after.get(name)
            if was == now:
                continue
            if now is None:
                changes.append(f"{kind} {name!r} ({was}) is gone")
            elif was is None:
                changes.append(f"{kind} {name!r} ({now}) is new")
            else:
                changes.append(f"{kind} {name!r} is {now}, was {was}")
    return sorted(changes)


def _value_text(value: onnx.ValueInfoProto) -> str:
    """``float[N,3,224,224]``: the element type and dims (``?`` for any dynamic dim)."""
    t = value.type
    if t.WhichOneof("value") != "tensor_type":
        return t.WhichOneof("value") or "?"
    elem = onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type).name
    if not t.tensor_type.HasField("shape"):
        return f"{elem}[?rank]"
    dims = [
        str(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else "?"
        for d in t.tensor_type.shape.dim
    ]
    return f"{elem}[{','.join(dims)}]"


def node_count(model: ir.Model) -> int:
    return sum(1 for g in all_graphs(model.graph) for _ in g)


@dataclass
class Built:
    """One variant's file, its node count, and its verification ("" when it verified)."""

    variant: Variant
    path: Path
    nodes: int
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


def build(
    model_path: str | os.PathLike[str],
    variant: Variant,
    out: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, list[int]] | None = None,
    inputs_npz: str | os.PathLike[str] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    base_options: Options | None = None,
) -> Built:
    """Optimize ``model_path`` with the variant's settings into ``out`` and verify it
    against the original as ``optimize`` does; a failure is recorded, not raised."""
    if variant.original:
        return Built(variant, Path(model_path), node_count(io.load_model(model_path)))
    try:
        result = optimize_file(
            model_path,
            out,
            switch_table=variant.switch_table(),
            options=variant.options(base_options),
            verify=False,
            input_shapes=input_shapes if variant.static_shapes else None,
            static_shapes=variant.static_shapes,
        )
    except OpfuseError as exc:
        return Built(variant, Path(out), 0, f"optimize failed: {exc}")
    nodes = node_count(result.model)
    try:
        report = compare_files(
            model_path, out, rtol=rtol, atol=atol, input_shapes=input_shapes, inputs_npz=inputs_npz
        )
    except OpfuseError as exc:
        return Built(variant, Path(out), nodes, str(exc))
    return Built(variant, Path(out), nodes, "" if report.ok else report.failure())
