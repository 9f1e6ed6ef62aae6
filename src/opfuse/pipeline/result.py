"""What one optimize run did (``OptimizeResult``) and its renderings: the summary's lines,
the JSON ``optimize --format json`` prints, the time per phase, the verification line."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import onnx
import onnx_ir as ir

from opfuse.errors import OpfuseError
from opfuse.model import io
from opfuse.rewrite.stats import EffectLog
from opfuse.verification.compare import VerifyReport
from opfuse.verification.messages import inputs_text, worst_share

ModelT = TypeVar("ModelT")


@dataclass(repr=False)
class OptimizeResult(Generic[ModelT]):
    """What one optimize run did. ``model`` is the optimized model, of the kind given to
    ``opfuse.optimize`` (an ``onnx.ModelProto`` for a ModelProto, an ``onnx_ir.Model``
    for an onnx_ir.Model or a path); ``summary()`` says what changed, ``save()`` writes it."""

    model: ModelT
    log: EffectLog
    passes: list[str]  # the passes that ran, in execution order
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # parts of the model no pass touched because onnx-ir cannot hold them (map types...)
    left_alone: list[str] = field(default_factory=list)
    before: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    seconds: float = 0.0  # the passes' time (timings has every phase)
    verify: VerifyReport | None = None
    input_bytes: int = 0
    output_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # seconds per stage of passes over all rounds (the rules of one worklist share a stage)
    pass_seconds: dict[str, float] = field(default_factory=dict)
    output: Path | None = None  # the file written, when one was asked for
    # a temporary folder the model's lazy external tensors still read from
    workdir: Any = field(default=None, compare=False)

    @property
    def changed(self) -> bool:
        """Whether any pass changed the model."""
        return self.log.effected() > 0 or bool(self.notes)

    def fired(self) -> list[str]:
        """The passes that changed the model, in execution order."""
        return [name for name in self.passes if self.log.effected(name) > 0]

    def __repr__(self) -> str:
        verified = "off" if self.verify is None else ("ok" if self.verify.ok else "FAILED")
        return (
            f"<OptimizeResult {type(self.model).__name__}: nodes {sum(self.before.values())} -> "
            f"{sum(self.after.values())}, {len(self.fired())} passes fired, {self.rounds} rounds, "
            f"verification {verified}>"
        )

    def summary(self) -> str:
        """A few lines: node counts, what changed, verification, time per phase."""
        n_before, n_after = sum(self.before.values()), sum(self.after.values())
        lines = [f"nodes {n_before} -> {n_after}"]
        changes = sorted(
            (op for op in set(self.before) | set(self.after) if self.before[op] != self.after[op]),
            key=lambda op: (self.after[op] - self.before[op], op),
        )
        if changes:
            lines[0] += ": " + ", ".join(
                f"{op} {self.before[op]} -> {self.after[op]}" for op in changes
            )
        fired = self.fired()
        if fired:
            lines.append(f"passes that fired ({self.rounds} rounds): {', '.join(fired)}")
        else:
            lines.append("no pass changed the model")
        lines.append(f"verification: {verification_text(self.verify)}")
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"left alone: {part}" for part in self.left_alone]
        if self.timings:
            lines.append("time: " + timings_text(self.timings))
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        """The machine-readable summary ``optimize --format json`` prints."""
        per_pass: dict[str, dict[str, int]] = {}
        for s in self.log:
            entry = per_pass.setdefault(s.pass_name, {"matched": 0, "effected": 0})
            entry["matched"] += s.matched
            entry["effected"] += s.effected
        return {
            "schema": "opfuse.optimize/1",
            "changed": self.changed,
            "output": None if self.output is None else str(self.output),
            "nodes": {"before": sum(self.before.values()), "after": sum(self.after.values())},
            "op_types": {
                op: {"before": self.before[op], "after": self.after[op]}
                for op in sorted(set(self.before) | set(self.after))
            },
            "bytes": {"before": self.input_bytes, "after": self.output_bytes},
            "rounds": self.rounds,
            "passes": [{"name": name, **per_pass.get(name, {})} for name in self.passes],
            "patterns": [
                {
                    "pass": s.pass_name,
                    "pattern": s.pattern,
                    "matched": s.matched,
                    "effected": s.effected,
                }
                for s in self.log
            ],
            "verification": None if self.verify is None else self.verify.to_json(),
            "warnings": self.warnings,
            "notes": self.notes,
            "left_alone": self.left_alone,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "pass_seconds": {k: round(v, 4) for k, v in self.pass_seconds.items()},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the optimized model to ``path`` atomically (external data beside it when
        the weights are over 2 GB or came from external data)."""
        model = self.model
        if isinstance(model, onnx.ModelProto):
            return io.write_bytes(path, model.SerializeToString(), what="the model")
        if not isinstance(model, ir.Model):
            raise OpfuseError(f"cannot save a {type(model).__name__}")
        return io.save_model(model, path)


def timings_text(timings: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in timings.items())


def verification_text(report: VerifyReport | None) -> str:
    if report is None:
        return "off"
    if not report.ok:
        return "FAILED"
    n = len(report.outputs)
    return (
        f"ok ({n} output{'s' if n != 1 else ''}, {worst_share(report)}; "
        f"inputs {inputs_text(report)})"
    )
