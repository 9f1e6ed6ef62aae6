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
    ``inputs``: an .npz of input arrays named after the model's inputs, instead of
    generated ones (its arrays give the shapes: not with ``input_shape``; ``optimize
    --benchmark`` times on them too); ``verify_inputs``: its older name (not both);
    ``seed``: of the generated inputs; ``save_failing_inputs``: where a failed
    verification writes its inputs (an .npz ``inputs`` reads back)."""

    rtol: float = 1e-4
    atol: float = 1e-5
    input_shape: Mapping[str, Sequence[int]] = field(default_factory=dict)
    verify_inputs: PathLike | None = None
    seed: int = 0
    save_failing_inputs: PathLike | None = None
    inputs: PathLike | None = None

    def __post_init__(self) -> None:
        check_tolerances(self.rtol, self.atol)
        shapes = {str(k): [int(d) for d in v] for k, v in (self.input_shape or {}).items()}
        object.__setattr__(self, "input_shape", shapes)
        check_inputs(self.inputs, self.verify_inputs, shapes)

    @property
    def inputs_npz(self) -> PathLike | None:
        """The .npz of input arrays: ``inputs``, or its older name ``verify_inputs``."""
        return self.inputs if self.inputs is not None else self.verify_inputs

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


def check_inputs(
    inputs: PathLike | None,
    verify_inputs: PathLike | None,
    shapes: Mapping[str, object] | None,
    shape_field: str = "input_shape",
) -> None:
    """``inputs`` or its older name ``verify_inputs``, not both; and not beside the input
    shapes (``shape_field``: the .npz arrays' shapes are the ones used)."""
    if inputs is not None and verify_inputs is not None:
        raise SettingsError(
            "inputs",
            Path(inputs),
            sentence="{inputs} {value} and {verify_inputs} both give the input arrays "
            "({verify_inputs} is the older name of {inputs}); give {inputs} alone",
        )
    field_name = "inputs" if inputs is not None else "verify_inputs"
    npz = inputs if inputs is not None else verify_inputs
    if npz is not None and shapes:
        raise SettingsError(
            field_name,
            Path(npz),
            sentence=f"{{{shape_field}}} and {{{field_name}}} {{value}} both give the input "
            f"shapes (the .npz arrays' shapes are used); drop {{{shape_field}}}",
        )
