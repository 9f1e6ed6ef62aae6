"""Online mode (Grappler's runtime optimization, seed 004): optimize a model in memory
for one onnxruntime session; the model file is never changed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir
import onnxruntime as ort

from opfuse.api import OptimizeResult
from opfuse.errors import OpfuseError
from opfuse.public import optimize

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from opfuse.public import OptimizeKeywords

PROTOBUF_LIMIT = 2**31 - 1


class InferenceSession(ort.InferenceSession):  # type: ignore[misc]
    """A drop-in for ``onnxruntime.InferenceSession`` that runs the opfuse-optimized model.

    ``path_or_model``: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model`` (or the
    serialized bytes onnxruntime takes). ``sess_options``, ``providers`` and
    ``provider_options`` go to onnxruntime unchanged; other keywords are
    ``opfuse.optimize``'s (verification is on by default: the session is built only on
    a model that verified). ``optimize_result`` tells what was done.
    """

    def __init__(
        self,
        path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto | ir.Model,
        sess_options: ort.SessionOptions | None = None,
        providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        **optimize_options: Unpack[OptimizeKeywords],
    ) -> None:
        if optimize_options.get("output") is not None:
            raise OpfuseError("InferenceSession optimizes in memory; it takes no output")
        model = (
            onnx.load_model_from_string(path_or_model)
            if isinstance(path_or_model, bytes)
            else path_or_model
        )
        result = optimize(model, **optimize_options)
        self.optimize_result: OptimizeResult[Any] = result
        optimized = result.model
        proto = optimized if isinstance(optimized, onnx.ModelProto) else ir.to_proto(optimized)
        if proto.ByteSize() > PROTOBUF_LIMIT:
            raise OpfuseError(
                "the optimized model is over 2 GB: write it with opfuse.optimize(..., output=) "
                "and load that file in onnxruntime"
            )
        super().__init__(proto.SerializeToString(), sess_options, providers, provider_options)
