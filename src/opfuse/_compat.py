"""Old module paths of opfuse 0.1 (before the packages of issue 23), importable for one
more release with a DeprecationWarning: ``import opfuse.io`` gives ``opfuse.model.io``.

A finder on ``sys.meta_path`` answers only for the names in ``MOVED`` and hands back the
module at its new path (the same module object, so state is shared). ``opfuse.verify``,
``opfuse.passes`` and ``opfuse.tune`` are not here: those names are the API's functions now
(the modules are ``opfuse.verification.compare``, ``opfuse.rules``, ``opfuse.tuning.search``).
Delete this module in the next release."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "opfuse.public": "opfuse.api",
    "opfuse.session": "opfuse.api",
    "opfuse.cli_options": "opfuse.cli.options",
    "opfuse.tune_cli": "opfuse.cli.tune",
    "opfuse.io": "opfuse.model.io",
    "opfuse.shapes": "opfuse.model.shapes",
    "opfuse.graphs": "opfuse.model.graphs",
    "opfuse.registry": "opfuse.rewrite.registry",
    "opfuse.switch": "opfuse.pipeline.switch",
    "opfuse.suggest": "opfuse.pipeline.suggest",
    "opfuse.phases": "opfuse.pipeline.phases",
    "opfuse.verify_inputs": "opfuse.verification.inputs",
    "opfuse.tolerance": "opfuse.verification.tolerance",
    "opfuse.blame": "opfuse.verification.bisect",
    "opfuse.verdict": "opfuse.verification.messages",
    "opfuse.measure": "opfuse.tuning.measure",
    "opfuse.variants": "opfuse.tuning.variants",
    "opfuse.advisor.cli": "opfuse.cli.advise",
    "opfuse.advisor.verdict": "opfuse.advisor.pass_verdict",
    "opfuse.advisor.profile": "opfuse.advisor.profile_readers",
    "opfuse.advisor.profiling": "opfuse.advisor.profile_report",
    "opfuse.advisor.ran": "opfuse.advisor.executed_graph",
    "opfuse.advisor.target": "opfuse.runtime.targets",
    "opfuse.advisor.activations": "opfuse.advisor.written_activations",
    "opfuse.batching.cli": "opfuse.cli.batch",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system sets the alias's spec on it
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # already executed at its new path: keep its own spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
