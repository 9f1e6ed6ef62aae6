"""BatchNormalization folded into the linear layer before it (Conv, ConvTranspose;
MatMul, Gemm when BN's channel axis 1 is the weight's output axis, i.e. a rank-2 output).

    y = gamma * (conv(x, W) + b - mean) / sqrt(var + eps) + beta
      = conv(x, W * s) + (b - mean) * s + beta,        s = gamma / sqrt(var + eps)

with s applied per output channel.

float32 and float64 folds use onnxruntime's own arithmetic (its ConvBNFusion and
MatMulBNFusion at load time): every step in the parameters' dtype, in its order,

    s = scale / sqrt(var + eps);  W' = W * s;  b' = (b - mean) * s + beta  (or beta - mean * s)

so where onnxruntime folds the same BatchNormalization, the optimized model is
bit-identical to the original under its default optimizations. Other dtypes (float16)
are folded in float64 and rounded once.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, Op, Optional, PassContext, Rule, Var
from opfuse.rewrite.builder import drop_pages
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._affine import (
    Linear,
    find_linear,
    fold,
    linear_reason,
    out_channels,
    producer,
    scale_out_channels,
)
from opfuse.rules._util import attr

BN_PARAMS = ("scale", "bias", "mean", "var")
ORT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # folded as onnxruntime does


def ort_arithmetic(m: Match, *keys: str) -> np.dtype | None:
    """The dtype to fold in with onnxruntime's arithmetic: that of the BN parameters and
    the constants ``keys`` when they all share a float32/float64 dtype, else None."""
    dtypes = {m[k].dtype for k in (*BN_PARAMS, *keys) if k in m.consts}
    dtype = next(iter(dtypes)) if len(dtypes) == 1 else None
    return dtype if dtype in ORT_DTYPES else None


def bn_affine(m: Match, bn: str = "bn") -> tuple[np.ndarray, np.ndarray]:
    """The per-channel (s, t) with BN(y) = s * y + t: in the parameters' dtype with
    onnxruntime's steps for float32/float64 (see the module docstring), else float64."""
    eps = float(m.attr(bn, "epsilon", 1e-5))
    dtype = ort_arithmetic(m) or np.dtype(np.float64)
    scale, bias, mean, var = (m[k].astype(dtype, copy=False) for k in BN_PARAMS)
    s = scale / np.sqrt(var + dtype.type(eps))
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


def scaled_weight(w: np.ndarray, s: np.ndarray, transposed: bool, group: int) -> np.ndarray:
    """W * s along the output channels in float64, a block of channels at a time, so a
    large (memory-mapped) weight never gets a whole float64 copy."""
    if transposed:
        return scale_out_channels(w.astype(np.float64), s, True, group).astype(w.dtype)
    out = np.empty(w.shape, w.dtype)
    step = max(1, (1 << 22) // max(1, w[0].size))
    for i in range(0, w.shape[0], step):
        out[i : i + step] = scale_out_channels(
            w[i : i + step].astype(np.float64), s[i : i + step], False, 1
        )
    return out


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
        if ort_arithmetic(m, "w", "b") is not None:  # onnxruntime's steps, in w's dtype
            new_w = scale_out_channels(w, s, transposed, group)
            new_b = (m["b"] - m["mean"]) * s + m["bias"] if "b" in m.consts else t
        else:
            bias = m["b"].astype(np.float64) if "b" in m.consts else np.zeros_like(s)
            new_w = scaled_weight(w, s.astype(np.float64), transposed, group)
            new_b = (bias * s + t).astype(w.dtype)
        drop_pages(m.value("w"))  # a large external weight was read once: unmap its pages
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


def identity_reshape(reshape: ir.Node) -> bool:
    """Whether a Reshape's output shape provably equals its input's (the second Reshape
    of the compression toolkit's Reshape -> MatMul -> Reshape -> BN sandwich)."""
    x = reshape.inputs[0]
    target_value = reshape.inputs[1] if len(reshape.inputs) > 1 else None
    target = const_array(target_value)
    if x is None or x.shape is None or target is None:
        return False
    dims, wanted = list(x.shape), [int(d) for d in target.reshape(-1)]
    allowzero = bool(attr(reshape, "allowzero", 0))
    if len(dims) != len(wanted):
        return False
    unresolved = []
    for i, (d, w) in enumerate(zip(dims, wanted, strict=True)):
        if (w == 0 and not allowzero) or (isinstance(d, int) and w == d):
            continue
        unresolved.append((i, w))
    # a single -1 takes whatever is left, which is its own dim when all others match
    return not unresolved or (len(unresolved) == 1 and unresolved[0][1] == -1)


class LinearBnMatch(Match):
    linear: Linear | str  # the MatMul/Gemm before the BN, or why it is not one

    def covered(self) -> list[ir.Node]:
        lin = self.linear
        extra = [lin.node, *lin.nodes] if isinstance(lin, Linear) else []
        return list(dict.fromkeys([*super().covered(), *extra]))


class MatMulBatchNormRule(Rule[LinearBnMatch]):
    """[Reshape(] MatMul/Gemm(x, W) [+ b] [)] -> BatchNormalization
    ==> MatMul/Gemm(x, W*s) + (b - mean)*s + beta, when BN's axis 1 is the weight's
    output axis (rank-2 output, or a Transpose that puts it there)"""

    name = "matmul_bn"
    roots = ("BatchNormalization",)

    # imperative: find_linear walks an optional Transpose and bias Add to the layer
    def match(self, node: ir.Node, ctx: PassContext) -> LinearBnMatch | None:
        if len(node.inputs) != 5 or node.inputs[0] is None:
            return None
        m = LinearBnMatch(node)
        m.nodes.append(node)
        m.node_names["bn"] = node
        for key, value in zip(BN_PARAMS, node.inputs[1:], strict=True):
            assert value is not None
            m.values[key] = value
        value = node.inputs[0]
        reshape = producer(value, "Reshape")
        if reshape is not None and reshape.inputs[0] is not None:
            m.nodes.append(reshape)
            m.node_names["reshape"] = reshape
            value = reshape.inputs[0]
        lin = find_linear(value, ("MatMul", "Gemm"))
        if lin is None:
            return None
        m.linear = lin
        return m

    constants = BN_PARAMS

    def check(self, m: LinearBnMatch, ctx: PassContext) -> str | None:
        reason = bn_check(m, ctx)
        if reason:
            return reason
        if "reshape" in m.node_names and not identity_reshape(m.node("reshape")):
            return "the Reshape between the MatMul and the BatchNormalization changes the shape"
        lin = m.linear
        if isinstance(lin, str):
            return lin
        if lin.axis != 1:
            return (
                f"BatchNormalization normalizes axis 1 of the rank-{lin.rank} {lin.node.op_type} "
                f"output; the weight's output axis is axis {lin.axis}"
            )
        if lin.channels != m["scale"].shape[0]:
            return f"BatchNormalization channels differ from the {lin.node.op_type}'s outputs"
        return linear_reason(m, lin, [(lin.channels,) + (1,) * (lin.rank - 2)])

    def rewrite(self, m: LinearBnMatch, b: Builder, ctx: PassContext):
        lin = m.linear
        assert isinstance(lin, Linear)
        s, t = bn_affine(m)
        out = fold(lin, b, s, t)
        if "reshape" in m.node_names:
            reshape = m.node("reshape")
            attrs = dict(reshape.attributes.items())
            out = b.op("Reshape", [out, reshape.inputs[1]], attrs, like=reshape)
        return [out]


register(
    PassInfo(
        "ConvBatchNormFusionPass",
        "Fold inference BatchNormalization into the Conv/ConvTranspose before it "
        "(plain, depthwise, grouped)",
        rules=(ConvBatchNormRule(),),
    )
)
register(
    PassInfo(
        "MatMulBatchNormFusionPass",
        "Fold inference BatchNormalization into the MatMul/Gemm (+ bias Add) before it, "
        "also through an identity Reshape (Reshape -> MatMul -> Reshape -> BN), when BN's "
        "channel axis is the weight's output axis",
        rules=(MatMulBatchNormRule(),),
    )
)
