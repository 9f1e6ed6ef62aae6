"""How ``opfuse profile`` and ``opfuse advise`` profile a model with onnxruntime: one typed
settings object (``ProfileSettings``) that checks itself, for the API and for the command
line's one option group (``cli.options.profile_options``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from opfuse.advisor.profile_readers import GRAPH_OPT_LEVELS
from opfuse.errors import SettingsError
from opfuse.verification.settings import check_inputs


def _count(field: str, value: object, least: int) -> None:
    """An int of at least ``least``; else a SettingsError naming ``field``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise SettingsError(field, value, "expected an int")
    if value < least:
        raise SettingsError(field, value, f"must be {least} or more")


@dataclass(frozen=True)
class ProfileSettings:
    """The profiling settings ``opfuse.profile`` and ``opfuse.advise`` share (the options
    ``--runs``, ``--warmup``, ``--threads``, ``--provider``, ``--graph-opt``,
    ``--input-shape``, ``--inputs`` of both commands). ``inputs``: an .npz of arrays named
    after the model's inputs to profile (and time advise's trial) on, instead of generated
    ones (not with ``input_shapes``). A bad value is a ``SettingsError`` on construction
    (``threads=-1: must be 0 or more``)."""

    runs: int = 10  # profiled inference runs
    warmup: int = 2  # runs dropped before profiling
    threads: int = 1  # intra-op threads (0: onnxruntime's default, all the cores)
    provider: str = "CPUExecutionProvider"
    # onnxruntime's graph optimization level while profiling; None: the verb's own
    # (profile: all; advise: disable, a time per node, or all for a QDQ model)
    graph_opt: str | None = None
    input_shapes: Mapping[str, list[int]] | None = None  # dims for dynamic inputs
    inputs: str | os.PathLike[str] | None = None  # an .npz of input arrays

    def __post_init__(self) -> None:
        _count("runs", self.runs, 1)
        _count("warmup", self.warmup, 0)
        _count("threads", self.threads, 0)
        if not isinstance(self.provider, str) or not self.provider:
            raise SettingsError(
                "provider", self.provider, "expected an onnxruntime execution provider's name"
            )
        if self.graph_opt is not None and self.graph_opt not in GRAPH_OPT_LEVELS:
            raise SettingsError(
                "graph_opt", self.graph_opt, f"expected one of {', '.join(GRAPH_OPT_LEVELS)}"
            )
        check_inputs(self.inputs, None, self.input_shapes, "input_shapes")

    def profiling(self) -> ProfileSettings:
        """These settings alone (an ``AdviseOptions`` without what advise adds)."""
        return ProfileSettings(
            self.runs,
            self.warmup,
            self.threads,
            self.provider,
            self.graph_opt,
            self.input_shapes,
            self.inputs,
        )
