"""Exact, faster twins of two helpers of onnxruntime's quantizer, used while it runs.

onnxruntime's static quantizer scans the whole graph once per tensor it quantizes: on a
9,199-node transformer (the zoo's tx100) one quantization took 197 s, 80 s of them in
``ONNXModel.replace_input_of_all_nodes`` (a Python call per node, 25 million of them) and
22 s in ``quant_utils.find_by_name`` (a list of every match, to take the first). The
twins do the same, in the same order, faster:

- ``replace_input_of_all_nodes``: the nodes that read the tensor are found with the
  protobuf field's own ``in`` (C), and only they are rewritten, by onnxruntime's own
  ``replace_node_input``;
- ``find_by_name``: the first match, found without building the list of every match.

Each is put in place only while ``quantize_static`` runs (``faster_quantizer``), and only
when onnxruntime's own function is the one they were written against (its source's hash
in ``KNOWN_SOURCES``): a newer onnxruntime with other code keeps its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import sys
from collections.abc import Iterable, Iterator
from typing import Any

# the sha256 (first 16 hex digits) of the source of each function replaced, as in
# onnxruntime 1.32's quantization package
KNOWN_SOURCES = {
    "ONNXModel.replace_input_of_all_nodes": "dc01c5a634a1e3c1",
    "find_by_name": "40cf7740b42609de",
}


def _source_hash(function: object) -> str:
    try:
        source = inspect.getsource(function)  # type: ignore[arg-type]
    except (OSError, TypeError):  # no source to read: not the function known
        return ""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def replace_input_of_all_nodes(self: Any, old_input_name: str, new_input_name: str) -> None:
    """``ONNXModel.replace_input_of_all_nodes``, the nodes that read ``old_input_name``
    found by the field's ``in``."""
    replace = type(self).replace_node_input
    for node in self.model.graph.node:
        if old_input_name in node.input:
            replace(node, old_input_name, new_input_name)


def find_by_name(item_name: str, item_list: Iterable[Any]) -> Any:
    """``quant_utils.find_by_name``: the first item named ``item_name``, else None."""
    return next((item for item in item_list if item.name == item_name), None)


@contextlib.contextmanager
def faster_quantizer() -> Iterator[list[str]]:
    """The twins in place of onnxruntime's functions for the block (the names of those
    replaced: none where onnxruntime's source is not the one known), put back after."""
    from onnxruntime.quantization import quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    undo: list[tuple[object, str, object]] = []
    own_replace = ONNXModel.replace_input_of_all_nodes
    if _source_hash(own_replace) == KNOWN_SOURCES["ONNXModel.replace_input_of_all_nodes"]:
        undo.append((ONNXModel, "replace_input_of_all_nodes", own_replace))
    own_find = quant_utils.find_by_name
    if _source_hash(own_find) == KNOWN_SOURCES["find_by_name"]:
        # each module of the package holds its own reference (from .quant_utils import)
        for name, module in list(sys.modules.items()):
            package = name.startswith("onnxruntime.quantization")
            if package and getattr(module, "find_by_name", None) is own_find:
                undo.append((module, "find_by_name", own_find))
    twins = {"replace_input_of_all_nodes": replace_input_of_all_nodes, "find_by_name": find_by_name}
    try:
        for owner, attribute, _ in undo:
            setattr(owner, attribute, twins[attribute])
        yield sorted({attribute for _, attribute, _ in undo})
    finally:
        for owner, attribute, own in undo:
            setattr(owner, attribute, own)
