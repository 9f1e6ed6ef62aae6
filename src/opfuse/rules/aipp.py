"""AippFusionPass: first-layer (AIPP) fusion. The preprocessing between a graph input and
the first Conv (same-type Casts, Mul/Add/Sub/Div by scalar or per-channel constants,
Transposes, Pads) is folded into that Conv's weights and bias.

    Conv(a*x + b, W, B)  ==>  Conv(x, W*a, B + sum(W*b))      (a, b per input channel)

Padding decides exactness. Padded zeros in the normalized tensor are not zeros of the raw
one, so a conv that pads (pads or auto_pad) folds only a zero shift. An explicit constant
Pad stays in place with its value moved into raw space, (value - b) / a, which is exact
when that is one number for every channel (scalar normalization); reflect/edge Pads
commute with an affine map that does not vary along the padded axes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from opfuse.rewrite import Builder, Match, PassContext, Rule
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import DEFAULT_DOMAINS, attr

AFFINE = frozenset({"Mul", "Add", "Sub", "Div"})
CHAIN = AFFINE | {"Cast", "Transpose", "Pad"}
INEXACT_PAD = (
    "Conv pads with zeros and the preprocessing shift is not zero: folding would be inexact "
    "(recommend hardware preprocessing, AIPP, instead)"
)


def _chain_input(node: ir.Node) -> int | None:
    """Which input of a chain node carries the image (the other is a constant)."""
    if node.op_type in AFFINE:
        consts = [const_array(v) is not None for v in node.inputs]
        if len(node.inputs) != 2 or consts.count(True) != 1:
            return None
        return consts.index(False)
    return 0


def _full(array: np.ndarray, n: int) -> np.ndarray:
    return array.reshape((1,) * (n - array.ndim) + array.shape)


class AippRule(Rule):
    """graph input -> (Cast|Mul|Add|Sub|Div|Transpose|Pad)* -> Conv ==> Transpose/Pad -> Conv'"""

    name = "aipp_conv"
    roots = ("Conv",)
    exclusive = False  # checked here: chain values may also feed Shape (their shape stays)

    # imperative: a chain of any length and any order of preprocessing ops back to a
    # graph input (a pattern has a fixed shape)
    def match(self, node: ir.Node, ctx: PassContext) -> Match | None:
        chain: list[ir.Node] = []
        value = node.inputs[0]
        while value is not None and not value.is_graph_input():
            producer = value.producer()
            if (
                producer is None
                or producer.op_type not in CHAIN
                or producer.domain not in DEFAULT_DOMAINS
            ):
                break
            index = _chain_input(producer)
            if index is None:
                break
            chain.append(producer)
            value = producer.inputs[index]
        if value is None or not any(n.op_type in AFFINE for n in chain):
            return None
        start = value
        if not start.is_graph_input():
            producer = start.producer()  # a Cast from a non-float input stays
            if producer is None or producer.op_type != "Cast":
                return None
            if producer.inputs[0] is None or not producer.inputs[0].is_graph_input():
                return None
        m = Match(node)
        m.nodes = [node, *chain]
        m.values["start"] = start
        weight = node.inputs[1]
        if weight is None:
            return None
        m.values["W"] = weight
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            m.values["B"] = node.inputs[2]
        m.node_names["conv"] = node
        return m

    constants = ("W", "B")

    def check(self, m: Match, ctx: PassContext) -> str | None:
        chain = list(reversed(m.nodes[1:]))  # input to conv
        inside = {id(n) for n in m.nodes}
        for node in chain:
            out = node.outputs[0]
            if out.is_graph_output():
                return f"{node.op_type} {node.name!r} output is a graph output"
            for user, _ in out.uses():
                if id(user) not in inside and user.op_type != "Shape":
                    return f"{node.op_type} {node.name!r} output has another consumer"
        plan = self._plan(m, chain)
        if isinstance(plan, str):
            return plan
        m.notes["plan"] = plan
        return None

    def _plan(self, m: Match, chain: list[ir.Node]) -> str | dict:
        start = m.value("start")
        n = len(start.shape) if start.shape is not None else None
        if n is None:
            return "input rank unknown"
        dtype = m["W"].dtype
        a, b = np.ones((1,) * n), np.zeros((1,) * n)
        pad_values: dict[int, np.ndarray] = {}
        for node in chain:
            op = node.op_type
            if op == "Cast":
                src = node.inputs[0].dtype if node.inputs[0] is not None else None
                if src is None or src != ir.DataType(attr(node, "to")):
                    return "a Cast in the chain changes the type"
            elif op in AFFINE:
                index = _chain_input(node)
                array = const_array(node.inputs[1 - (index or 0)])
                assert index is not None and array is not None  # match() checked both
                c = _full(array.astype(np.float64), n)
                if op == "Mul":
                    a, b = a * c, b * c
                elif op == "Add":
                    b = b + c
                elif op == "Sub":
                    a, b = (a, b - c) if index == 0 else (-a, c - b)
                elif index == 0:
                    a, b = a / c, b / c
                else:
                    return "Div of a constant by the image is not affine"
            elif op == "Transpose":
                perm = attr(node, "perm") or list(reversed(range(n)))
                a, b = np.transpose(a, perm), np.transpose(b, perm)
            else:
                reason = self._pad(node, a, b, pad_values, n)
                if reason:
                    return reason
        if a.shape[0] != 1 or any(d != 1 for d in a.shape[2:] + b.shape[2:]) or b.shape[0] != 1:
            return "the preprocessing is not per channel"
        conv = m.root
        cin = m["W"].shape[1] * int(attr(conv, "group", 1))
        if a.shape[1] not in (1, cin) or b.shape[1] not in (1, cin):
            return "the preprocessing does not match the Conv's channels"
        av = np.broadcast_to(a.reshape(-1), (cin,))
        bv = np.broadcast_to(b.reshape(-1), (cin,))
        pads = attr(conv, "pads") or []
        auto_pad = attr(conv, "auto_pad", "NOTSET")
        padded = any(pads) or auto_pad not in ("NOTSET", "VALID")
        if padded and np.any(bv != 0):
            return INEXACT_PAD
        if not np.all(np.isfinite(av)) or not np.all(np.isfinite(bv)):
            return "the preprocessing constants are not finite"
        return {"a": av, "b": bv, "pads": pad_values, "dtype": dtype}

    @staticmethod
    def _pad(node: ir.Node, a: np.ndarray, b: np.ndarray, values: dict, n: int) -> str | None:
        mode = attr(node, "mode", "constant")
        if mode != "constant":
            if mode not in ("reflect", "edge"):
                return f"Pad mode {mode} in the chain"
            pads = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            if pads is None or len(node.inputs) > 3 and node.inputs[3] is not None:
                return "a reflect/edge Pad whose pads are not a constant"
            flat = pads.reshape(-1)
            for axis in range(n):
                if (flat[axis] or flat[n + axis]) and (a.shape[axis] != 1 or b.shape[axis] != 1):
                    return "the preprocessing varies along a padded axis"
            return None
        c0 = 0.0
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            value = const_array(node.inputs[2])
            if value is None:
                return "the Pad value is not a constant"
            c0 = float(value.reshape(-1)[0]) if value.size else 0.0
        if np.any(a == 0):
            return "a zero scale before a Pad"
        r = (c0 - b) / a
        if not np.all(r == r.reshape(-1)[0]):
            return "a Pad after per-channel normalization: no single raw pad value is exact"
        values[id(node)] = np.asarray(r.reshape(-1)[0])
        return None

    def rewrite(self, m: Match, b: Builder, ctx: PassContext) -> Mapping[ir.Value, ir.Value]:
        plan: dict = m.notes["plan"]
        chain = list(reversed(m.nodes[1:]))
        replaced: dict[ir.Value, ir.Value] = {}
        cur = m.value("start")
        for node in chain:
            if node.op_type == "Transpose":
                cur = b.op("Transpose", [cur], {"perm": attr(node, "perm")}, like=node)
            elif node.op_type == "Pad":
                inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
                inputs[0] = cur
                if id(node) in plan["pads"]:
                    value = np.array(plan["pads"][id(node)], dtype=plan["dtype"])
                    inputs[2] = b.const(value, f"{node.name or 'pad'}_raw_value")
                attrs = {k: a.value for k, a in node.attributes.items()}
                cur = b.op("Pad", inputs, attrs, like=node)
            replaced[node.outputs[0]] = cur
        conv = m.root
        w = m["W"].astype(np.float64)
        group = int(attr(conv, "group", 1))
        cout, cin_g = w.shape[0], w.shape[1]
        per_out = lambda v: np.repeat(v.reshape(group, cin_g), cout // group, axis=0)  # noqa: E731
        scale = per_out(plan["a"]).reshape((cout, cin_g) + (1,) * (w.ndim - 2))
        shift = per_out(plan["b"]).reshape((cout, cin_g) + (1,) * (w.ndim - 2))
        bias = m.get("B")
        bias = np.zeros(cout) if bias is None else bias.astype(np.float64)
        new_bias = bias + (w * shift).sum(axis=tuple(range(1, w.ndim)))
        dtype = plan["dtype"]
        w_new = b.const((w * scale).astype(dtype), f"{conv.name or 'conv'}_aipp_W")
        b_new = b.const(new_bias.astype(dtype), f"{conv.name or 'conv'}_aipp_B")
        attrs = {k: a.value for k, a in conv.attributes.items()}
        replaced[conv.outputs[0]] = b.op("Conv", [cur, w_new, b_new], attrs, like=conv)
        return replaced


register(
    PassInfo(
        "AippFusionPass",
        "First-layer fusion: Cast/Mul/Add/Sub/Div preprocessing between a graph input and its "
        "first Conv folded into the Conv's weights and bias (exact; refused where padding "
        "would make it inexact)",
        rules=(AippRule(),),
    )
)
