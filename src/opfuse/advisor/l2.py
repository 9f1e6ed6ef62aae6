"""L2 fusion candidates: chains of fused groups (or single ops) joined by single-consumer
tensors that fit the target's L2, splitting the batch where only a smaller batch fits (the
guide's ResNet50 at batch 8 run as 4 x batch 2). Ratio estimates for onnxruntime profiles."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opfuse.advisor.graph import OpGraph
from opfuse.advisor.groups import Group
from opfuse.advisor.opkinds import Kind, classify
from opfuse.runtime.targets import Target

RATIO_KEYS = ("mac_ratio", "vec_ratio", "mte2_ratio", "mte3_ratio")
# ops that change only a tensor's shape metadata: charged no data traffic
NO_COPY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
ABOVE_PEAK = (
    "an estimate above 1: the op ran faster than the peak assumed (data served from a cache "
    "moves faster than the measured memory bandwidth)"
)


@dataclass
class L2Chain:
    members: list[int]
    units: int
    batch: int
    split_to: int  # batch per run after the split (== batch: no split)
    max_bytes: int
    duration_us: float = 0.0
    ops: list[dict[str, object]] = field(default_factory=list)


def _split(size: int, batch: int, l2: int) -> int | None:
    """Largest batch (a divisor of ``batch``) whose share of ``size`` fits in ``l2``."""
    if size <= l2:
        return batch
    if batch <= 1:
        return None
    per_sample = size / batch
    for b in range(batch - 1, 0, -1):
        if batch % b == 0 and per_sample * b <= l2:
            return b
    return None


def l2_chains(
    g: OpGraph,
    groups: Sequence[Group],
    out_bytes: Callable[[int], int | None],
    batch_of: Callable[[int], int],
    target: Target,
) -> list[L2Chain]:
    """Maximal chains of at least two units with a Conv-like op, linear in the graph."""
    unit_of: dict[int, int] = {}
    units: list[list[int]] = []
    for grp in groups:
        for m in grp.members:
            unit_of[m] = len(units)
        units.append(list(grp.members))
    for node in g.nodes:
        if node.index not in unit_of:
            unit_of[node.index] = len(units)
            units.append([node.index])
    nxt: dict[int, tuple[int, int, int]] = {}  # unit -> (next unit, split batch, bytes)
    has_prev: set[int] = set()
    for u, members in enumerate(units):
        last = g.nodes[members[-1]]
        if len(last.outputs) != 1 or last.outputs[0] in g.graph_outputs:
            continue
        consumers = g.consumers.get(last.outputs[0], [])
        if len(consumers) != 1:
            continue
        v = unit_of[consumers[0]]
        if units[v][0] != consumers[0] or v == u:
            continue
        size = out_bytes(members[-1])
        if size is None:
            continue
        split = _split(size, batch_of(members[-1]), target.l2_bytes)
        if split is None:
            continue
        nxt[u] = (v, split, size)
        has_prev.add(v)
    chains = []
    for start in range(len(units)):
        if start in has_prev:
            continue
        u, current = start, [start]
        splits: list[int] = []
        sizes: list[int] = []
        while u in nxt:
            v, split, size = nxt[u]
            if sum(len(units[x]) for x in current) + len(units[v]) > target.l2_chain_max_ops:
                chains.append((current, splits, sizes))
                current = [v]
                splits, sizes = [], []
            else:
                current.append(v)
                splits.append(split)
                sizes.append(size)
            u = v
        chains.append((current, splits, sizes))
    result = []
    for chain_units, splits, sizes in chains:
        if len(chain_units) < 2:
            continue
        members = [m for x in chain_units for m in units[x]]
        if not any(classify(g.nodes[m].op_type) is Kind.CONV for m in members):
            continue
        batch = batch_of(members[0])
        result.append(L2Chain(members, len(chain_units), batch, min(splits), max(sizes)))
    return result


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def estimate_ratios(
    op_type: str,
    inputs: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    duration_us: float,
    target: Target,
    itemsize: int,
) -> dict[str, float] | None:
    """Busy ratios from FLOPs and bytes against the target's peaks: estimates, not counters.
    Not capped at 1: a ratio above 1 says the target file's peak is below what this machine
    did (the report flags it)."""
    if duration_us <= 0 or not inputs or not outputs:
        return None
    seconds = duration_us * 1e-6
    out_n = _numel(outputs[0])
    mac = 0.0
    if op_type in ("Conv", "FusedConv") and len(inputs) > 1 and inputs[1]:
        mac = 2.0 * out_n * _numel(inputs[1][1:])
    elif op_type == "ConvTranspose" and len(inputs) > 1 and inputs[1]:
        mac = 2.0 * _numel(inputs[0]) * _numel(inputs[1][1:])
    elif op_type in ("MatMul", "Gemm", "FusedGemm", "FusedMatMul") and inputs[0]:
        mac = 2.0 * out_n * inputs[0][-1]
    if op_type in NO_COPY:  # a view of its input: no arithmetic, no traffic
        vec, bytes_in, bytes_out = 0.0, 0, 0
    else:
        vec = float(max([_numel(s) for s in (*inputs, *outputs)] or [0]))
        bytes_in = sum(_numel(s) for s in inputs) * itemsize
        bytes_out = sum(_numel(s) for s in outputs) * itemsize
    return {
        "mac_ratio": mac / target.peak_flops / seconds,
        "vec_ratio": vec / target.vector_flops / seconds,
        "mte2_ratio": bytes_in / target.bandwidth_bytes_per_s / seconds,
        "mte3_ratio": bytes_out / target.bandwidth_bytes_per_s / seconds,
    }
