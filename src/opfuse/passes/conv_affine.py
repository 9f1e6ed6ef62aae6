"""Affine ops folded into the linear layer next to them (the compression toolkit's
OP+(BiasAdd)+Mul, CANN's MatMulBiasAdd, Grappler's ``ConvND(c1 * x, c2)``).

After a layer (Conv, ConvTranspose, Gemm, MatMul with a constant weight, optionally
through one Transpose that moves the channel axis, as NHWC exports have):

    Mul(L(x), c)  ==>  L'(x), W' = W * c, b' = b * c   (c a scalar or per output channel)
    Add(L(x), c)  ==>  L'(x), b' = b + c                (Conv/ConvTranspose/Gemm, or a
                                                          MatMul that already has a bias Add)

A single op only: chains of two or more such ops are BatchNormSmallOpsFusionPass's.
Exact in real arithmetic; in floating point the products are rounded once in another
order, so results can differ in the last ulps (as for every BatchNorm fold).

    Add(MatMul(A[M,K], B[K,N]), C)  ==>  Gemm(A, B, C)  (C broadcasts to [M, N])

Before the layer:

    Conv(Mul(x, c), W)  ==>  Conv(x, W * c)   (c a scalar or per input channel)

is exact with any padding: the padded border is zero, and c * 0 = 0 for finite c, so
scaling the input before padding equals scaling after it. The same holds for
MatMul/Gemm with c along the reduced axis K.

    Conv(Add(x, c), W, B)  ==>  Conv(x, W, B + sum(W * c))   (c a scalar or per input channel)

only when the Conv pads nothing (zero pads, or 1x1 kernels): a padded border would have
to hold c, not 0. With the Mul rule, a per-channel Mul then Add in front of such a Conv
(PaddleOCR's normalization) folds completely.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.passes._affine import (
    ChainMatch,
    affine_step,
    body_of,
    continues_chain,
    fold_chain,
    linear_reason,
    match_chain,
    per_channel,
    producer,
)
from opfuse.passes._util import attr, gelu_product, rank
from opfuse.registry import PassInfo, register
from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import const_array


class _SingleStepRule(Rule[ChainMatch]):
    """One affine op after a linear layer, folded into it."""

    kinds: tuple[str, ...] = ()
    roots = ("Add", "Sub", "Mul", "Div")

    # imperative: the same chain walk as BatchNormSmallOpsRule (chain_ending_at)
    def match(self, node: ir.Node, ctx: PassContext) -> ChainMatch | None:
        m = match_chain(node, ChainMatch)
        if m is None or m.linear is None:
            return None
        body = body_of(m)
        if len(body) != 1 or body[0].kind not in self.kinds:
            return None
        return m if self.accepts(m, body) else None

    def accepts(self, m: ChainMatch, body: list) -> bool:
        return True

    def check(self, m: ChainMatch, ctx: PassContext) -> str | None:
        return linear_reason(m, m.linear, m.chain.shapes)

    def rewrite(self, m: ChainMatch, b: Builder, ctx: PassContext):
        return [fold_chain(m, b)]


class ConvMulRule(_SingleStepRule):
    """Mul(L(x) [+ bias], c) ==> L'(x) with W*c, bias*c (c scalar or per output channel)"""

    name = "conv_mul"
    kinds = ("mul", "div", "rsub")


class ConvAddRule(_SingleStepRule):
    """Add(L(x), c) ==> L'(x) with bias + c (c scalar or per output channel)"""

    name = "conv_add"
    kinds = ("add", "sub")

    def accepts(self, m: ChainMatch, body: list) -> bool:
        # a bare MatMul + Add has no bias to merge into: that is MatMulBiasAdd's Gemm
        return not (len(body) == len(m.chain.steps) and producer(m.chain.x, "MatMul") is not None)


def _dims_broadcast(c_shape: ir.Shape, out: list) -> bool:
    """Whether a value of ``c_shape`` broadcasts to ``out`` without growing it."""
    if len(c_shape) > len(out):
        return False
    for d, o in zip(reversed(list(c_shape)), reversed(out), strict=False):
        if d != 1 and d != o:
            return False
    return True


