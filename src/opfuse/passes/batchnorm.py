"""BatchNormalization folded into the linear layer before it.

    y = gamma * (conv(x, W) + b - mean) / sqrt(var + eps) + beta
      = conv(x, W * s) + (b - mean) * s + beta,        s = gamma / sqrt(var + eps)

with s applied per output channel. Arithmetic is done in float64 and cast back once.
"""

from __future__ import annotations

import numpy as np

from opfuse.passes._util import attr
from opfuse.registry import PassInfo, register
from opfuse.rewrite import Builder, Match, Op, Optional, PassContext, Rule, Var

BN_PARAMS = ("scale", "bias", "mean", "var")


def bn_affine(m: Match, bn: str = "bn") -> tuple[np.ndarray, np.ndarray]:
    """The per-channel (s, t) with BN(y) = s * y + t, in float64."""
    eps = float(m.attr(bn, "epsilon", 1e-5))
    scale, bias, mean, var = (m[k].astype(np.float64) for k in BN_PARAMS)
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


def bn_check(m: Match, ctx: PassContext, bn: str = "bn") -> str | None:
    """Why a matched BatchNormalization cannot be folded, or None."""
    node = m.node(bn)
    if m.attr(bn, "training_mode", 0):
        return "BatchNormalization is in training mode"
    if ctx.opset < 9 and m.attr(bn, "spatial", 1) == 0:
        return "BatchNormalization is not spatial (per-element statistics)"
    if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
        return "BatchNormalization's running statistics outputs are used"
    shapes = {m[k].shape for k in BN_PARAMS}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        return "BatchNormalization parameters are not 1-D of one length"
    return None


def scale_out_channels(w: np.ndarray, s: np.ndarray, transposed: bool, group: int) -> np.ndarray:
    """Multiply a Conv (or ConvTranspose) weight by s along its output channels."""
    if not transposed:
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))
    c_in, m_per_group = w.shape[0], w.shape[1]
    grouped = w.reshape((group, c_in // group, m_per_group) + w.shape[2:])
    factors = s.reshape((group, 1, m_per_group) + (1,) * (w.ndim - 2))
    return (grouped * factors).reshape(w.shape)


def out_channels(w: np.ndarray, transposed: bool, group: int) -> int:
    return int(w.shape[1] * group) if transposed else int(w.shape[0])


class ConvBatchNormRule(Rule):
    """Conv/ConvTranspose(x, W, b) -> BatchNormalization ==> Conv(x, W*s, (b-mean)*s + beta)"""

    name = "conv_bn"
    pattern = Op(
        "BatchNormalization",
        Op(("Conv", "ConvTranspose"), Var("x"), Var("w"), Optional(Var("b")), name="conv"),
        Var("scale"),
        Var("bias"),
        Var("mean"),
        Var("var"),
        name="bn",
    )
    constants = ("w", "b", *BN_PARAMS)

    def check(self, m: Match, ctx: PassContext) -> str | None:
        reason = bn_check(m, ctx)
        if reason:
            return reason
        conv = m.node("conv")
        transposed = conv.op_type == "ConvTranspose"
        group = int(attr(conv, "group", 1))
        if out_channels(m["w"], transposed, group) != m["scale"].shape[0]:
            return "BatchNormalization channels differ from the convolution's outputs"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        conv = m.node("conv")
        transposed = conv.op_type == "ConvTranspose"
        group = int(attr(conv, "group", 1))
        w = m["w"]
        s, t = bn_affine(m)
        bias = m["b"].astype(np.float64) if "b" in m.consts else np.zeros_like(s)
        new_w = scale_out_channels(w.astype(np.float64), s, transposed, group).astype(w.dtype)
        new_b = (bias * s + t).astype(w.dtype)
        attrs = {k: a for k, a in conv.attributes.items()}
        out = b.op(
            conv.op_type,
            [
                m.value("x"),
                b.const(new_w, f"{conv.name or 'conv'}.weight_bn"),
                b.const(new_b, f"{conv.name or 'conv'}.bias_bn"),
            ],
            attrs,
            like=conv,
        )
        return [out]


register(
    PassInfo(
        "ConvBatchNormFusionPass",
        "Fold inference BatchNormalization into the Conv/ConvTranspose before it "
        "(plain, depthwise, grouped)",
        rules=(ConvBatchNormRule(),),
    )
)
