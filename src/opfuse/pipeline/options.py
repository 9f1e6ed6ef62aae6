"""The optimizer's ``Options`` from the command line's option names, checked (shared by
the CLI, the Python API and batch)."""

from __future__ import annotations

from collections.abc import Sequence

from opfuse.errors import OpfuseError
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT, Options
from opfuse.runtime.targets import builtin_targets

LAYOUTS = ("keep", "nchw", "nhwc")


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