class MatMulBiasAddRule(Rule):
    """Add(MatMul(A[M,K], B[K,N]), C) ==> Gemm(A, B, C) when C broadcasts to [M, N]"""

    name = "matmul_bias_add"
    roots = ("Add",)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        if len(node.inputs) != 2 or any(v is None for v in node.inputs):
            return None
        a, c = node.inputs
        mm = producer(a, "MatMul")
        if mm is None:
            a, c = c, a
            mm = producer(a, "MatMul")
        if mm is None or len(mm.inputs) != 2:
            return None
        if continues_chain(node):
            return None  # a BatchNorm-like chain continues after it; it folds as a whole
        m = Match(node)
        m.nodes += [node, mm]
        m.node_names.update(add=node, matmul=mm)
        assert mm.inputs[0] is not None and mm.inputs[1] is not None and c is not None
        m.values.update(a=mm.inputs[0], b=mm.inputs[1], c=c)
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        a, b, c = m.value("a"), m.value("b"), m.value("c")
        dtype = m.root.outputs[0].dtype
        if dtype is None or not dtype.is_floating_point():
            return "output is not floating point"
        if rank(a) != 2 or rank(b) != 2:
            return "MatMul operands are not both 2-D"
        if c.shape is None:
            return "bias shape is unknown"
        assert a.shape is not None and b.shape is not None
        if not _dims_broadcast(c.shape, [a.shape[0], b.shape[1]]):
            return "bias does not broadcast to the MatMul output [M, N]"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        inputs = [m.value("a"), m.value("b"), m.value("c")]
        return [b.op("Gemm", inputs, like=m.node("matmul"))]


