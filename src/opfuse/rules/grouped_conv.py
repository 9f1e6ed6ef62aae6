"""Split -> N Convs -> Concat on the channel axis is one grouped Conv (CANN's
SplitConvConcatFusionPass).

    Concat_1(Conv(Split_1(x)[0], W0, b0), ..., Conv(Split_1(x)[N-1], WN-1, bN-1))
    ==>  Conv(x, concat(W0..WN-1), concat(b0..bN-1), group = N * g)

Exact: a Conv with group G computes output block i from input block i with the weights
of block i, which is what the N separate Convs do. Every Conv must have the same
attributes and weight shape (so the Split gives equal blocks), each Split output must go
to its Conv in Concat order. A BatchNormalization after the Concat then folds into the
grouped Conv by ConvBatchNormFusionPass (CANN's GroupConvBatchNorm).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import attr, producer

MAX_BRANCHES = 256
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def split_sizes(split: ir.Node) -> list[int] | None | str:
    """Explicit split sizes, None when the Split divides evenly, or a reason."""
    sizes = attr(split, "split")
    if sizes is None and len(split.inputs) > 1 and split.inputs[1] is not None:
        array = const_array(split.inputs[1])
        if array is None:
            return "Split sizes are not constant"
        sizes = array.reshape(-1).tolist()
    return None if sizes is None else [int(s) for s in sizes]


class BranchesMatch(Match):
    convs: list[ir.Node]  # the Conv of each Concat input, in order


class SplitConvConcatRule(Rule[BranchesMatch]):
    """Concat(Conv(Split(x)[i]) for i in 0..N-1, axis=1) ==> Conv(x, group=N*g)"""

    name = "split_conv_concat"
    roots = ("Concat",)

    # imperative: as many Conv branches as the Concat has inputs (2 to MAX_BRANCHES)
    def match(self, node: ir.Node, ctx: PassContext) -> BranchesMatch | None:
        convs = [producer(v, "Conv") for v in node.inputs]
        if not 2 <= len(convs) <= MAX_BRANCHES or any(c is None for c in convs):
            return None
        first = convs[0]
        assert first is not None
        split = producer(first.inputs[0], "Split")
        if split is None:
            return None
        m = BranchesMatch(node)
        m.nodes += [node, split]
        m.node_names.update(concat=node, split=split)
        for i, conv in enumerate(convs):
            assert conv is not None
            if conv in m.nodes or len(conv.inputs) < 2 or conv.inputs[1] is None:
                return None
            m.nodes.append(conv)
            m.node_names[f"conv{i}"] = conv
            m.values[f"w{i}"] = conv.inputs[1]
            if len(conv.inputs) > 2 and conv.inputs[2] is not None:
                m.values[f"b{i}"] = conv.inputs[2]
        m.convs = [c for c in convs if c is not None]
        return m

    constants = tuple(f"{p}{i}" for p in "wb" for i in range(MAX_BRANCHES))

    def check(self, m: BranchesMatch, ctx: PassContext) -> str | None:
        concat, split = m.node("concat"), m.node("split")
        convs = m.convs
        n = len(convs)
        w0 = m["w0"]
        if len(split.outputs) != n:
            return f"Split has {len(split.outputs)} outputs, the Concat {n} Conv inputs"
        for i, conv in enumerate(convs):
            if conv.inputs[0] is not split.outputs[i]:
                return "Concat inputs are not the Convs of the Split outputs in order"
        ndim = w0.ndim
        for name, node in (("Split", split), ("Concat", concat)):
            axis = int(attr(node, "axis", 0))
            if axis not in (1, 1 - ndim):
                return f"{name} is not on the channel axis"
        if isinstance(sizes := split_sizes(split), str):
            return sizes
        for i, conv in enumerate(convs):
            if m[f"w{i}"].shape != w0.shape:
                return "Convs have different weight shapes"
            if any(attr(conv, a) != attr(convs[0], a) for a in CONV_ATTRS):
                return "Convs have different attributes"
        group = int(attr(convs[0], "group", 1))
        if sizes is not None and any(s != w0.shape[1] * group for s in sizes):
            return "Split blocks do not match the Convs' input channels"
        return None

    def rewrite(self, m: BranchesMatch, b: Builder, ctx: PassContext):
        convs = m.convs
        n = len(convs)
        weights = [m[f"w{i}"] for i in range(n)]
        biases = [m.get(f"b{i}") for i in range(n)]
        name = convs[0].name or "conv"
        w = np.concatenate(weights, axis=0)
        inputs = [m.node("split").inputs[0], b.const(w, f"{name}.weight_grouped")]
        if any(bias is not None for bias in biases):
            cout = weights[0].shape[0]
            full = [bb if bb is not None else np.zeros(cout, w.dtype) for bb in biases]
            inputs.append(b.const(np.concatenate(full), f"{name}.bias_grouped"))
        attrs = dict(convs[0].attributes.items())
        attrs["group"] = ir.AttrInt64("group", n * int(attr(convs[0], "group", 1)))
        return [b.op("Conv", inputs, attrs, like=convs[0])]


register(
    PassInfo(
        "SplitConvConcatFusionPass",
        "Turn Split -> N Convs with identical attributes -> Concat on the channel axis into "
        "one grouped Conv (a BatchNormalization after it then folds)",
        rules=(SplitConvConcatRule(),),
    )
)
