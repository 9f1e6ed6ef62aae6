"""Consecutive Slices with constant parameters become one Slice: on distinct axes their
parameters are concatenated (YOLOX's Focus: x[..., ::2, :][..., ::2]); on a shared axis
of known size the two index progressions compose into one (a slice of an arithmetic
progression is an arithmetic progression). Exact: the same elements in the same order."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Const, Match, Op, Optional, PassContext, Rule, Var
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import rank

BEFORE_START = -(2**62)  # an end that, with a negative step, runs past index 0

Params = dict[int, tuple[int, int, int]]  # axis -> (start, end, step)


def _params(m: Match, s: str, e: str, a: str, p: str, r: int | None) -> Params | str:
    starts = [int(v) for v in m[s].reshape(-1)]
    ends = [int(v) for v in m[e].reshape(-1)]
    axes_array = m.get(a)
    axes = (
        list(range(len(starts))) if axes_array is None else [int(v) for v in axes_array.reshape(-1)]
    )
    steps_array = m.get(p)
    steps = [1] * len(starts) if steps_array is None else [int(v) for v in steps_array.reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return "the Slice parameters differ in length"
    if any(ax < 0 for ax in axes):
        if r is None:
            return "negative axes of a tensor of unknown rank"
        axes = [ax % r for ax in axes]
    if len(set(axes)) != len(axes):
        return "an axis is sliced twice by one Slice"
    return {ax: (st, en, sp) for ax, st, en, sp in zip(axes, starts, ends, steps, strict=True)}


def _compose(
    dim: int, inner: tuple[int, int, int], outer: tuple[int, int, int]
) -> tuple[int, int, int]:
    """One (start, end, step) selecting what ``outer`` selects of what ``inner`` selects
    on an axis of size ``dim`` (ONNX clamps starts and ends as Python slices do)."""
    picked = list(range(dim))[slice(*inner)][slice(*outer)]
    if not picked:
        return 0, 0, 1
    step = picked[1] - picked[0] if len(picked) > 1 else 1
    end = picked[-1] + step
    return picked[0], (BEFORE_START if end < 0 else end), step


class SliceChainRule(Rule):
    """Slice(Slice(x, s1, e1, a1, p1), s2, e2, a2, p2) ==> Slice(x, s, e, a, p)"""

    name = "slice_chain"
    pattern = Op(
        "Slice",
        Op(
            "Slice",
            Var("x"),
            Const("s1"),
            Const("e1"),
            Optional(Const("a1")),
            Optional(Const("p1")),
            name="inner",
        ),
        Const("s2"),
        Const("e2"),
        Optional(Const("a2")),
        Optional(Const("p2")),
    )

    def _merged(self, m: Match) -> Params | str:
        x = m.value("x")
        r = rank(x)
        first = _params(m, "s1", "e1", "a1", "p1", r)
        second = _params(m, "s2", "e2", "a2", "p2", r)
        if isinstance(first, str) or isinstance(second, str):
            return first if isinstance(first, str) else second
        merged = dict(first)
        for axis, outer in second.items():
            if axis not in first:
                merged[axis] = outer
                continue
            dim = x.shape[axis] if x.shape is not None and axis < len(x.shape) else None
            if not isinstance(dim, int):
                return "both Slices cut an axis whose size is not known"
            if 0 in (first[axis][2], outer[2]):
                return "a step is 0"
            merged[axis] = _compose(dim, first[axis], outer)
        return merged

    def check(self, m: Match, ctx: PassContext) -> str | None:
        merged = self._merged(m)
        return merged if isinstance(merged, str) else None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        merged = self._merged(m)
        assert not isinstance(merged, str)
        axes = sorted(merged)
        starts, ends, steps = ([merged[a][k] for a in axes] for k in range(3))
        base = m.root.name or "slice"
        inputs: list[ir.Value | None] = [m.value("x")]
        for values, suffix in (
            (starts, "starts"),
            (ends, "ends"),
            (axes, "axes"),
            (steps, "steps"),
        ):
            inputs.append(b.const(np.array(values, dtype=np.int64), f"{base}_{suffix}"))
        return [b.op("Slice", inputs, like=m.root)]


register(
    PassInfo(
        "SliceMergeFusionPass",
        "Merge consecutive Slices with constant parameters into one (distinct axes "
        "concatenated, a shared axis of known size composed)",
        opset_min=10,
        rules=(SliceChainRule(),),
    )
)
