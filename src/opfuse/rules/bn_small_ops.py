"""BatchNorm written out in small ops (Keras ``fused=False``, TF exports), put back
together (BatchNormSmallOpsFusionPass).

A chain of two or more elementwise Add/Sub/Mul/Div ops, each with a finite constant
that broadcasts per channel (NCHW ``[1,C,1,1]``/``[C,1,1]`` or NHWC ``[1,1,1,C]``/``[C]``,
scalars allowed), is one affine map ``y = s * x + t``:

    (x - mean) * (gamma / sqrt(var + eps)) + beta      Sub, Mul, Add
    x * scale + shift                                   the already-folded form
    (x - mean) / sqrt(var + eps) [* gamma] [+ beta]     without scale / without center

computed in float64 from the constants. It then becomes, in order of preference:

1. part of the linear layer before it (Conv/ConvTranspose/Gemm/MatMul with constant
   weights, also through the Transpose an NHWC export puts after a Conv: the channel
   axis is found through the permutation, and the layer's weight and bias absorb s, t);
2. one BatchNormalization(scale=s, bias=t, mean=0, var=1, epsilon=0) when the channels
   are axis 1 (opset >= 9);
3. one Mul + Add (three or more ops only: a two-op chain is already that short).

Exact in real arithmetic; in floating point the constants are combined once, so the
results may differ from the op-by-op evaluation in the last ulps (as a folded BN does).
"""

from __future__ import annotations

import numpy as np

from opfuse.rewrite import Builder, PassContext
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._affine import (
    AffineChainRule,
    ChainMatch,
    body_of,
    channel_axis,
    fold_chain,
    linear_reason,
)
from opfuse.rules._util import rank


def bn_axis_ok(m: ChainMatch, ctx: PassContext) -> bool:
    """Whether the chain is per channel of axis 1 (a BatchNormalization can hold it)."""
    x_rank = rank(m.chain.x)
    found = channel_axis(m.chain.shapes)
    if ctx.opset < 9 or x_rank is None or x_rank < 2 or isinstance(found, str):
        return False
    neg, length = found
    assert m.chain.x.shape is not None
    return (
        length > 1
        and x_rank + neg == 1
        and m.chain.x.shape[1] == length  # else the constants would broadcast x up
        and all(len(s) <= x_rank for s in m.chain.shapes)
    )


class SmallOpsMatch(ChainMatch):
    mode: str = "fold"  # the check's choice: "fold" into the layer, one "bn", or "muladd"


class BatchNormSmallOpsRule(AffineChainRule[SmallOpsMatch]):
    """(x - mean) * k + beta and kin (2+ per-channel affine ops) ==> the linear layer
    before it, or one BatchNormalization, or one Mul + Add"""

    name = "bn_small_ops"
    match_type = SmallOpsMatch

    def accepts(self, m: SmallOpsMatch) -> bool:
        return len(body_of(m)) >= 2

    def check(self, m: SmallOpsMatch, ctx: PassContext) -> str | None:
        reason = linear_reason(m, m.linear, m.chain.shapes)
        m.mode = "fold"
        if reason is None:
            return None
        if bn_axis_ok(m, ctx):
            m.mode = "bn"
        elif len(m.chain.steps) >= 3:
            m.mode = "muladd"
        else:
            return f"{reason}; the two ops are already one Mul + Add at most"
        return None

    def rewrite(self, m: SmallOpsMatch, b: Builder, ctx: PassContext):
        mode = m.mode
        if mode == "fold":
            return [fold_chain(m, b)]
        x = m.chain.x
        dtype = x.dtype.numpy() if x.dtype is not None else m.chain.steps[0].const.dtype
        root = m.root
        if mode == "bn":
            found = channel_axis(m.chain.shapes)
            assert not isinstance(found, str)
            channels = found[1]
            s = np.broadcast_to(m.chain.s.reshape(-1), (channels,)).astype(dtype)
            t = np.broadcast_to(m.chain.t.reshape(-1), (channels,)).astype(dtype)
            name = root.name or "bn"
            inputs = [
                x,
                b.const(s, f"{name}.scale"),
                b.const(t, f"{name}.bias"),
                b.const(np.zeros_like(s), f"{name}.mean"),
                b.const(np.ones_like(s), f"{name}.var"),
            ]
            return [b.op("BatchNormalization", inputs, {"epsilon": 0.0}, like=root)]
        shape = np.broadcast_shapes(*m.chain.shapes)
        s = np.broadcast_to(m.chain.s, shape)
        t = np.broadcast_to(m.chain.t, shape)
        out, shift = x, bool(np.any(t != 0))
        name = root.name or "affine"
        if np.any(s != 1) or not shift:  # an identity chain keeps one Mul (its broadcast)
            out = b.op("Mul", [out, b.const(s.astype(dtype), f"{name}.scale")])
        if shift:
            out = b.op("Add", [out, b.const(t.astype(dtype), f"{name}.shift")], like=root)
        return [out]


register(
    PassInfo(
        "BatchNormSmallOpsFusionPass",
        "Fold BatchNorm written as Sub/Mul/Add/Div small ops with per-channel constants "
        "(NCHW or NHWC) into the Conv/MatMul/Gemm before it (also across its Transpose), "
        "else into one BatchNormalization or one Mul + Add",
        rules=(BatchNormSmallOpsRule(),),
    )
)
