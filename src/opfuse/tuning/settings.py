"""What ``opfuse tune`` searches and how (``TuneSettings``): one typed object that checks
itself, in the API's terms (``budget=0: must be more than 0``); the command line says the
same with its flags (``cli.options.flag_error``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opfuse.errors import SettingsError
from opfuse.runtime import RUNTIMES
from opfuse.runtime.settings import RuntimeSettings, SessionSettings
from opfuse.tuning.search import SearchSettings
from opfuse.tuning.variants import LAYOUTS
from opfuse.verification.settings import check_inputs, check_tolerances


@dataclass(frozen=True)
class TuneSettings:
    """The settings of ``opfuse.tune`` (its keywords, ``opfuse tune``'s options) but the
    runtime measured on (``RuntimeSettings``) and the output paths.

    The model's interface is the caller's: variants that change its inputs are tried only
    when asked, by ``layout`` (the layouts to try), ``static_shapes`` (the inputs
    re-declared with the ``input_shape`` dims) or ``allow_interface_change`` (all of them).
    ``session_search``: after the graph, search the session settings (threads up to
    ``max_threads``, default the machine's cores; the ``runtimes``, default the one
    measured on). ``inputs``: an .npz of arrays named after the model's inputs, which
    every variant is verified and timed on (``verify_inputs``: its older name); without
    it, generated inputs (the result names their shapes)."""

    budget: float = 120.0  # seconds of search (trials in progress end)
    rtol: float = 1e-4
    atol: float = 1e-5
    input_shape: Mapping[str, Sequence[int]] | None = None  # dims for dynamic inputs
    verify_inputs: str | os.PathLike[str] | None = None  # the older name of ``inputs``
    static_shapes: bool = False
    layout: Sequence[str] = ()
    allow_interface_change: bool = False
    session_search: bool = True
    max_threads: int | None = None
    runtimes: Sequence[str] | None = None
    inputs: str | os.PathLike[str] | None = None  # .npz: verification and timing

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", tuple(self.layout))
        if self.runtimes is not None:
            object.__setattr__(self, "runtimes", tuple(self.runtimes))
        if not self.budget > 0:
            raise SettingsError("budget", float(self.budget), "must be more than 0")
        check_tolerances(self.rtol, self.atol)
        check_inputs(self.inputs, self.verify_inputs, self.input_shape)
        if self.static_shapes and not self.input_shape:
            raise SettingsError(
                "static_shapes",
                True,
                sentence="{static_shapes} needs {input_shape} NAME:D0,D1,... for the inputs",
            )
        for name in self.layout:
            if name not in LAYOUTS:
                raise SettingsError("layout", name, f"expected {' or '.join(LAYOUTS)}")
        if self.max_threads is not None and self.max_threads < 1:
            raise SettingsError("max_threads", self.max_threads, "must be 1 or more")
        for name in self.runtimes or ():
            if name not in RUNTIMES:
                raise SettingsError("runtimes", name, f"expected some of {', '.join(RUNTIMES)}")

    @property
    def inputs_npz(self) -> str | os.PathLike[str] | None:
        """The .npz of input arrays: ``inputs``, or its older name ``verify_inputs``."""
        return self.inputs if self.inputs is not None else self.verify_inputs

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        """``input_shape`` as the engine takes it (name -> a list of ints)."""
        return {k: [int(d) for d in v] for k, v in (self.input_shape or {}).items()}

    def search_settings(self, runtime: RuntimeSettings) -> SearchSettings:
        """The search's own settings, measuring on ``runtime``."""
        return SearchSettings(
            budget_s=self.budget,
            bench_seconds=runtime.bench_seconds,
            input_shapes=self.input_shapes,
            inputs_npz=self.inputs_npz,
            rtol=self.rtol,
            atol=self.atol,
            static_shapes=self.static_shapes,
            layouts=tuple(self.layout),
            allow_interface_change=self.allow_interface_change,
            session_search=self.session_search,
            session_start=SessionSettings(
                runtime.runtime,
                runtime.provider,
                intra_op_num_threads=runtime.threads,
                graph_optimization_level=runtime.graph_opt,
            ),
            max_threads=self.max_threads,
            runtimes=tuple(self.runtimes or (runtime.runtime,)),
        )
