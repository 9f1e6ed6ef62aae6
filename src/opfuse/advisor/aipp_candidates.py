"""The first-layer preprocessing AIPP could take over: per graph input, the chain of
preprocessing ops (casts, transposes, normalisation arithmetic) that leads alone into the
first convolution."""

from __future__ import annotations

from opfuse.advisor.graph import GNode, OpGraph
from opfuse.advisor.opkinds import Kind, classify

# ops that hardware preprocessing (AIPP) can take over in front of the first Conv
PREPROCESS = frozenset(
    {
        "Cast",
        "Transpose",
        "Mul",
        "Add",
        "Sub",
        "Div",
        "Pad",
        "BatchNormalization",
        "TransData",
        "Identity",
        "Cast2",
        "TransposeD",
    }
)
NORMALIZATION = frozenset({"Mul", "Add", "Sub", "Div", "BatchNormalization"})
MAX_CHAIN = 64


def aipp_chains(g: OpGraph) -> list[tuple[list[int], GNode]]:
    """Per graph input whose only reader starts a chain of ``PREPROCESS`` ops that ends in
    a convolution: the chain's node indices and that convolution."""
    chains: list[tuple[list[int], GNode]] = []
    for start in g.graph_inputs:
        chain: list[int] = []
        tensor, conv = start, None
        for _ in range(MAX_CHAIN):
            users = [c for c in g.consumers.get(tensor, []) if g.nodes[c].op_type != "Shape"]
            if len(users) != 1:
                break
            node = g.nodes[users[0]]
            if classify(node.op_type) is Kind.CONV and node.op_type not in ("MatMul", "Gemm"):
                conv = node
                break
            if node.op_type not in PREPROCESS or len(node.outputs) != 1:
                break
            chain.append(node.index)
            tensor = node.outputs[0]
        if conv is not None and chain:
            chains.append((chain, conv))
    return chains
