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

from opfuse.rewrite import Builder, Const, Match, Op, Optional, Or, PassContext, Rule, Var
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._affine import (
    AffineChainRule,
    ChainMatch,
    body_of,
    continues_chain,
    fold_chain,
    linear_reason,
    per_channel,
    producer,
)
from opfuse.rules._util import attr, gelu_product, rank


class _SingleStepRule(AffineChainRule[ChainMatch]):
    """One affine op after a linear layer, folded into it."""

    kinds: tuple[str, ...] = ()
    match_type = ChainMatch

    def accepts(self, m: ChainMatch) -> bool:
        if m.linear is None:
            return False
        body = body_of(m)
        return len(body) == 1 and body[0].kind in self.kinds and self.takes(m, body)

    def takes(self, m: ChainMatch, body: list) -> bool:
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

    def takes(self, m: ChainMatch, body: list) -> bool:
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
    pattern = Op(
        "Add",  # either order
        Op("MatMul", Var("a"), Var("b"), name="matmul"),
        Var("c"),
        name="add",
        # a BatchNorm-like chain continues after it: it folds as a whole
        where=lambda node: not continues_chain(node),
    )

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


def _finite_float(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.floating) and bool(np.all(np.isfinite(array)))


def _float_output(node: ir.Node) -> bool:
    dtype = node.outputs[0].dtype
    return dtype is None or dtype.is_floating_point()


# x op c with one finite float constant (affine_step's steps, spelled as operands)
X = Var("x", constant=False)
C = Const("c", where=_finite_float)


class MulConvRule(Rule):
    """Conv(Mul(x, c), W) ==> Conv(x, W * c) for c scalar or per input channel (also
    MatMul/Gemm with c along K)"""

    name = "mul_conv"
    pattern = Op(
        ("Conv", "MatMul", "Gemm"),
        Op("Mul", X, C, name="mul", where=_float_output),
        Var("w"),
        name="layer",
        variadic=True,
    )
    constants = ("w",)

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
    pattern = Op(
        "Conv",
        Or(
            Op("Add", X, C, name="add", where=_float_output),  # either order
            Op("Sub", X, C, name="add", where=_float_output),  # x - c, not c - x
        ),
        Var("w"),
        Optional(Var("bias")),
        name="layer",
    )
    constants = ("w",)

    @staticmethod
    def shift(m: Match) -> np.ndarray:
        """The constant the Add adds (Sub: its negation)."""
        return m["c"] if m.node("add").op_type == "Add" else -m["c"]

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
        return per_channel([tuple(m["c"].shape)], w.ndim, 1, channels)  # shift's shape

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        node, w = m.node("layer"), m["w"]
        channels = int(w.shape[1]) * int(attr(node, "group", 1))
        c = np.broadcast_to(self.shift(m).astype(np.float64).reshape(-1), (channels,))
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
