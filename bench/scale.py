"""A ~40,000-node transformer for the scale figures: the zoo's own transformer stacks
chained end to end (4 x tx100 + 3 x transformer_tiny = 430 pre-LN blocks, 39,553 nodes).
Each copy keeps its nodes, weights and shape arithmetic, renamed with a prefix; the
output ``y`` of one copy feeds the input ``x`` of the next (both are [b, t, 64])."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

STACK = (
    "tx100",
    "tx100",
    "tx100",
    "tx100",
    "transformer_tiny",
    "transformer_tiny",
    "transformer_tiny",
)
NAME = "tx430"


def _rename_graph(graph: onnx.GraphProto, prefix: str, keep: dict[str, str]) -> None:
    def rn(name: str) -> str:
        if not name:
            return name
        return keep.get(name, prefix + name)

    for i, node in enumerate(graph.node):
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            raise ValueError(f"{node.name}: subgraphs are not supported by the stacker")
        node.name = prefix + (node.name or f"n{i}")
        node.input[:] = [rn(n) for n in node.input]
        node.output[:] = [rn(n) for n in node.output]
    for seq in (graph.initializer, graph.sparse_initializer):
        for t in seq:
            t.name = rn(t.name)
    for seq in (graph.input, graph.output, graph.value_info):
        for v in seq:
            v.name = rn(v.name)


def stack(paths: list[str | os.PathLike[str]], out: str | os.PathLike[str]) -> int:
    """Chain single-input, single-output models of matching interface; returns the node count."""
    first = onnx.load(str(paths[0]))
    in_name, out_name = first.graph.input[0].name, first.graph.output[0].name
    graph = onnx.GraphProto(name=NAME)
    previous = in_name
    for k, path in enumerate(paths):
        model = first if k == 0 else onnx.load(str(path))
        g = model.graph
        if len(g.input) != 1 or len(g.output) != 1:
            raise ValueError(f"{path}: the stacker needs one input and one output")
        last = k == len(paths) - 1
        output = out_name if last else f"s{k}/{out_name}"
        keep = {g.input[0].name: previous, g.output[0].name: output}
        _rename_graph(g, f"s{k}/", keep)
        graph.node.extend(g.node)
        graph.initializer.extend(g.initializer)
        graph.value_info.extend(g.value_info)
        if k == 0:
            graph.input.extend(g.input)
        if last:
            graph.output.extend(g.output)
        previous = output
    result = onnx.helper.make_model(graph, opset_imports=first.opset_import)
    result.ir_version = first.ir_version
    onnx.save(result, str(out))
    return len(graph.node)


def build(zoo: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """The stacked model in out_dir (reused when it is already there)."""
    out = Path(out_dir) / f"{NAME}.onnx"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        stack([Path(zoo) / f"{name}.onnx" for name in STACK], tmp)
        tmp.replace(out)
    return out