def input_scale(node: ir.Node, w: np.ndarray, c: np.ndarray) -> np.ndarray | None:
    """W * c for c per input channel of Conv/MatMul/Gemm (``c`` a vector), or None."""
    if node.op_type == "Conv":
        group = int(attr(node, "group", 1))
        m_out, cin_g = w.shape[0], w.shape[1]
        if m_out % group:
            return None
        idx = (np.arange(m_out) // (m_out // group))[:, None] * cin_g + np.arange(cin_g)[None, :]
        return w * c[idx].reshape((m_out, cin_g) + (1,) * (w.ndim - 2))
    if node.op_type == "Gemm" and attr(node, "transB", 0):
        return w * c[None, :]
    return w * c[:, None]  # MatMul [..., K, N], Gemm [K, N]


class MulConvRule(Rule):
    """Conv(Mul(x, c), W) ==> Conv(x, W * c) for c scalar or per input channel (also
    MatMul/Gemm with c along K)"""

    name = "mul_conv"
    roots = ("Conv", "MatMul", "Gemm")
    constants = ("w",)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        if len(node.inputs) < 2:
            return None
        mul = producer(node.inputs[0], "Mul")
        step = affine_step(mul) if mul is not None else None
        if mul is None or step is None or step.kind != "mul":
            return None
        m = Match(node)
        m.nodes += [node, mul]
        m.node_names.update(layer=node, mul=mul)
        if node.inputs[1] is None:
            return None
        m.values.update(x=step.x, w=node.inputs[1])
        m.consts["c"] = step.const
        return m

    def _channels(self, m: Match) -> tuple[int, int, int] | str:
        """(input rank, input-channel axis, input channels) of the layer."""
        node, w = m.node("layer"), m["w"]
        if node.op_type == "Conv":
            return w.ndim, 1, int(w.shape[1]) * int(attr(node, "group", 1))
        if node.op_type == "Gemm":
            if attr(node, "transA", 0):
                return "Gemm transposes A"
            return 2, 1, int(w.shape[1] if attr(node, "transB", 0) else w.shape[0])
        x_rank = rank(m.value("x"))
        if w.ndim < 2:
            return "MatMul weight is a vector"
        if x_rank is None or x_rank < 2:
            return "MatMul input rank is unknown"
        return x_rank, x_rank - 1, int(w.shape[-2])

    def check(self, m: Match, ctx: PassContext) -> str | None:
        w = m["w"]
        if not np.issubdtype(w.dtype, np.floating):
            return "weight is not floating point"
        if gelu_product(m.node("mul")):
            return "the Mul is part of a GELU, which onnxruntime fuses into one kernel"
        found = self._channels(m)
        if isinstance(found, str):
            return found
        x_rank, axis, channels = found
        x = m.value("x")
        if x.shape is None or len(x.shape) != x_rank or x.shape[axis] != channels:
            return "the Mul may broadcast its input up (input shape unknown or smaller)"
        return per_channel([tuple(m["c"].shape)], x_rank, axis, channels)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        node, w = m.node("layer"), m["w"]
        found = self._channels(m)
        assert not isinstance(found, str)
        c = np.broadcast_to(m["c"].astype(np.float64).reshape(-1), (found[2],))
        new_w = input_scale(node, w.astype(np.float64), c)
        assert new_w is not None
        name = node.name or node.op_type.lower()
        inputs: list[ir.Value | None] = [m.value("x")]
        inputs += [b.const(new_w.astype(w.dtype), f"{name}.weight_in_scaled"), *node.inputs[2:]]
        return [b.op(node.op_type, inputs, dict(node.attributes.items()), like=node)]


def _pads_nothing(node: ir.Node, kernel: tuple[int, ...]) -> bool:
    """No padded border: zero (or no) pads, or 1x1 kernels (SAME adds no border then)."""
    auto_pad = attr(node, "auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return all(k == 1 for k in kernel)
    return not any(attr(node, "pads", None) or [])


class AddConvRule(Rule):
    """Conv(Add(x, c), W, B) ==> Conv(x, W, B + sum(W * c)) for c a scalar or per input
    channel (Sub: -c), when the Conv pads nothing: every output reads only real inputs,
    each shifted by c."""

    name = "add_conv"
    roots = ("Conv",)
    constants = ("w",)

    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        if len(node.inputs) < 2 or node.inputs[1] is None:
            return None
        add = producer(node.inputs[0], "Add", "Sub")
        step = affine_step(add) if add is not None else None
        if add is None or step is None or step.kind not in ("add", "sub"):
            return None
        m = Match(node)
        m.nodes += [node, add]
        m.node_names.update(layer=node, add=add)
        m.values.update(x=step.x, w=node.inputs[1])
        m.consts["c"] = step.const if step.kind == "add" else -step.const
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            m.values["bias"] = node.inputs[2]
        return m

    def check(self, m: Match, ctx: PassContext) -> str | None:
        node, w = m.node("layer"), m["w"]
        if not np.issubdtype(w.dtype, np.floating):
            return "weight is not floating point"
        if "bias" in m.values and const_array(m.value("bias")) is None:
            return "the Conv bias is not a constant"
        if not _pads_nothing(node, tuple(w.shape[2:])):
            return "the Conv pads: its zero border would have to hold the shift"
        channels = int(w.shape[1]) * int(attr(node, "group", 1))
        x = m.value("x")
        if x.shape is None or len(x.shape) != w.ndim or x.shape[1] != channels:
            return "the Add may broadcast its input up (input shape unknown or smaller)"
        return per_channel([tuple(m["c"].shape)], w.ndim, 1, channels)

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        node, w = m.node("layer"), m["w"]
        channels = int(w.shape[1]) * int(attr(node, "group", 1))
        c = np.broadcast_to(m["c"].astype(np.float64).reshape(-1), (channels,))
        shifted = input_scale(node, w.astype(np.float64), c)
        assert shifted is not None
        bias = const_array(m.value("bias")) if "bias" in m.values else None
        base = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
        new_b = base + shifted.sum(axis=tuple(range(1, w.ndim)))
        name = node.name or "conv"
        inputs = [
            m.value("x"),
            node.inputs[1],
            b.const(new_b.astype(w.dtype), f"{name}.bias_shifted"),
        ]
        return [b.op("Conv", inputs, dict(node.attributes.items()), like=node)]


register(
    PassInfo(
        "ConvMulFusionPass",
        "Fold a Mul by a scalar or per-channel constant into the Conv/ConvTranspose/Gemm/"
        "MatMul (+ bias Add) before it (output channels) or after it (input channels)",
        rules=(ConvMulRule(), MulConvRule()),
    )
)
register(
    PassInfo(
        "ConvAddFusionPass",
        "Fold an Add/Sub of a scalar or per-channel constant after a Conv/ConvTranspose/"
        "Gemm (or a MatMul's bias Add) into its bias, or before a Conv that pads nothing",
        rules=(ConvAddRule(), AddConvRule()),
    )
)
register(
    PassInfo(
        "MatMulBiasAddFusionPass",
        "Turn a 2-D MatMul followed by an Add of a bias broadcasting to its output into Gemm",
        opset_min=7,
        rules=(MatMulBiasAddRule(),),
    )
)
