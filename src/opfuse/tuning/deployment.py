"""The deployment file ``opfuse tune`` writes beside the tuned model
(``OUTPUT.session.json``, schema ``opfuse.session/2``; schema 1 held the session
settings alone): everything the measured result
depends on, so that it deploys as measured.

- the session settings (onnxruntime's SessionOptions names, at the top level, as in
  schema 1, so a plain-onnxruntime loader reads them directly);
- ``graph``: the optimize settings tune chose (the passes switched on/off from their
  defaults, the CANN switch file's content, the target opset, the layout, static input
  shapes), or ``original: true`` when the tuned model is the input unchanged;
- ``model`` and ``source``: the file names and SHA-256 of the tuned model and of the
  model tune read, so that ``opfuse.InferenceSession`` can tell which one it is given:
  the tuned model runs as written, any other (the original) is rebuilt with ``graph``;
- ``measured``: the figures (``graph``, ``session``) and the ``inputs`` they were timed on
  (shapes, generated or the user's .npz: a speed measured on toy shapes says so).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opfuse.errors import OpfuseError
from opfuse.runtime.settings import SessionSettings, read_session_json
from opfuse.tuning.variants import Variant


@dataclass(frozen=True)
class GraphSettings:
    """The optimize settings of the tuned model (``original``: it is the input as is)."""

    original: bool = False
    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    target_opset: int | None = None
    layout: str = "keep"
    static_shapes: bool = False
    input_shapes: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, variant: Variant, input_shapes: Mapping[str, list[int]] | None = None
    ) -> GraphSettings:
        if variant.original:
            return cls(original=True)
        return cls(
            enable=tuple(name for name, on in variant.switches if on),
            disable=tuple(name for name, on in variant.switches if not on),
            target_opset=variant.target_opset,
            layout=variant.layout,
            static_shapes=variant.static_shapes,
            input_shapes=dict(input_shapes or {}) if variant.static_shapes else {},
        )

    def optimize_keywords(self) -> dict[str, Any]:
        """``opfuse.optimize``'s keywords that rebuild the tuned model from the original."""
        keywords: dict[str, Any] = {
            "enable": list(self.enable),
            "disable": list(self.disable),
            "target_opset": self.target_opset,
            "layout": self.layout,
        }
        if self.static_shapes:
            keywords.update(static_shapes=True, input_shape=self.input_shapes)
        return keywords

    def to_json(self, variant: Variant) -> dict[str, object]:
        return {
            "original": self.original,
            "enable": list(self.enable),
            "disable": list(self.disable),
            "fusion_switch": None if self.original else variant.switch_file(),
            "target_opset": self.target_opset,
            "layout": self.layout,
            "static_shapes": self.static_shapes,
            "input_shapes": self.input_shapes,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> GraphSettings:
        if not isinstance(data, dict):
            raise OpfuseError(f"{where}: 'graph' is not an object")
        try:
            settings = cls(
                original=bool(data.get("original", False)),
                enable=tuple(_names(data.get("enable", []), "enable", where)),
                disable=tuple(_names(data.get("disable", []), "disable", where)),
                target_opset=_opset(data.get("target_opset"), where),
                layout=str(data.get("layout", "keep")),
                static_shapes=bool(data.get("static_shapes", False)),
                input_shapes={
                    str(k): [int(d) for d in v]
                    for k, v in dict(data.get("input_shapes") or {}).items()
                },
            )
        except (TypeError, ValueError) as exc:
            raise OpfuseError(f"{where}: 'graph': {exc}") from None
        if settings.layout not in ("keep", "nchw", "nhwc"):
            raise OpfuseError(f"{where}: 'graph': layout {settings.layout!r} is not keep/nchw/nhwc")
        return settings


def _names(value: object, key: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise OpfuseError(f"{where}: 'graph': {key} is not a list of pass names")
    return value


def _opset(value: object, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OpfuseError(f"{where}: 'graph': target_opset {value!r} is not an opset")
    return value


@dataclass
class Deployment:
    """A session file read back: the session settings, and for schema 2 the graph
    settings and the tuned model's fingerprint."""

    session: SessionSettings
    graph: GraphSettings | None = None  # None: a schema-1 file (session settings only)
    model_sha256: str | None = None
    source_sha256: str | None = None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def deployment_json(
    session: SessionSettings,
    variant: Variant,
    input_shapes: Mapping[str, list[int]] | None,
    model: str | os.PathLike[str],
    source: str | os.PathLike[str],
    switch_file: str | os.PathLike[str],
    command: str,
    measured: Mapping[str, object],
) -> dict[str, object]:
    """The content of the deployment file (see the module)."""
    return {
        **session.to_json(),
        "graph": {
            **GraphSettings.of(variant, input_shapes).to_json(variant),
            "switch_file": str(switch_file),
            "command": command,
        },
        "model": {"file": Path(model).name, "sha256": sha256_file(model)},
        "source": {"file": str(source), "sha256": sha256_file(source)},
        "measured": dict(measured),
    }


def read_deployment(path: str | os.PathLike[str]) -> Deployment:
    """A session file ``opfuse tune`` wrote (schema 1 or 2); one-line OpfuseError."""
    data = read_session_json(path)
    session = SessionSettings.from_json(data, str(path))
    if "graph" not in data:  # schema 1, or the session settings alone
        return Deployment(session)
    model, source = data.get("model") or {}, data.get("source") or {}
    return Deployment(
        session,
        GraphSettings.from_json(data["graph"], str(path)),
        model.get("sha256") if isinstance(model, dict) else None,
        source.get("sha256") if isinstance(source, dict) else None,
    )
