"""What a batch run is made of: the options of one model's task and the list of models.

INPUTS are model files, folders (every ``*.onnx`` below them) or manifests: ``.txt`` with
one path per line, or ``.jsonl`` with one object per line (``path`` and per-model options).
Each model's outputs go to OUTDIR at its path relative to the folder or manifest that named
it (a model file given directly goes to OUTDIR/its name), so OUTDIR mirrors the inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from opfuse.errors import OpfuseError, SettingsError
from opfuse.pipeline.settings import OptimizeSettings
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT
from opfuse.verification.settings import VerifySettings

# per-model options a .jsonl manifest line may set, with the type each takes (``inputs``:
# the .npz of the model's input arrays, verified and timed on; ``verify_inputs``: its older
# name; both are the task's ``verify_inputs``)
MANIFEST_KEYS = {
    "input_shape": dict,
    "inputs": str,
    "verify_inputs": str,
    "switch_file": str,
    "rtol": float,
    "atol": float,
}
# options that decide how long or in how much memory a task may run, not what it computes:
# they are not part of the resume key
LIMIT_KEYS = ("timeout", "max_memory")
# the OptimizeSettings fields a batch task carries under the same name (its switch file is
# ``switch_file``, resolved to an absolute path for the workers)
OPTIMIZE_FIELDS = ("enable", "disable", "fold_size_limit", "target_opset", "layout", "target")


@dataclass(frozen=True)
class TaskOptions:
    """Everything one model's task needs besides its path; picklable, JSON-able."""

    verify: bool = True
    rtol: float = 1e-4
    atol: float = 1e-5
    input_shape: Mapping[str, list[int]] | None = None
    verify_inputs: str | None = None  # .npz of input arrays: verification, timing, advice
    switch_file: str | None = None
    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT
    target_opset: int | None = None
    layout: str = "keep"
    target: str | None = None
    advise: bool = False
    benchmark: bool = False
    tune: float | None = None  # opfuse tune's budget in seconds per model
    timeout: float = 600.0
    max_memory: int = 8 << 30

    def check(self) -> None:
        """Refuse limits no model could run under, and what would fail every model (the
        switch file, pass names, graph options): one error, before any model runs."""
        from opfuse.pipeline.selection import select_passes
        from opfuse.pipeline.switch import parse_switch_file

        if self.switch_file is not None:
            parse_switch_file(self.switch_file)
        select_passes(None, self.enable, self.disable)
        self.optimize_settings()
        if self.timeout <= 0:
            raise OpfuseError(f"--timeout {self.timeout:g}: give a number of seconds above 0")
        if self.max_memory < 0:
            raise OpfuseError(f"--max-memory {self.max_memory}: give a size, or 0 for none")
        if self.tune is not None and not 0 < self.tune < self.timeout:
            raise OpfuseError(
                f"--tune {self.tune:g}: the budget must be above 0 and below --timeout "
                f"{self.timeout:g} (the timeout covers optimize, verify and tune)"
            )

    @classmethod
    def of(
        cls,
        optimize: OptimizeSettings | None,
        checks: VerifySettings | None,
        /,
        **options: Any,
    ) -> TaskOptions:
        """The options of ``opfuse.batch``: the settings objects' fields that a task
        carries, and the task's own (``options``); what a task cannot carry is refused."""
        given: dict[str, Any] = {}
        if optimize is not None:
            unused = ("keep_inputs", "keep_outputs", "static_shapes")
            _refuse_unused(optimize, OptimizeSettings(), unused)
            switch_file = optimize.fusion_switch_file
            given.update(
                switch_file=str(Path(switch_file).resolve()) if switch_file else None,
                **{name: getattr(optimize, name) for name in OPTIMIZE_FIELDS},
            )
        if checks is not None:
            _refuse_unused(checks, VerifySettings(), ("seed", "save_failing_inputs"))
            given.update(
                rtol=checks.rtol,
                atol=checks.atol,
                input_shape=checks.shapes or None,
                verify_inputs=str(checks.inputs_npz) if checks.inputs_npz else None,
            )
        for name in sorted(set(given) & set(options)):
            raise SettingsError(name, options[name], "give it in the settings or as a keyword")
        return cls(**options, **given)

    def optimize_settings(self) -> OptimizeSettings:
        """What one model's optimizer takes (``pipeline.conductor.optimize_file``)."""
        return OptimizeSettings(
            fusion_switch_file=self.switch_file,
            **{name: getattr(self, name) for name in OPTIMIZE_FIELDS},
        )

    def verify_settings(self) -> VerifySettings:
        """What one model's verifier takes."""
        return VerifySettings(
            rtol=self.rtol,
            atol=self.atol,
            input_shape=self.input_shape or {},
            verify_inputs=self.verify_inputs,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["enable"], data["disable"] = list(self.enable), list(self.disable)
        data["input_shape"] = dict(self.input_shape) if self.input_shape else None
        return data

    def limits(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in LIMIT_KEYS}

    def key(self) -> str:
        """A short digest of the options that decide a model's result (resume key)."""
        data = {k: v for k, v in self.to_json().items() if k not in LIMIT_KEYS}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _refuse_unused(given: object, default: object, names: tuple[str, ...]) -> None:
    """A setting ``opfuse.batch`` does not apply to each model: refused, not ignored."""
    for name in names:
        if getattr(given, name) != getattr(default, name):
            raise SettingsError(name, getattr(given, name), "opfuse.batch does not take it")


@dataclass(frozen=True)
class Job:
    """One model: where it is, where its outputs go (relative to OUTDIR), its options."""

    model: str
    relpath: str
    options: TaskOptions = field(default_factory=TaskOptions)

    def output(self, outdir: str | os.PathLike[str]) -> Path:
        return Path(outdir) / self.relpath


def _model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.onnx") if p.is_file())


def _manifest_entries(path: Path) -> Iterable[tuple[Path, dict[str, Any]]]:
    """(model path, per-model options) of each non-blank, non-comment manifest line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise OpfuseError(f"{path}: cannot read the manifest: {exc}") from None
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path}:{number}"
        if path.suffix == ".txt":
            yield path.parent / text, {}
            continue
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OpfuseError(f"{where}: not a JSON object: {exc.msg}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise OpfuseError(f'{where}: each line needs {{"path": "model.onnx", ...}}')
        extra = {k: v for k, v in entry.items() if k != "path"}
        for key, value in extra.items():
            if key not in MANIFEST_KEYS:
                known = ", ".join(["path", *MANIFEST_KEYS])
                raise OpfuseError(f"{where}: unknown key {key!r} (known: {known})")
            want = MANIFEST_KEYS[key]
            ok = isinstance(value, want) or (want is float and isinstance(value, int))
            if not ok or isinstance(value, bool):
                raise OpfuseError(f"{where}: {key} must be a {want.__name__}")
        yield path.parent / entry["path"], _manifest_options(extra, path.parent, where)


def _manifest_options(extra: dict[str, Any], base: Path, where: str) -> dict[str, Any]:
    options = dict(extra)
    if "inputs" in options:
        if "verify_inputs" in options:
            raise OpfuseError(
                f"{where}: inputs and verify_inputs (its older name) both give the input "
                "arrays; give inputs alone"
            )
        options["verify_inputs"] = options.pop("inputs")
    if "verify_inputs" in options and "input_shape" in options:
        raise OpfuseError(
            f"{where}: input_shape and inputs both give the input shapes (the .npz arrays' "
            "shapes are used); drop input_shape"
        )
    for key in ("verify_inputs", "switch_file"):  # relative to the manifest, as the paths
        if key in options:
            options[key] = str(base / options[key])
    if "input_shape" in options:
        shapes = options["input_shape"]
        if not all(
            isinstance(d, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in d)
            for d in shapes.values()
        ):
            raise OpfuseError(f'{where}: input_shape must map names to dims: {{"x": [1, 3]}}')
        options["input_shape"] = {k: list(v) for k, v in shapes.items()}
        options["verify_inputs"] = None  # the model's own shapes over the run's arrays
    elif "verify_inputs" in options:
        options["input_shape"] = None  # the model's own arrays over the run's shapes
    return options


def _relative(path: Path, base: Path) -> str:
    """``path`` below ``base``, as named (a symlinked model keeps its name and place)."""
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(base)).as_posix()
    except ValueError:  # a manifest naming a model outside its folder
        return path.name


def collect_jobs(inputs: Iterable[str | os.PathLike[str]], options: TaskOptions) -> list[Job]:
    """Expand INPUTS into one job per model, in a stable order; refuse what is missing,
    what is not a model or a manifest, and two models that would share an output."""
    jobs: list[Job] = []
    for given in map(Path, inputs):
        if given.is_dir():
            found = _model_files(given)
            if not found:
                raise OpfuseError(f"{given}: folder holds no *.onnx model")
            jobs += [Job(str(p.resolve()), _relative(p, given), options) for p in found]
        elif given.suffix in (".txt", ".jsonl") and given.is_file():
            for model, extra in _manifest_entries(given):
                if not model.is_file():
                    raise OpfuseError(f"{given}: model {model} does not exist")
                own = replace(options, **extra) if extra else options
                jobs.append(Job(str(model.resolve()), _relative(model, given.parent), own))
        elif given.is_file():
            jobs.append(Job(str(given.resolve()), given.name, options))
        elif given.exists():
            raise OpfuseError(f"{given}: not a model file, a folder or a manifest")
        else:
            raise OpfuseError(f"{given}: no such file or folder")
    return _unique(jobs)


def _unique(jobs: list[Job]) -> list[Job]:
    """Drop a model named twice; refuse two models that would share an output."""
    seen: dict[str, str] = {}
    unique = []
    for job in jobs:
        other = seen.get(job.relpath)
        if other is None:
            seen[job.relpath] = job.model
            unique.append(job)
        elif other != job.model:
            raise OpfuseError(
                f"{job.model} and {other} would both be written to OUTDIR/{job.relpath}; "
                "give their common folder (or a manifest in it) instead"
            )
    return unique


def check_outdir(outdir: Path, jobs: list[Job]) -> None:
    """OUTDIR is a folder (made if missing) whose outputs never replace an input."""
    if outdir.exists() and not outdir.is_dir():
        raise OpfuseError(f"{outdir}: output folder is a file")
    for job in jobs:
        target = job.output(outdir).resolve()
        if target == Path(job.model):
            raise OpfuseError(
                f"{outdir}: would write {job.relpath} over the input model {job.model}; "
                "choose another output folder"
            )
