"""The public Python API (re-exported by ``opfuse``): optimize and verify a model given as
a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``; keyword names are the CLI's.

An in-memory model goes through the same checks and the same verifier as a file: it is
written to a temporary folder first (so a bad model is a one-line ``OpfuseError``, and
verification can re-run the original). The model given is never changed.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, overload

import onnx
import onnx_ir as ir

from opfuse import io
from opfuse.advisor.target import builtin_targets
from opfuse.api import OptimizeResult, optimize_file
from opfuse.errors import OpfuseError
from opfuse.passes import all_passes
from opfuse.phases import Phases
from opfuse.registry import PassInfo
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT, Options
from opfuse.verify import VerifyReport, compare_files

if TYPE_CHECKING:
    from typing_extensions import Unpack

ModelInput = str | os.PathLike[str] | onnx.ModelProto | ir.Model
LAYOUTS = ("keep", "nchw", "nhwc")


class OptimizeKeywords(TypedDict, total=False):
    """The keywords of ``optimize`` (each one a CLI option of ``opfuse optimize``)."""

    output: str | os.PathLike[str] | None
    fusion_switch_file: str | os.PathLike[str] | None
    enable: Iterable[str]
    disable: Iterable[str]
    keep_inputs: Sequence[str] | None
    keep_outputs: Sequence[str] | None
    fusion_result: str | os.PathLike[str] | None
    verify: bool
    rtol: float
    atol: float
    input_shape: Mapping[str, Sequence[int]] | None
    verify_inputs: str | os.PathLike[str] | None
    seed: int
    save_failing_inputs: str | os.PathLike[str] | None
    bisect: bool
    fold_size_limit: int
    target_opset: int | None
    layout: str
    target: str | None
    phases: Phases | None


def check_target(target: str | None) -> None:
    """``--target`` names one of the built-in targets."""
    known = builtin_targets()
    if target is not None and target not in known:
        raise OpfuseError(f"--target {target!r}: unknown; the known targets are {', '.join(known)}")


def make_options(
    *,
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT,
    target_opset: int | None = None,
    layout: str = "keep",
    target: str | None = None,
    keep_inputs: Sequence[str] | None = None,
    keep_outputs: Sequence[str] | None = None,
) -> Options:
    """The passes' ``Options`` from the CLI's option names, checked."""
    check_target(target)
    if layout not in LAYOUTS:
        raise OpfuseError(f"--layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if fold_size_limit < 0:
        raise OpfuseError(f"--fold-size-limit {fold_size_limit}: must be 0 or more")
    return Options(
        fold_size_limit=fold_size_limit,
        target_opset=target_opset,
        layout=layout,
        target=target,
        keep_inputs=list(keep_inputs) if keep_inputs else None,
        keep_outputs=list(keep_outputs) if keep_outputs else None,
    )


def _as_file(model: ModelInput, folder: Path, name: str) -> Path:
    """A path to ``model``: the path itself, or the in-memory model written to ``folder``."""
    if isinstance(model, str | os.PathLike):
        return Path(model)
    path = folder / name
    if isinstance(model, onnx.ModelProto):
        try:
            data = model.SerializeToString()
        except ValueError as exc:  # over protobuf's 2 GB
            raise OpfuseError(f"cannot serialize the ModelProto: {exc}") from None
        io.write_bytes(path, data, what="the model")
        return path
    if isinstance(model, ir.Model):
        return io.save_model(model, path)
    raise OpfuseError(
        f"expected a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}"
    )


@overload
def optimize(
    model: onnx.ModelProto, **options: Unpack[OptimizeKeywords]
) -> OptimizeResult[onnx.ModelProto]: ...
@overload
def optimize(
    model: ir.Model | str | os.PathLike[str], **options: Unpack[OptimizeKeywords]
) -> OptimizeResult[ir.Model]: ...
def optimize(
    model: ModelInput,
    *,
    output: str | os.PathLike[str] | None = None,
    fusion_switch_file: str | os.PathLike[str] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    keep_inputs: Sequence[str] | None = None,
    keep_outputs: Sequence[str] | None = None,
    fusion_result: str | os.PathLike[str] | None = None,
    verify: bool = True,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shape: Mapping[str, Sequence[int]] | None = None,
    verify_inputs: str | os.PathLike[str] | None = None,
    seed: int = 0,
    save_failing_inputs: str | os.PathLike[str] | None = None,
    bisect: bool = True,
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT,
    target_opset: int | None = None,
    layout: str = "keep",
    target: str | None = None,
    phases: Phases | None = None,
) -> OptimizeResult[onnx.ModelProto] | OptimizeResult[ir.Model]:
    """Optimize ``model`` (a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``) and
    verify the result against it under onnxruntime.

    Returns an ``OptimizeResult`` whose ``model`` is of the kind given (an
    ``onnx_ir.Model`` for a path); the model given is left unchanged. ``output`` also
    writes the result to that file (atomically; never over the input). The keywords are
    ``opfuse optimize``'s options. Raises ``OpfuseError`` on bad input and
    ``VerificationError`` (naming the first pass whose output differs) when the outputs
    differ beyond ``atol * max(1, max|ref|) + rtol * |ref|``.
    """
    options = make_options(
        fold_size_limit=fold_size_limit,
        target_opset=target_opset,
        layout=layout,
        target=target,
        keep_inputs=keep_inputs,
        keep_outputs=keep_outputs,
    )
    workdir = tempfile.TemporaryDirectory(prefix="opfuse-")
    folder = Path(workdir.name)
    source = _as_file(model, folder, "input.onnx")
    result = optimize_file(
        source,
        output if output is not None else folder / "optimized.onnx",
        fusion_switch_file=fusion_switch_file,
        enable=list(enable),
        disable=list(disable),
        options=options,
        verify=verify,
        rtol=rtol,
        atol=atol,
        input_shapes={k: [int(d) for d in v] for k, v in (input_shape or {}).items()},
        inputs_npz=verify_inputs,
        seed=seed,
        fusion_result=fusion_result,
        save_failing_inputs=save_failing_inputs,
        bisect=bisect,
        phases=phases,
    )
    result.output = Path(output) if output is not None else None
    if isinstance(model, onnx.ModelProto):
        proto_result: OptimizeResult[onnx.ModelProto] = dataclasses.replace(
            result,  # type: ignore[arg-type, assignment]
            model=ir.to_proto(result.model),
        )
        workdir.cleanup()
        return proto_result
    result.workdir = workdir  # lazy external tensors may still read from it
    return result


def verify(
    original: ModelInput,
    optimized: ModelInput,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    input_shape: Mapping[str, Sequence[int]] | None = None,
    verify_inputs: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Run both models (paths or in-memory models) under onnxruntime with its graph
    optimizations off on the same inputs and compare every output by name.

    Never raises for differing outputs: read ``report.ok`` and ``report.outputs``
    (each with its error, the bound applied and the share of it the worst element used).
    Raises ``OpfuseError`` on bad input."""
    with tempfile.TemporaryDirectory(prefix="opfuse-") as tmp:
        a = _as_file(original, Path(tmp), "original.onnx")
        b = _as_file(optimized, Path(tmp), "optimized.onnx")
        for path in (a, b):
            io.read_proto(path)
        return compare_files(
            a,
            b,
            rtol=rtol,
            atol=atol,
            input_shapes={k: [int(d) for d in v] for k, v in (input_shape or {}).items()},
            inputs_npz=verify_inputs,
            seed=seed,
        )


def passes() -> list[PassInfo]:
    """Every pass in execution order: switch name, section, default, opset range, what it
    does (``info.description``)."""
    return all_passes()
