"""The state the quantization steps share: the models in memory (``onnx.ModelProto``,
never file names), the samples split three ways, the quantizer's settings and what each
step did. A recipe runs on its own copy (``Workspace.fork``) so recipes do not see each
other's changes; the samples and the reference outputs are shared, not copied."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from opfuse.errors import OpfuseError, first_line
from opfuse.model.sessions import open_session
from opfuse.quantization.accuracy import (
    OutputAccuracy,
    Task,
    compare_outputs,
    embedding_outputs,
    probability_maps,
    scoring_outputs,
    text_outputs,
)
from opfuse.quantization.model_kind import TOKEN_IDS, mask_input, model_kind

Sample = dict[str, np.ndarray]
Overrides = dict[str, list[dict[str, object]]]


class QuantizeInternalError(OpfuseError):
    """A failure inside quantization on a valid model (onnxruntime's quantizer, or the
    int8 model it made that onnxruntime cannot run): exit status 3, with the fix to try."""

    exit_code = 3


@dataclass
class Workspace:
    """``float_model``: the fused float model the steps may change (equalization,
    smoothing: each verified against ``fused_model``); ``int8_model``: the latest QDQ
    model; ``overrides``: per-tensor activation ranges for onnxruntime's quantizer
    (``TensorQuantOverrides``); ``extra_options``: its other options (workarounds);
    ``exclude``: node names kept in float."""

    name: str  # the user's model, as messages name it
    fused_model: onnx.ModelProto
    float_model: onnx.ModelProto
    calib: list[Sample]
    valid: list[Sample]  # the validation part of the calibration data: chooses
    per_channel: bool = True
    activation_type: str = "uint8"
    calibrate_method: str = "minmax"
    exclude: list[str] = field(default_factory=list)
    overrides: Overrides = field(default_factory=dict)
    extra_options: dict[str, object] = field(default_factory=dict)
    int8_model: onnx.ModelProto | None = None
    notes: list[str] = field(default_factory=list)  # what was worked around, said
    progress: Callable[[str], None] | None = None
    started: float = field(default_factory=time.perf_counter)
    # the float original's outputs on ``valid`` (shared by every fork)
    valid_reference: list[list[np.ndarray]] = field(default_factory=list)
    # what the statistics depend on, by name (never by ``id()``): the float steps that
    # made ``float_model`` from the fused model, the calibration samples, the scope (the
    # folds' halves each get one of their own, with statistics of their own: ``new_scope``)
    lineage: tuple[str, ...] = ()
    samples_key: str = "calibration"
    scope: str = "main"
    stats: Statistics = field(default_factory=lambda: Statistics())  # shared by every fork
    # where onnxruntime's calibration ranges are kept between quantizations of one float
    # model on one sample set (its calibration_cache_path): a fallback try does not
    # calibrate again
    cache_dir: Path | None = None

    def calibration_cache(self) -> Path | None:
        if self.cache_dir is None:
            return None
        model = "+".join(self.lineage) or "fused"
        key = f"{self.scope}-{model}-{self.samples_key}-{self.calibrate_method}"
        return self.cache_dir / f"calibration-{key}.json"

    @property
    def model_key(self) -> tuple[str, tuple[str, ...]]:
        """What a statistic of the float model depends on: the scope and the lineage."""
        return self.scope, self.lineage

    def replace_float_model(self, model: onnx.ModelProto, step: str) -> None:
        """The float model ``step`` made (its lineage grows by the step's name)."""
        self.float_model = model
        self.lineage = (*self.lineage, step)

    def use_samples(self, calib: list[Sample], key: str) -> None:
        """Calibrate on ``calib``, named ``key`` in the statistics' keys."""
        self.calib, self.samples_key = calib, key

    def new_scope(self, name: str) -> None:
        """Statistics of its own, and calibration files no other scope reads (a fold's
        half: its statistics are its own half's)."""
        self.stats = Statistics()
        self.scope = f"{name}{next(_SCOPES)}"

    def fork(self) -> Workspace:
        """A copy for one recipe: models and lists copied, samples and caches shared."""
        return replace(
            self,
            float_model=self.float_model,  # steps replace it, never change it in place
            exclude=list(self.exclude),
            overrides=dict(self.overrides),
            extra_options=dict(self.extra_options),
            notes=self.notes,  # workarounds found in one recipe hold for all
        )

    def say(self, text: str) -> None:
        """A progress line (with the seconds since the start)."""
        if self.progress is not None:
            self.progress(f"[{time.perf_counter() - self.started:5.1f} s] {text}")

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.fused_model.graph.output]

    @property
    def scoring(self) -> set[str]:
        return self._outputs_of("scoring", scoring_outputs)

    @property
    def maps(self) -> set[str]:
        """The outputs a Sigmoid makes: judged by their map IoU where they are maps."""
        return self._outputs_of("maps", probability_maps)

    def _outputs_of(self, key: str, find: Callable[[onnx.ModelProto], set[str]]) -> set[str]:
        """The fused model's outputs ``find`` picks, found once per scope."""
        if key not in self.stats.outputs:
            self.stats.outputs[key] = find(self.fused_model)
        return self.stats.outputs[key]

    def score(
        self,
        model: onnx.ModelProto,
        samples: list[Sample] | None = None,
        reference: list[list[np.ndarray]] | None = None,
    ) -> list[OutputAccuracy]:
        """``model`` against the float original on the validation part (or ``samples``
        with their ``reference``)."""
        if samples is None:
            samples, reference = self.valid, self.valid_reference
        got = run_model(model, samples, self.name, internal=True)
        return self.compare(reference or [], got, samples)

    def compare(
        self,
        reference: list[list[np.ndarray]],
        got: list[list[np.ndarray]],
        samples: list[Sample],
        task: Task | None = None,
    ) -> list[OutputAccuracy]:
        """The figures of ``got`` against ``reference`` on ``samples``, each output by its
        kind's measure (classes, maps, texts, embeddings pooled over the samples' masks),
        and ``task``'s figures (the labels' accuracy, the user's metric) where given."""
        mask = self._mask()
        masks = [s.get(mask) if mask is not None else None for s in samples]
        logits = self._outputs_of("logits", lambda m: set(model_kind(m).logits))
        ids = [s.get(TOKEN_IDS) for s in samples] if logits else []
        figures = compare_outputs(
            self.output_names,
            reference,
            got,
            self.scoring,
            self.maps,
            embeddings=self.embeddings,
            masks=masks,
            texts=self._outputs_of("texts", text_outputs),
            logits=logits,
            token_ids=ids,
        )
        if task is None:
            return figures
        return task.figures(self.output_names, reference, got, figures, self.scoring)

    @property
    def embeddings(self) -> set[str]:
        """The outputs that hold embeddings: judged by cosine and neighbours."""
        return self._outputs_of("embeddings", embedding_outputs)

    def _mask(self) -> str | None:
        found = self._outputs_of("mask", lambda m: {n for n in [mask_input(m)] if n})
        return next(iter(found), None)


