"""Heads in float where int8 cannot represent them: an output that a Softmax/LogSoftmax or
a classifier head (Gemm, MatMul, its bias Add) makes is requantized by onnxruntime's
quantizer (a QuantizeLinear and DequantizeLinear on the graph output: for a Softmax a
fixed [0, 1] range, a step of 1/255, so probabilities below 0.002 become 0 and close
classes tie). ``float_head`` removes that last Q/DQ pair (the head's inputs stay int8: its
kernel takes them; only its output is float). Whether it is kept is decided by
measurement: ``run`` keeps it where it changes the top class on the validation part."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
PASSING_OPS = frozenset(
    {
        "Identity",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "Cast",
        QUANTIZE,
        DEQUANTIZE,
    }
)


@dataclass
class HeadChoice:
    output: str
    op_type: str  # the op that makes it (Softmax, Gemm, ...)
    int8_top1: float | None
    float_top1: float | None
    in_float: bool

    def describe(self) -> str:
        figures = (
            f"top-1 {self.int8_top1:.1%} with its output requantized, {self.float_top1:.1%} "
            "without, on the validation part"
            if self.int8_top1 is not None and self.float_top1 is not None
            else ""
        )
        if self.in_float:
            return f"the {self.op_type} head making {self.output} keeps a float output ({figures})"
        return f"the {self.op_type} head making {self.output} stays requantized: the same top class ({figures})"

    def to_json(self) -> dict[str, object]:
        return {
            "output": self.output,
            "op_type": self.op_type,
            "int8_top1": self.int8_top1,
            "float_top1": self.float_top1,
            "float_output": self.in_float,
        }


def requantized_heads(int8: onnx.ModelProto, outputs: set[str]) -> dict[str, str]:
    """Of ``outputs`` (the ones that score classes), those the int8 model ends with a
    QuantizeLinear -> DequantizeLinear pair: output -> the op type that makes it."""
    graph = int8.graph
    producer = {o: n for n in graph.node for o in n.output}
    found = {}
    for name in outputs:
        dq = producer.get(name)
        q = producer.get(dq.input[0]) if dq is not None and dq.op_type == DEQUANTIZE else None
        if q is None or q.op_type != QUANTIZE:
            continue
        made = producer.get(q.input[0])
        while made is not None and made.op_type in PASSING_OPS and made.input:
            made = producer.get(made.input[0])  # through Reshape, DequantizeLinear...
        found[name] = made.op_type if made is not None else "input"
    return found


def float_head(int8: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """A copy of ``int8`` whose graph output ``output`` is written by its producer in
    float: the final QuantizeLinear -> DequantizeLinear pair removed (the Q kept when
    something else reads it)."""
    model = onnx.ModelProto()
    model.CopyFrom(int8)
    nodes = list(model.graph.node)
    at = {o: i for i, n in enumerate(nodes) for o in n.output}
    dq_at = at[output]
    q_at = at[nodes[dq_at].input[0]]
    q_out, source = nodes[q_at].output[0], nodes[q_at].input[0]
    q_read = any(q_out in n.input for i, n in enumerate(nodes) if i != dq_at)
    drop = {dq_at} if q_read else {dq_at, q_at}
    made_at = at.get(source)
    others = any(source in n.input for i, n in enumerate(nodes) if i != q_at)
    outputs = {o.name for o in model.graph.output}
    if made_at is None or others or source in outputs:
        # the tensor has other readers (or is a graph input): the output becomes a copy
        kept = [n for i, n in enumerate(nodes) if i not in drop]
        kept.append(onnx.helper.make_node("Identity", [source], [output], name=f"{output}_float"))
    else:
        made = nodes[made_at]
        for i, o in enumerate(made.output):
            if o == source:
                made.output[i] = output
        if q_read:  # the Q still reads the tensor, under its new name
            q = nodes[q_at]
            q.input[0] = output
        kept = [n for i, n in enumerate(nodes) if i not in drop]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model
