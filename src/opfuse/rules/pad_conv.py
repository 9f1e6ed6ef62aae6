"""A constant Pad on the spatial dims merged into the pads of the Conv or pool after it.

    Conv(Pad(x, 0), pads=p)        ==> Conv(x, pads=p + pad)
    AveragePool(Pad(x, 0), pads=p) ==> AveragePool(x, pads=p + pad, count_include_pad=1)
    MaxPool(Pad(x, v), pads=p)     ==> MaxPool(x, pads=p + pad)

Conv pads with zeros, so a zero Pad merges exactly. AveragePool with
count_include_pad=1 divides by the whole window, zeros included, as it does after an
explicit Pad; when the pool has pads of its own and count_include_pad=0 it divides by
fewer elements than the explicit zeros count, which no attribute can express.

MaxPool ignores its padding (as if -inf). A Pad with value -inf merges exactly. A zero
Pad changes a window's maximum only when every real element in it is negative, so it
merges only when its input cannot be negative (Relu, Sigmoid, Abs, Exp, Softplus, Clip
with a minimum >= 0), and only when every window keeps a real element (pads smaller than
the kernel, no dilation, no ceil_mode).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, Op, Optional, PassContext, Rule, Var
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import DEFAULT_DOMAINS, attr, scalar_value

NON_NEGATIVE = frozenset({"Relu", "Sigmoid", "Abs", "Exp", "Softplus"})


def non_negative(value: ir.Value) -> bool:
    """Whether the value's producer cannot output a negative number."""
    node = value.producer()
    if node is None or node.domain not in DEFAULT_DOMAINS:
        return False
    if node.op_type in NON_NEGATIVE:
        return True
    if node.op_type == "Clip":
        low = attr(node, "min")
        if low is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            array = const_array(node.inputs[1])
            low = None if array is None else float(array.reshape(-1)[0])
        return low is not None and low >= 0
    return False


def full_pads(m: Match, x_rank: int | None) -> tuple[np.ndarray | None, str | None]:
    """The Pad's pads as [begin..., end...] over every dim of its input."""
    pad = m.node("pad")
    pads = attr(pad, "pads")
    if pads is None:
        if "pads" not in m:
            return None, "Pad has no pads"
        array = const_array(m.value("pads"))
        if array is None:
            return None, "Pad's pads are not constant"
        pads = array.reshape(-1)
    pads = np.asarray(pads, dtype=np.int64)
    if "axes" not in m:
        if len(pads) % 2 or (x_rank is not None and len(pads) != 2 * x_rank):
            return None, "Pad's pads do not match the input rank"
        return pads, None
    axes = const_array(m.value("axes"))
    if axes is None:
        return None, "Pad's axes are not constant"
    if x_rank is None:
        return None, "input rank unknown"
    axes = axes.reshape(-1)
    if len(pads) != 2 * len(axes):
        return None, "Pad's pads do not match its axes"
    full = np.zeros(2 * x_rank, dtype=np.int64)
    for i, axis in enumerate(int(a) % x_rank for a in axes):
        full[axis], full[axis + x_rank] = pads[i], pads[i + len(axes)]
    return full, None


def pad_value(m: Match) -> tuple[float | None, str | None]:
    pad = m.node("pad")
    if "value" in m:
        array = const_array(m.value("value"))
        if array is None:
            return None, "Pad's value is not constant"
        return scalar_value(array) if array.size else 0.0, None
    return float(attr(pad, "value", 0.0)), None


class PadConvRule(Rule):
    """Conv/MaxPool/AveragePool(Pad(x) on spatial dims) ==> the same op with merged pads"""

    name = "pad_conv"
    pattern = Op(
        ("Conv", "MaxPool", "AveragePool"),
        Op(
            "Pad",
            Var("x"),
            Optional(Var("pads")),
            Optional(Var("value")),
            Optional(Var("axes")),
            name="pad",
        ),
        name="op",
        variadic=True,
    )

    def merged(self, m: Match) -> tuple[list[int] | None, str | None]:
        """The op's new pads, or why the Pad cannot merge."""
        pad, op = m.node("pad"), m.root
        x = m.value("x")
        if attr(pad, "mode", "constant") != "constant":
            return None, f"Pad mode is {attr(pad, 'mode')}"
        pads, reason = full_pads(m, None if x.shape is None else len(x.shape))
        if reason or pads is None:
            return None, reason
        r = len(pads) // 2
        if r < 3:
            return None, "input has no spatial dims"
        if np.any(pads < 0):
            return None, "Pad crops (negative pads)"
        if np.any(pads[[0, 1, r, r + 1]]):
            return None, "Pad pads the batch or channel dims"
        if attr(op, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return None, f"{op.op_type} uses auto_pad={attr(op, 'auto_pad')}"
        k = r - 2
        own = attr(op, "pads") if attr(op, "auto_pad", "NOTSET") == "NOTSET" else None
        own = list(own) if own else [0] * (2 * k)
        spatial = [int(p) for p in pads[2:r]] + [int(p) for p in pads[r + 2 :]]
        return [a + b for a, b in zip(own, spatial, strict=True)], None

    def check(self, m: Match, ctx: PassContext) -> str | None:
        new_pads, reason = self.merged(m)
        if reason:
            return reason
        value, reason = pad_value(m)
        if reason:
            return reason
        op = m.root
        if op.op_type == "Conv":
            return None if value == 0 else "Pad value is not zero"
        if attr(op, "ceil_mode", 0):
            return f"{op.op_type} uses ceil_mode"
        if any(d != 1 for d in attr(op, "dilations", []) or []):
            return f"{op.op_type} is dilated"
        kernel = list(attr(op, "kernel_shape", []))
        assert new_pads is not None
        k = len(kernel)
        if any(p >= kernel[i % k] for i, p in enumerate(new_pads)):
            return "merged pads would not be smaller than the kernel"
        if op.op_type == "AveragePool":
            if value != 0:
                return "Pad value is not zero"
            own = attr(op, "pads") or []
            if any(own) and not attr(op, "count_include_pad", 0):
                return "AveragePool excludes its own padding (count_include_pad=0)"
            return None
        if len(op.outputs) > 1 and (op.outputs[1].uses() or op.outputs[1].is_graph_output()):
            return "MaxPool's Indices output is used"
        if value == -np.inf:
            return None
        if value != 0:
            return "Pad value is neither zero nor -inf"
        if not non_negative(m.value("x")):
            return "MaxPool pads with -inf: a zero Pad is exact only on a non-negative input"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        op = m.root
        new_pads, _ = self.merged(m)
        attrs: dict[str, object] = {k: a for k, a in op.attributes.items() if k != "auto_pad"}
        attrs["pads"] = new_pads
        if op.op_type == "AveragePool":
            attrs["count_include_pad"] = 1
        node = b.node(
            op.op_type,
            [m.value("x"), *op.inputs[1:]],
            attrs,
            num_outputs=len(op.outputs),
            like=op,
        )
        return list(node.outputs)


register(
    PassInfo(
        "PadConvFusionPass",
        "Merge a constant Pad on spatial dims into the pads of the Conv, MaxPool or "
        "AveragePool after it (only where exact)",
        rules=(PadConvRule(),),
    )
)