@dataclass
class StepReport:
    """What one step of a recipe did (``steps``): the layers (pairs, tensors) it changed,
    in words, or why it was dropped."""

    step: str
    changed: int  # layers (pairs, tensors) the step changed
    detail: str = ""
    dropped: bool = False  # it failed its check (or raised) and was left out

    def describe(self) -> str:
        if self.dropped:
            return f"{self.step}: dropped ({self.detail})"
        return f"{self.step}: {self.detail}" if self.detail else self.step

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "changed": self.changed,
            "detail": self.detail,
            "dropped": self.dropped,
        }


_SCOPES = itertools.count(1)
ModelKey = tuple[str, tuple[str, ...]]  # a scope and a float model's lineage


@dataclass
class Statistics:
    """What the steps compute once and read back, each keyed by what it depends on (the
    scope and the float model's lineage, ``Workspace.model_key``; the samples' key; the
    estimator), never by an object's identity: ``ranges`` (a ranges step's activation
    ranges), ``float_changes`` (a float step's model and count, or why it was dropped),
    ``stems`` (the stem's node names), ``outputs`` (the outputs a measure picks)."""

    ranges: dict[tuple[ModelKey, str, str, str], dict[str, tuple[float, float]]] = field(
        default_factory=dict
    )
    float_changes: dict[tuple[ModelKey, str], tuple[onnx.ModelProto, int] | StepReport] = field(
        default_factory=dict
    )
    stems: dict[ModelKey, list[str]] = field(default_factory=dict)
    outputs: dict[str, set[str]] = field(default_factory=dict)


def run_model(
    model: onnx.ModelProto | str | os.PathLike[str],
    samples: list[Sample],
    name: str,
    *,
    internal: bool = False,
) -> list[list[np.ndarray]]:
    """The model's outputs per sample on onnxruntime CPU at its default optimizations
    (what a deployment runs: its int8 kernels come from its QDQ fusion). ``internal``:
    the model is one quantization made (a failure is exit 3, not bad input)."""
    try:  # the failure is worded below
        sess = open_session(model, threads=0, errors="onnxruntime")
        return [sess.run(None, s) for s in samples]
    except Exception as exc:  # onnxruntime's own exception types
        if internal:
            raise QuantizeInternalError(
                f"{name}: onnxruntime cannot run the int8 model quantization made: "
                f"{first_line(exc)}; try --exclude with the op type it names, or --per-tensor"
            ) from None
        raise OpfuseError(
            f"{name}: onnxruntime cannot run it on the samples: {first_line(exc)}"
        ) from None
