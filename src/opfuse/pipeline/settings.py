"""What shapes the optimized graph (``OptimizeSettings``): the passes (a switch file,
``enable``/``disable``), the cut (``keep_inputs``/``keep_outputs``), the graph options
(fold size, target opset, layout, target) and static input shapes, checked once when made.
``opfuse.optimize`` and ``opfuse.batch`` take it; the command line's graph options
(``cli.options.graph_options``) and pass switches parse into it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opfuse.errors import SettingsError
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT, Options
from opfuse.runtime.targets import builtin_targets

LAYOUTS = ("keep", "nchw", "nhwc")
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class OptimizeSettings:
    """The optimizer's settings besides the model and the verifier, checked when made (a
    ``SettingsError`` names the field). ``static_shapes`` re-declares the inputs with the
    verifier's ``input_shape`` dims (``VerifySettings``)."""

    fusion_switch_file: PathLike | None = None
    enable: Sequence[str] = ()
    disable: Sequence[str] = ()
    keep_inputs: Sequence[str] = ()
    keep_outputs: Sequence[str] = ()
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT
    target_opset: int | None = None
    layout: str = "keep"
    target: str | None = None
    static_shapes: bool = False

    def __post_init__(self) -> None:
        for name in ("enable", "disable", "keep_inputs", "keep_outputs"):
            object.__setattr__(self, name, _names(getattr(self, name)))
        known = builtin_targets()
        if self.target is not None and self.target not in known:
            raise SettingsError(
                "target", self.target, f"unknown; the known targets are {', '.join(known)}"
            )
        if self.layout not in LAYOUTS:
            raise SettingsError("layout", self.layout, f"expected one of {', '.join(LAYOUTS)}")
        if self.fold_size_limit < 0:
            raise SettingsError("fold_size_limit", self.fold_size_limit, "must be 0 or more")

    def options(self) -> Options:
        """The passes' ``Options``."""
        return Options(
            fold_size_limit=self.fold_size_limit,
            target_opset=self.target_opset,
            layout=self.layout,
            target=self.target,
            keep_inputs=list(self.keep_inputs) or None,
            keep_outputs=list(self.keep_outputs) or None,
        )


def _names(values: Iterable[str] | None) -> tuple[str, ...]:
    if isinstance(values, str):  # one name, not its letters
        values = [values]
    return tuple(values or ())
