"""QuantizeLinear(move(DequantizeLinear(x))) ==> move(x) (QDQMovementFusionPass): a
quantized tensor dequantized only to be reshaped, transposed, sliced... and quantized again
with the same scale and zero point is moved in its integer type instead.

Exact: ``move`` only rearranges or selects elements, so ``Q(move(v)) = move(Q(v))``, and
``Q(DQ(x)) = x`` when both use one scale s and zero point z: ``DQ(x) = (x - z) * s`` in
float32 and ``round(((x - z) * s) / s) + z`` recovers x, the float error of two operations
on an integer of at most 65535 being far below the 0.5 that rounding forgives. Only
per-tensor (scalar) parameters are matched (a per-axis scale would have to follow the
axis through the move), and only when x's type is the QuantizeLinear's output type.

Off by default in ``optimize`` (a QDQ model's Q/DQ placement may be meant for the compiler
it targets; onnxruntime drops these pairs itself at load); ``opfuse quantize`` runs it in
its clean-up.
"""

from __future__ import annotations

import numpy as np

from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import Op, Optional, Var
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr

# ops whose first input's elements are only rearranged, selected or repeated (any type)
MOVERS = (
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Identity",
    "Expand",
    "Slice",
    "Gather",
    "Tile",
    "DepthToSpace",
    "SpaceToDepth",
)


class QDQMovementRule(Rule[Match]):
    """QuantizeLinear(move(DequantizeLinear(x, s, z), ...), s, z) ==> move(x, ...)"""

    name = "qdq_around_data_movement"
    pattern = Op(
        "QuantizeLinear",
        Op(
            MOVERS,
            Op("DequantizeLinear", Var("x"), Var("s_in"), Optional(Var("z_in")), name="dq"),
            name="move",
            variadic=True,
        ),
        Var("s_out"),
        Optional(Var("z_out")),
        name="quant",
    )
    constants = ("s_in", "z_in", "s_out", "z_out")

    def check(self, m: Match, ctx: PassContext) -> str | None:
        if m.node("move").inputs[0] is not m.node("dq").outputs[0]:
            return "the dequantized tensor is not the moved data (an index or a shape)"
        x_type = m.value("x").dtype
        if x_type is None or x_type != m.root.outputs[0].dtype:
            return "the quantized types before and after differ (or are unknown)"
        if m["s_in"].size != 1 or m["s_out"].size != 1:
            return "per-axis scales (only per-tensor ones are matched)"
        if float(m["s_in"].reshape(-1)[0]) != float(m["s_out"].reshape(-1)[0]):
            return "the scales differ"
        z_in = m["z_in"].reshape(-1) if "z_in" in m else np.zeros(1)
        z_out = m["z_out"].reshape(-1) if "z_out" in m else np.zeros(1)
        if z_in.size != 1 or z_out.size != 1 or int(z_in[0]) != int(z_out[0]):
            return "the zero points differ"
        for node in (m.node("dq"), m.root):
            if int(attr(node, "block_size", 0)) or "output_dtype" in node.attributes:
                return f"{node.op_type} has block_size or output_dtype"
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext):
        move = m.node("move")
        inputs = [m.value("x"), *move.inputs[1:]]
        return [b.op(move.op_type, inputs, dict(move.attributes.items()), like=move)]


register(
    PassInfo(
        "QDQMovementFusionPass",
        "Move a quantized tensor in its integer type where it is dequantized only to be "
        "reshaped/transposed/sliced and quantized again with the same scale and zero point",
        opset_min=10,
        default=False,
        note="off in optimize: a QDQ model's Q/DQ placement may be meant for its compiler "
        "(onnxruntime drops these pairs itself at load); on in opfuse quantize's clean-up",
        rules=(QDQMovementRule(),),
    )
)
