"""Heads in float where int8 cannot represent them: an output that a Softmax/LogSoftmax or
a classifier head (Gemm, MatMul, its bias Add) makes is requantized by onnxruntime's
quantizer (a QuantizeLinear and DequantizeLinear on the graph output: for a Softmax a
fixed [0, 1] range, a step of 1/255, so probabilities below 0.002 become 0 and close
classes tie). ``float_head`` removes that last Q/DQ pair (the head's inputs stay int8: its
kernel takes them; only its output is float); ``float_logits`` also the requantization of
the logits a Gemm/MatMul makes before a Softmax (onnxruntime runs it with int8 inputs and a
float output). Whether it is kept is decided by measurement (``keep_float``): ``run`` keeps
it where the top-1 agreement on the validation part is higher, or the same with an SQNR
higher by 1 dB."""

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
    int8_sqnr_db: float | None = None
    float_sqnr_db: float | None = None

    def describe(self) -> str:
        figures = (
            f"top-1 {self.int8_top1:.1%} with its output requantized, {self.float_top1:.1%} "
            "without, on the validation part"
            if self.int8_top1 is not None and self.float_top1 is not None
            else ""
        )
        if self.int8_sqnr_db is not None and self.float_sqnr_db is not None:
            figures += f"; SQNR {self.int8_sqnr_db:.1f} dB against {self.float_sqnr_db:.1f} dB"
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
            "int8_sqnr_db": self.int8_sqnr_db,
            "float_sqnr_db": self.float_sqnr_db,
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


LOGIT_MAKERS = frozenset({"Gemm", "MatMul"})  # onnxruntime's QGemm / MatMulIntegerToFloat
TAIL_OPS = PASSING_OPS | {"Softmax", "LogSoftmax"}


def float_logits(int8: onnx.ModelProto, output: str) -> onnx.ModelProto | None:
    """A copy of ``int8`` whose graph output ``output`` and the logits behind it are float:
    every QuantizeLinear/DequantizeLinear on the one-reader chain from the Gemm/MatMul that
    makes the logits (through its bias Add, Softmax/LogSoftmax and data-moving ops) to the
    output is
    removed; the Gemm/MatMul keeps its int8 inputs (onnxruntime runs it as QGemm or
    MatMulIntegerToFloat with a float output). None when the output is not made so."""
    graph = int8.graph
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        if n.op_type == "Shape":  # reads the shape only, whatever the Q/DQ around
            continue
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    constants |= {  # a quantized constant (the bias as its DequantizeLinear gives it)
        n.output[0] for n in graph.node if n.op_type == DEQUANTIZE and n.input[0] in constants
    }
    chain: list[onnx.NodeProto] = []
    tensor = output
    while True:
        made = producer.get(tensor)
        if made is None:
            return None
        if made.op_type in LOGIT_MAKERS:
            break
        if made.op_type == "Add" and len(made.input) == 2:  # the logits' bias (a constant)
            data = [i for i in made.input if i not in constants]
            if len(data) != 1:
                return None
            chain.append(made)
            tensor = data[0]
        elif made.op_type not in TAIL_OPS or not made.input:
            return None
        else:
            chain.append(made)
            tensor = made.input[0]
        if readers.get(tensor, 0) != 1 or tensor in outputs:
            return None  # another reader: the tensor is not the head's alone
    drop = [n for n in chain if n.op_type in (QUANTIZE, DEQUANTIZE)]
    if not drop:
        return None
    model = onnx.ModelProto()
    model.CopyFrom(int8)
    rename: dict[str, str] = {}
    for node in drop:  # each dropped node's output is its input
        rename[node.output[0]] = node.input[0]

    def source(name: str) -> str:
        while name in rename:
            name = rename[name]
        return name

    kept = []
    for node in model.graph.node:
        key = (node.name, tuple(node.output))
        if node.op_type in (QUANTIZE, DEQUANTIZE) and any(
            key == (d.name, tuple(d.output)) for d in drop
        ):
            continue
        for i, name in enumerate(node.input):
            node.input[i] = source(name)
        kept.append(node)
    # the last node of the chain writes the graph output under its name
    last = next((n for n in kept if output in n.output), None)
    if last is None:  # the output was a dropped DQ's: its source's producer writes it
        src = source(output)
        writer = next(n for n in kept if src in n.output)
        writer.output[list(writer.output).index(src)] = output
        for node in kept:
            for i, name in enumerate(node.input):
                if name == src:
                    node.input[i] = output
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def float_output(int8: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """The head's float candidate: its logits and output float (``float_logits``) where a
    Gemm/MatMul makes them, else its last Q/DQ pair removed (``float_head``)."""
    found = float_logits(int8, output)
    return found if found is not None else float_head(int8, output)


SQNR_GAIN_DB = 1.0  # a float output kept for the same top class: at least this much SQNR


def keep_float(
    int8_top1: float | None,
    float_top1: float | None,
    int8_sqnr: float,
    float_sqnr: float,
) -> bool:
    """Keep the float candidate: a higher top-1 agreement, or the same and an SQNR higher
    by ``SQNR_GAIN_DB`` (one rounding less on the class scores: two close classes the
    validation part does not hold can tie in int8, as one window of PP-OCR's direction
    classifier did, [0.42, 0.58] read [0.498, 0.498])."""
    if int8_top1 is None or float_top1 is None:
        return False
    if float_top1 != int8_top1:
        return float_top1 > int8_top1
    return float_sqnr >= int8_sqnr + SQNR_GAIN_DB
