"""Constant nodes lifted into initializers on the protobuf, before onnx-ir reads the model.

ConstantFoldingFusionPass's ``constant_node`` rule does the same one rewrite at a time. A
model exported by torch's legacy exporter, or built by stacking blocks, can hold tens of
thousands of them (10,327 of the 39,553 nodes of ``bench/scale.py``'s model); moving their
TensorProtos on the protobuf spares reading each node into onnx-ir and a driver rewrite
per node (0.4 s of 5.7 s there). The pipeline lifts only when that pass is on, and records
the lifts under the rule's name, so the effect log and the node counts read as if the rule
had made them. Only the rule's own case is taken here: a main-graph Constant holding a
``value`` tensor whose output is not a graph output, in a model of IR version 4 or later
(before, an initializer must also be a graph input); the rule takes every other Constant.
"""

from __future__ import annotations

import onnx

from opfuse.model.graphs import DEFAULT_DOMAINS

LIFTED_KEY = "opfuse.lifted_constants"  # model.meta: how many Constants the loader lifted


def lift_constants(proto: onnx.ModelProto) -> int:
    """Move the main graph's plain Constant nodes into its initializers (each named after
    the Constant's output, node order kept otherwise); return how many."""
    if proto.ir_version < 4:
        return 0
    graph = proto.graph
    outputs = {o.name for o in graph.output}
    kept = []
    lifted = 0
    for node in graph.node:
        if _plain_constant(node) and node.output[0] not in outputs:
            tensor = graph.initializer.add()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            lifted += 1
        else:
            kept.append(node)
    if lifted:
        del graph.node[:]
        graph.node.extend(kept)
    return lifted


def _plain_constant(node: onnx.NodeProto) -> bool:
    if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS:
        return False
    if len(node.attribute) != 1 or len(node.output) != 1 or not node.output[0]:
        return False
    attr = node.attribute[0]
    return attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR
