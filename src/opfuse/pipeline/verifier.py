"""Step 4 of ``optimize_file``: the optimized model, staged, against the input under
onnxruntime; on a failure, the first pass to blame (a bisection over the optional passes
that fired, each step a re-optimization with some of them off) and the inputs saved."""

from __future__ import annotations

import io as _bytes_io
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx_ir as ir

from opfuse.errors import OpfuseError, VerificationError
from opfuse.model import io
from opfuse.pipeline.opset import convert_opset, default_opset
from opfuse.pipeline.phases import Phases
from opfuse.pipeline.result import OptimizeResult
from opfuse.rules import get_pass
from opfuse.verification.bisect import first_bad_pass
from opfuse.verification.compare import OptimizedModelError, VerifyReport, compare_files, session
from opfuse.verification.messages import failure_message
from opfuse.verification.settings import VerifySettings

Path_ = str | os.PathLike[str]


class Verification:
    """The reference (the input, or its conversion when onnxruntime cannot load its opset),
    its comparison with a candidate, and the bisection that blames a pass.

    ``settings``: the tolerances, the inputs, where a failure's inputs go.
    ``reoptimize(disabled)``: the input optimized again with the passes ``disabled`` off
    too (the bisection's probe); ``None`` turns the bisection off."""

    def __init__(
        self,
        input_path: Path_,
        settings: VerifySettings | None = None,
        *,
        reoptimize: Callable[[list[str]], ir.Model] | None = None,
        external: bool | None = None,
        phases: Phases | None = None,
    ) -> None:
        self.reference: Path_ = input_path
        self.input_path = input_path
        self.settings = settings or VerifySettings()
        self.reoptimize = reoptimize
        self.external = external  # the bisection's models keep the output's external data
        self.phases = phases or Phases()

    def compare(self, candidate: Path_) -> VerifyReport:
        """Both models on the same inputs; OptimizedModelError when the candidate cannot
        load or run (OpfuseError about the reference or the user's inputs)."""
        return compare_files(
            self.reference,
            candidate,
            rtol=self.settings.rtol,
            atol=self.settings.atol,
            input_shapes=self.settings.shapes,
            inputs_npz=self.settings.inputs_npz,
            seed=self.settings.seed,
        )

    def check(self, result: OptimizeResult[ir.Model], original: ir.Model, staged: Path) -> None:
        """Verify ``staged`` (``result.model`` written) against the input model
        (``original``, as loaded): ``result.verify`` on success, else VerificationError
        naming the first pass to blame."""
        self.reference = self._reference(original, staged, result)
        try:
            result.verify = self.compare(staged)
        except OptimizedModelError as exc:  # it cannot load or run in onnxruntime: our fault
            text = str(exc).replace(str(staged), "the optimized model")
            raise self.failure(result, text) from None
        except OpfuseError as exc:  # about the reference: name the user's model, not a stage
            if self.reference == self.input_path:
                raise
            converted = f"{self.input_path} as onnx's version converter converts it"
            raise OpfuseError(str(exc).replace(str(self.reference), converted)) from None
        if not result.verify.ok:
            saved = None
            if self.settings.save_failing_inputs is not None:
                saved = save_inputs(result.verify.feeds, self.settings.save_failing_inputs)
            raise self.failure(result, None, saved)

    def fails_without(self, disabled: list[str]) -> bool:
        """Re-optimize the input with ``disabled`` off too: does verification fail?"""
        assert self.reoptimize is not None
        self.phases.tell(f"bisect: {len(disabled)} passes off")
        model = self.reoptimize(disabled)
        with tempfile.TemporaryDirectory(prefix="opfuse-bisect-") as tmp:
            staged = io.save_model(model, Path(tmp) / "bisect.onnx", external=self.external)
            try:
                return not self.compare(staged).ok
            except OptimizedModelError:
                return True  # the re-optimized model cannot load or run

    def culprit(self, result: OptimizeResult[ir.Model]) -> tuple[str | None, bool]:
        """The first of the optional passes that fired to blame (None when the bisection is
        off or finds none), and whether there was any to search."""
        fired = [n for n in result.fired() if not get_pass(n).mandatory]
        if self.reoptimize is None or not fired:
            return None, False
        with self.phases("bisect"):
            return first_bad_pass(fired, self.fails_without), True

    def failure(
        self, result: OptimizeResult[ir.Model], cannot_run: str | None, saved: Path | None = None
    ) -> VerificationError:
        """The error of a failed verification (``result.verify`` differs, or the optimized
        model cannot run: ``cannot_run``): what differs, the first pass to blame, where the
        inputs were saved."""
        culprit, searched = self.culprit(result)
        report = result.verify
        if cannot_run is not None or report is None:
            hint = (
                f"; the first pass to blame is {culprit}: try --disable {culprit}"
                if culprit
                else ""
            )
            return VerificationError(f"verification failed: {cannot_run}{hint}", culprit=culprit)
        message = failure_message(report, culprit, searched, None if saved is None else str(saved))
        return VerificationError(f"verification failed: {message}", report=report, culprit=culprit)

    def _reference(
        self, original: ir.Model, staged: Path, result: OptimizeResult[ir.Model]
    ) -> Path_:
        """The model to verify against: the input, or, when it is at an opset below
        io.MIN_OPSET that onnxruntime cannot load (it has no kernels for many ops there),
        the input as onnx's version converter converts it (saved beside the staged output)."""
        old = default_opset(original)
        if old is None or old >= io.MIN_OPSET or result.model is original:
            return self.input_path
        try:
            session(self.input_path)
        except OpfuseError:
            path = staged.with_name("converted-original.onnx")
            io.save_model(convert_opset(original, io.MIN_OPSET), path)
            result.notes.append(
                f"verified against the model converted to opset {io.MIN_OPSET}: onnxruntime "
                f"cannot load opset {old}"
            )
            return path
        return self.input_path


def save_inputs(feeds: Mapping[str, np.ndarray], path: Path_) -> Path:
    """The verifier's inputs as an .npz that ``--verify-inputs`` reads back."""
    buffer = _bytes_io.BytesIO()
    np.savez(buffer, **cast(dict[str, Any], feeds))  # numpy stubs: ** may bind allow_pickle
    return io.write_bytes(path, buffer.getvalue(), what="the inputs")
