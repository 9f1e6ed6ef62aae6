"""The mixed-precision fallback: after the best recipe, when the int8 model misses the
gate, keep its most sensitive parts in float one at a time, each kept only when it
measurably helps (on the validation part), until the gate holds or the budget is spent.

Candidates, worst first, two kinds ranked together (both figures are the SQNR of one
rounding at one tensor, against that tensor's float values):

- an activation tensor, by the SQNR of its own rounding (the scale and zero point the
  quantizer chose, on the float model's values: one float run ranks them all; keeping it
  in float keeps its producer and its readers in float);
- a weighted layer (Conv, MatMul, Gemm), by the SQNR at its own output of its weight's
  int8 rounding (one float run ranks them all: ``sensitivity.weight_candidates``).

The error a layer adds alone does not always add up: on PP-OCR's recognizer, keeping its
8 worst layers in float one after the other took top-1 agreement from 98.1% *down* to
95.8% (the errors of other layers had partly cancelled theirs), which is why each is
measured before it is kept. The search is bounded in tries, layers kept and seconds; a
progress line per try.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from opfuse.quantization import flow
from opfuse.quantization.accuracy import OutputAccuracy
from opfuse.quantization.gate import Gate
from opfuse.quantization.names import FALLBACK_SECONDS
from opfuse.quantization.sensitivity import activation_candidates, weight_candidates
from opfuse.quantization.workspace import Workspace

MAX_FLOAT_LAYERS = 8  # candidates the fallback may keep in float before giving up
MAX_FALLBACK_TRIES = 16  # candidates it tries, one by one
RANK_SAMPLES = 4  # calibration samples the candidates are ranked on


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
class FallbackResult:
    model: onnx.ModelProto
    accuracy: list[OutputAccuracy]  # on the validation part
    kept: list[KeptFloat] = field(default_factory=list)
    tries: int = 0
    stopped: str = ""  # why it stopped

    @property
    def exclude(self) -> list[str]:
        return list(dict.fromkeys(n for k in self.kept for n in k.in_float))


def fallback(
    ws: Workspace,
    gate: Gate,
    build: Callable[[list[str]], onnx.ModelProto],
    first: onnx.ModelProto,
    accuracy: list[OutputAccuracy],
    seconds: float = FALLBACK_SECONDS,
) -> FallbackResult:
    """Keep candidates in float (``build(exclude)`` makes the int8 model with those node
    names in float, on top of ``ws.exclude``) while each improves the figures (``Gate.better``) on
    the validation part; stop when the gate holds there, or at MAX_FLOAT_LAYERS kept,
    MAX_FALLBACK_TRIES tried or ``seconds`` spent."""
    start = time.perf_counter()
    layers = [n for n in flow.weighted_nodes(ws.float_model) if n not in ws.exclude]
    tensors = [
        KeptFloat(c.label, c.sqnr_db, c.how, c.nodes)
        for c in activation_candidates(ws.float_model, first, ws.calib[:RANK_SAMPLES])
        if not set(c.nodes) & set(ws.exclude)
    ]
    weights = [
        KeptFloat(c.label, c.sqnr_db, c.how, c.nodes)
        for c in weight_candidates(ws.float_model, layers, ws.calib[:RANK_SAMPLES], ws.per_channel)
    ]
    # both figures are the SQNR of one rounding at one tensor: one ranking, worst first
    ranked = sorted([*tensors, *weights], key=lambda k: k.sqnr_db)
    found = FallbackResult(first, accuracy)
    best = accuracy
    for k in ranked:
        if len(found.kept) >= MAX_FLOAT_LAYERS:
            found.stopped = f"{MAX_FLOAT_LAYERS} parts kept in float"
            break
        if found.tries >= MAX_FALLBACK_TRIES:
            found.stopped = f"{MAX_FALLBACK_TRIES} tries"
            break
        if time.perf_counter() - start > seconds:
            found.stopped = f"its {seconds:.0f} s budget"
            break
        in_float = list(dict.fromkeys([*found.exclude, *k.in_float]))
        if layers and set(layers) <= set(in_float) | set(ws.exclude):
            continue  # never every layer: a model with no int8 layer left is not quantized
        found.tries += 1
        model = build(in_float)
        figures = ws.score(model)
        helped = gate.better(figures, best)
        ws.say(
            f"fallback try {found.tries}: {k.node} in float ({k.sqnr_db:.1f} dB {k.how}): "
            f"{_figures(figures)} on validation, {'kept' if helped else 'no help'}"
        )
        if not helped:
            continue
        found.kept.append(k)
        found.model, found.accuracy, best = model, figures, figures
        if not gate.misses(figures):
            found.stopped = "the gate holds on the validation part"
            break
    else:
        found.stopped = found.stopped or "no candidate left"
    return found


def _figures(accuracy: list[OutputAccuracy]) -> str:
    top1 = [a.top1 for a in accuracy if a.top1 is not None]
    sqnr = min((a.sqnr_db for a in accuracy), default=float("nan"))
    return (f"top-1 {min(top1):.1%}, " if top1 else "") + f"SQNR {sqnr:.1f} dB"
