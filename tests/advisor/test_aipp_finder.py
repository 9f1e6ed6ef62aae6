"""The AIPP finder: the preprocessing chain from a graph input into the first convolution."""

from __future__ import annotations

from opfuse.advisor.aipp_candidates import aipp_chains
from opfuse.advisor.graph import from_chain


def test_a_preprocessing_chain_into_the_first_conv_is_found():
    g = from_chain(
        ["cast", "nhwc", "mean", "std", "conv", "relu"],
        ["Cast", "Transpose", "Sub", "Div", "Conv", "Relu"],
    )
    ((chain, conv),) = aipp_chains(g)
    assert [g.nodes[i].name for i in chain] == ["cast", "nhwc", "mean", "std"]
    assert conv.name == "conv"


def test_no_chain_when_an_op_aipp_cannot_do_comes_first():
    g = from_chain(["relu", "sub", "conv"], ["Relu", "Sub", "Conv"])
    assert aipp_chains(g) == []


def test_no_chain_when_the_input_feeds_a_matmul_or_nothing_precedes_the_conv():
    assert aipp_chains(from_chain(["sub", "mm"], ["Sub", "MatMul"])) == []
    assert aipp_chains(from_chain(["conv", "relu"], ["Conv", "Relu"])) == []
