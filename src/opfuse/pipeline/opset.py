"""The model's default-domain opset, and its conversion with onnx's version converter
(``--target-opset``; a model below ``io.MIN_OPSET`` is converted up to it)."""

from __future__ import annotations

import onnx
import onnx.version_converter
import onnx_ir as ir

from opfuse.errors import OpfuseError, first_line
from opfuse.model import io


def default_opset(model: ir.Model) -> int | None:
    """The model's default-domain opset; None when it imports only other domains."""
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def convert_opset(model: ir.Model, target: int) -> ir.Model:
    """A new model converted to default-domain opset ``target`` (never lowered)."""
    current = default_opset(model)
    if current is None:
        raise OpfuseError("--target-opset: the model imports no default-domain opset")
    if target < current:
        raise OpfuseError(f"--target-opset {target} is lower than the model's opset {current}")
    if not io.MIN_OPSET <= target <= io.MAX_OPSET:
        raise OpfuseError(f"--target-opset {target} is outside {io.MIN_OPSET}..{io.MAX_OPSET}")
    if target == current:
        return model
    try:
        converted = onnx.version_converter.convert_version(io.to_proto(model), target)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError
        first = first_line(exc)
        raise OpfuseError(f"cannot convert the model to opset {target}: {first}") from None
    new = io.from_proto(converted)
    base_dirs = {
        v.name: v.const_value.base_dir
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }
    if base_dirs:
        ir.external_data.set_base_dir(new.graph, next(iter(base_dirs.values())))
    return new
