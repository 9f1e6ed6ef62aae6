"""``opfuse tune`` as numbered steps (``tune_file``), as ``pipeline.conductor.optimize_file`` is:

1. **check**, before any work: the settings (a ``TuneSettings`` checked itself when made;
   here the runtime's seconds per comparison), the output paths (none over the model:
   the output, the switch file, the report, the session file), the model readable, the
   user's input shapes or .npz against the model's inputs;
2. **runtime**: the runtime measured on (``RuntimeSettings.make``);
3. **search**: ``tuning.search.tune``, the graph search then the session settings;
4. **write**, while the chosen variant's build still exists: ``tuning.search.write_outputs``
   (the model, the fusion switch file, the deployment file ``OUTPUT.session.json``, the
   report); the command line that rebuilds the model goes onto the result."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opfuse.errors import SettingsError
from opfuse.model import io
from opfuse.pipeline.opset import converted_if_old
from opfuse.runtime.settings import RuntimeSettings
from opfuse.tuning import search
from opfuse.tuning.search import TuneResult
from opfuse.tuning.settings import TuneSettings
from opfuse.tuning.variants import Built
from opfuse.verification.compare import check_feeds

Progress = Callable[[str], None]  # called with the name of each trial as it starts


@dataclass(frozen=True)
class TuneOutputs:
    """Where tune writes: the model, its fusion switch file (default
    ``OUTPUT.fusion_switch.cfg``), the deployment file ``OUTPUT.session.json`` and the
    report of every trial (only when asked)."""

    output: Path
    switch_file: Path
    session_file: Path
    report: Path | None = None

    @classmethod
    def beside(
        cls,
        output: str | os.PathLike[str],
        switch_file_out: str | os.PathLike[str] | None = None,
        report: str | os.PathLike[str] | None = None,
    ) -> TuneOutputs:
        out = Path(output)
        switch = out.with_name(out.name + ".fusion_switch.cfg")
        return cls(
            out,
            Path(switch_file_out) if switch_file_out is not None else switch,
            out.with_name(out.name + ".session.json"),
            Path(report) if report is not None else None,
        )


def tune_file(
    model: str | os.PathLike[str],
    outputs: TuneOutputs,
    settings: TuneSettings,
    runtime: RuntimeSettings,
    progress: Progress | None = None,
) -> TuneResult:
    """Search for the fastest verified variant of ``model`` and write it (the steps of
    this module's docstring)."""
    model = Path(model)
    _check(model, outputs, settings, runtime)  # 1. check
    measured_on = runtime.make()  # 2. runtime
    written: dict[str, str] = {}

    def write(found: TuneResult, built: Built) -> None:  # 4. write
        written["command"] = search.write_outputs(
            found,
            built,
            model,
            outputs.output,
            outputs.switch_file,
            outputs.report,
            settings.input_shapes,
            outputs.session_file,
        )

    result = search.tune(  # 3. search
        model,
        measured_on,
        settings.search_settings(runtime),
        progress=progress,
        workdir=outputs.output.parent,
        keep=write,
    )
    result.command = written.get("command", "")
    result.switch_file = outputs.switch_file
    return result


def _check(
    model: Path, outputs: TuneOutputs, settings: TuneSettings, runtime: RuntimeSettings
) -> None:
    """Step 1: what the settings cannot check alone, before any work."""
    if not runtime.bench_seconds > 0:
        raise SettingsError("bench_seconds", float(runtime.bench_seconds), "must be more than 0")
    io.check_outputs(
        model,
        [
            ("-o", outputs.output),
            ("--switch-file-out", outputs.switch_file),
            ("--report", outputs.report),
            ("the session file", outputs.session_file),
        ],
    )
    io.read_proto(model)
    if settings.input_shape or settings.inputs_npz is not None:
        check_feeds(
            model,
            settings.input_shapes,
            settings.inputs_npz,
            lambda: converted_if_old(model),
        )
