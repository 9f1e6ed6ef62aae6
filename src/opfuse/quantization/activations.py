"""Activations and normalizations written out as element-wise ops, kept in float (the
``float-decomposed`` step): int8 cannot represent their intermediate tensors.

GELU's tanh form as Keras, JAX and tf2onnx export it, ``x * 0.5 * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 * x * x * x)))``, and its erf form, ``x * 0.5 * (1 + erf(x / sqrt(2)))``, are a
chain of Mul/Add/Div/Pow around one Tanh or Erf. onnxruntime's quantizer requantizes every
tensor of that chain to uint8, each with one scale: the cube ``x * x * x`` spans +-2e5 on
magika's byte classifier (its input +-146), a step of about 1300, so the Tanh's input
carries an error of tens and every GELU output of a small x is wrong (magika's top-1
agreement fell to 2% with onnxruntime's MinMax ranges). Keeping the chain's nodes out of
quantization leaves ``x`` quantized at the producer's output (a Conv/MatMul keeps its
integer kernel) and the chain in float, where onnxruntime fuses it into one Gelu/FastGelu
op at load; nothing of the float model changes (exact).

A LayerNorm written out (Keras/JAX through tf2onnx) computes its variance as
``E[x^2] - E[x]^2`` and then ``1 / sqrt(var + eps)``: each statistic requantized to uint8
alone, their difference is a few integer steps of either, and the reciprocal square root
of a variance rounded near zero explodes (magika's first LayerNorm: 36 dB on each mean,
-15 dB after the Reciprocal). ``normalization_statistics(model)`` finds, for each Sqrt or
Reciprocal fed only by reductions (ReduceSum/ReduceMean, of x or of x * x) through
element-wise and reshaping ops, those nodes and the Reciprocal/Mul/Div that apply the
result; they stay in float (the normalized tensor itself is quantized as before).

``decomposed_activations(model)``: for each Tanh/Erf, the element-wise ops before it that
compute its input from one tensor ``x`` (and constants) and the ones after it up to the
Mul that reads ``x`` again; node names, per activation. ``float_decomposed(model)``: both
kinds, the node names to keep in float.
"""

from __future__ import annotations

import onnx

from opfuse.model.graphs import proto_wiring

ARITHMETIC = frozenset({"Mul", "Add", "Sub", "Div", "Pow"})
CORES = frozenset({"Tanh", "Erf"})
DEPTH = 8  # the longest element-wise chain on either side (GELU's tanh form: 5 before, 3 after)


def decomposed_activations(model: onnx.ModelProto) -> list[list[str]]:
    """Node names of each decomposed activation (a Tanh or Erf computed element-wise from
    one tensor ``x`` and multiplied by ``x`` again after it), in graph order; a node
    without a name is not reported (``--exclude`` takes names)."""
    graph = model.graph
    constants, producer, readers = _wiring(graph)
    outputs = {o.name for o in graph.output}
    found: list[list[str]] = []
    for core in graph.node:
        if core.op_type not in CORES or not core.input:
            continue
        after = _after(core, readers, outputs, constants)
        if after is None:
            continue
        final = after[-1]
        for x in final.input:  # the Mul's other input: x, if the chain before starts there
            chain = _before(core, x, producer, constants)
            if chain is not None:
                names = [n.name for n in [*chain, core, *after]]
                if all(names):
                    found.append(names)
                break
    return found


def _before(
    core: onnx.NodeProto, x: str, producer: dict[str, onnx.NodeProto], constants: set[str]
) -> list[onnx.NodeProto] | None:
    """The arithmetic nodes that compute ``core``'s input from ``x`` and constants only,
    reading ``x`` at least once (in the order found, reversed), or None."""
    chain: list[onnx.NodeProto] = []
    todo = [core.input[0]]
    seen: set[str] = set()
    reads_x = False
    while todo:
        name = todo.pop()
        if name == x:
            reads_x = True
            continue
        if name in seen or name in constants:
            continue
        seen.add(name)
        made = producer.get(name)
        if made is None or made.op_type not in ARITHMETIC:
            return None  # another tensor enters the chain
        chain.append(made)
        if len(chain) > DEPTH:
            return None
        todo.extend(made.input)
    return list(reversed(chain)) if chain and reads_x else None


