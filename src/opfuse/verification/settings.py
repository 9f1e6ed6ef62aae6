"""How the verifier compares two models (``VerifySettings``): the tolerances, the inputs
(their shapes, an .npz of them, or the seed of random ones) and where a failure's inputs
go. ``opfuse.optimize``, ``opfuse.verify`` and ``opfuse.batch`` take it; the command line's
verifier options (``cli.options.verifier_options``) parse into it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opfuse.errors import SettingsError

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class VerifySettings:
    """The verifier's settings, checked when made (a ``SettingsError`` names the field).

    ``input_shape``: dims for the dynamic inputs (``{"x": [1, 3, 224, 224]}``);
    ``verify_inputs``: an .npz of input arrays instead of random ones (its arrays give the
    shapes: not with ``input_shape``); ``seed``: of the random inputs;
    ``save_failing_inputs``: where a failed verification writes its inputs (an .npz
    ``verify_inputs`` reads back)."""

    rtol: float = 1e-4
    atol: float = 1e-5
    input_shape: Mapping[str, Sequence[int]] = field(default_factory=dict)
    verify_inputs: PathLike | None = None
    seed: int = 0
    save_failing_inputs: PathLike | None = None

    def __post_init__(self) -> None:
        check_tolerances(self.rtol, self.atol)
        shapes = {str(k): [int(d) for d in v] for k, v in (self.input_shape or {}).items()}
        object.__setattr__(self, "input_shape", shapes)
        if self.verify_inputs is not None and shapes:
            raise SettingsError(
                "verify_inputs",
                Path(self.verify_inputs),
                sentence="{input_shape} and {verify_inputs} {value} both give the input "
                "shapes (the .npz arrays' shapes are used); drop {input_shape}",
            )

    @property
    def shapes(self) -> dict[str, list[int]]:
        """``input_shape`` as the verifier reads it (a dict of lists of ints)."""
        return {k: list(v) for k, v in self.input_shape.items()}


def check_tolerances(rtol: float, atol: float) -> None:
    """Both tolerances are finite numbers of at least 0 (a negative bound fails every
    output, an infinite or NaN one passes every output)."""
    import math

    for name, value in (("rtol", rtol), ("atol", atol)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise SettingsError(name, value, "must be a finite number of 0 or more")
