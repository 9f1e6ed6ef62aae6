"""The model's default-domain opset, and its conversion with onnx's version converter
(``--target-opset``; a model below ``io.MIN_OPSET`` is converted up to it)."""

from __future__ import annotations

import os

import onnx
import onnx.version_converter
import onnx_ir as ir

from opfuse.errors import OpfuseError, first_line
from opfuse.model import io
from opfuse.model.graphs import DEFAULT_DOMAINS
from opfuse.model.value_info import DECLARED_KEY


def default_opset(model: ir.Model) -> int | None:
    """The model's default-domain opset; None when it imports only other domains."""
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def raise_ir_version(proto: onnx.ModelProto) -> None:
    """Raise ``proto``'s IR version to the lowest its opsets need (in place; never lowered).
    onnx's version converter keeps the IR version: a torch export of IR 3 (opset 6)
    converted to opset 13 stays IR 3, where every initializer must also be a graph input,
    so each one a later step adds (a quantization scale) made the model invalid. From IR 4
    on, an initializer that is also an input stays an input with a default: nothing of the
    model's interface changes."""
    need = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    proto.ir_version = max(proto.ir_version, need)


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
    raise_ir_version(converted)
    new = io.from_proto(converted)
    if DECLARED_KEY in model.meta:  # the values the input file described keep that
        new.meta[DECLARED_KEY] = model.meta[DECLARED_KEY]
    base_dirs = {
        v.name: v.const_value.base_dir
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }
    if base_dirs:
        ir.external_data.set_base_dir(new.graph, next(iter(base_dirs.values())))
    return new


def converted_if_old(path: str | os.PathLike[str]) -> onnx.ModelProto | None:
    """The model at ``path`` converted to ``io.MIN_OPSET`` when it is below it, else None:
    what to run instead of a model onnxruntime cannot load (it has no kernels for many ops
    below opset 7: BatchNormalization-6), as the verifier checks an output against that
    conversion. Called only once the model has failed to load (it reads the whole file)."""
    try:
        header = onnx.load_model(str(path), load_external_data=False)
    except Exception:  # not a model protobuf reads: the load failure stands (exit 2)
        return None
    old = next((o.version for o in header.opset_import if o.domain in DEFAULT_DOMAINS), None)
    if old is None or old >= io.MIN_OPSET:
        return None
    return io.to_proto(convert_opset(io.load_model(path), io.MIN_OPSET))