def _after(
    core: onnx.NodeProto,
    readers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
    constants: set[str],
) -> list[onnx.NodeProto] | None:
    """The arithmetic nodes from ``core``'s output, each the only reader of the one
    before, up to and including the first Mul whose other input does not come from this
    chain (the Mul by ``x``); None when there is none."""
    chain: list[onnx.NodeProto] = []
    tensor = core.output[0]
    for _ in range(DEPTH):
        if tensor in outputs:
            return None
        following = readers.get(tensor, [])
        if len(following) != 1 or following[0].op_type not in ARITHMETIC:
            return None
        node = following[0]
        chain.append(node)
        if node.op_type == "Mul" and any(i != tensor and i not in constants for i in node.input):
            return chain
        tensor = node.output[0]
    return None


STATISTICS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Max", "Min", "Reshape", "Expand", "Unsqueeze", "Squeeze",
     "Sqrt", "Reciprocal", "Pow", "Identity", "Cast"}
)  # fmt: skip
REDUCTIONS = frozenset({"ReduceSum", "ReduceMean"})
ROOTS = frozenset({"Sqrt", "Reciprocal"})
APPLY = frozenset({"Reciprocal", "Sqrt", "Mul", "Div"})
STAT_DEPTH = 16
APPLY_STEPS = 3  # 1/sqrt, gamma * it, (x - mean) * that


def normalization_statistics(model: onnx.ModelProto) -> list[list[str]]:
    """Node names of each normalization's statistics chain (a Sqrt or Reciprocal whose
    every input path ends, through element-wise and reshaping ops, at a ReduceSum or
    ReduceMean of a tensor or of its square) with the ops that apply it (Reciprocal, Mul,
    Div reading it, ``APPLY_STEPS`` steps at most), in graph order."""
    graph = model.graph
    constants, producer, readers = _wiring(graph)
    order = {id(n): i for i, n in enumerate(graph.node)}
    taken: set[int] = set()
    found: list[list[str]] = []
    for root in graph.node:
        if root.op_type not in ROOTS or id(root) in taken:
            continue
        chain = _statistics(root, producer, constants)
        if chain is None:
            continue
        applied = [root]
        frontier = [root]
        for _ in range(APPLY_STEPS):
            nxt = []
            for node in frontier:
                for reader in readers.get(node.output[0], []):
                    if reader.op_type in APPLY and id(reader) not in {id(a) for a in applied}:
                        applied.append(reader)
                        nxt.append(reader)
            frontier = nxt
        nodes = {id(n): n for n in [*chain, *applied]}
        if any(id(n) in taken for n in nodes.values()):
            continue
        taken.update(nodes)
        names = [n.name for n in sorted(nodes.values(), key=lambda n: order[id(n)])]
        if all(names):
            found.append(names)
    return found


def _statistics(
    root: onnx.NodeProto, producer: dict[str, onnx.NodeProto], constants: set[str]
) -> list[onnx.NodeProto] | None:
    """The nodes computing ``root``'s input from reductions only (each reduction's input
    taken as given, or its square x * x / Pow(x, 2) included), or None."""
    chain: dict[int, onnx.NodeProto] = {}
    todo = list(root.input[:1])
    reductions = 0
    while todo:
        name = todo.pop()
        if not name or name in constants:
            continue
        made = producer.get(name)
        if made is None:
            return None  # a graph input reached without a reduction
        if id(made) in chain:
            continue
        if made.op_type in REDUCTIONS:
            chain[id(made)] = made
            reductions += 1
            square = producer.get(made.input[0]) if made.input else None
            if square is not None and _is_square(square, constants):
                chain[id(square)] = square
            continue
        if made.op_type not in STATISTICS or made.op_type == "Identity" and not made.input:
            return None
        chain[id(made)] = made
        if len(chain) > STAT_DEPTH:
            return None
        if made.op_type in ("Reshape", "Expand"):
            todo.append(made.input[0])  # the shape input is not data
        else:
            todo.extend(made.input)
    return list(chain.values()) if reductions else None


def _is_square(node: onnx.NodeProto, constants: set[str]) -> bool:
    if node.op_type == "Mul" and len(node.input) == 2:
        return node.input[0] == node.input[1]
    return node.op_type == "Pow" and len(node.input) == 2 and node.input[1] in constants


def float_decomposed(model: onnx.ModelProto) -> list[str]:
    """The node names ``float-decomposed`` keeps in float: every decomposed activation's
    and normalization statistics chain's, once each, in graph order."""
    names = {n for group in decomposed_activations(model) for n in group}
    names |= {n for group in normalization_statistics(model) for n in group}
    return [n.name for n in model.graph.node if n.name in names]


def _wiring(
    graph: onnx.GraphProto,
) -> tuple[set[str], dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """The graph's constant names, each value's producer and each value's readers."""
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    return (constants, *proto_wiring(graph))
