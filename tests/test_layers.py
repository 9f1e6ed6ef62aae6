"""The import-linter contracts in pyproject.toml cover what they must (``make lint`` runs
``lint-imports`` on them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from opfuse.rules import PIPELINE_ORDER

if sys.version_info >= (3, 11):
    import tomllib
else:  # import-linter requires tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _contract(name_start: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith(name_start)]
    return contract


def _modules(helpers: bool) -> set[str]:
    folder = ROOT / "src" / "opfuse" / "rules"
    return {
        p.stem
        for p in folder.glob("*.py")
        if p.stem != "__init__" and p.stem.startswith("_") == helpers
    }


def test_the_independence_contract_covers_every_pass_module_and_allows_only_helpers():
    contract = _contract("Rule modules are independent")
    assert contract["modules"] == ["opfuse.rules.*"]  # a new pass module needs no line
    allowed = {line.rsplit(".", 1)[1] for line in contract["ignore_imports"]}
    assert all(line.startswith("opfuse.rules.* -> ") for line in contract["ignore_imports"])
    assert allowed == _modules(helpers=True)


def test_the_pipeline_order_names_every_pass_module():
    # a pass module missing from PIPELINE_ORDER would never be imported, so never run
    assert set(PIPELINE_ORDER) == _modules(helpers=False)


def test_nothing_imports_the_package_root():
    # the root re-exports the API (opfuse.api): an import of it from inside is an arrow up
    import grimp

    graph = grimp.build_graph("opfuse")
    importers = graph.find_modules_that_directly_import("opfuse")
    assert importers == set(), importers


def test_the_top_level_holds_packages_and_a_handful_of_modules():
    top = ROOT / "src" / "opfuse"
    modules = {p.stem for p in top.glob("*.py")}
    assert modules == {"__init__", "__main__", "api", "errors", "_compat"}
    packages = [p for p in top.iterdir() if (p / "__init__.py").exists()]
    assert len(packages) >= 8
    for package in packages:  # each says what it owns
        doc = (package / "__init__.py").read_text().lstrip()
        assert doc.startswith('"""'), package.name


def test_old_module_paths_still_import_with_a_deprecation_warning():
    code = (
        "import warnings, importlib; warnings.simplefilter('error');\n"
        "import opfuse.model.io as new\n"
        "try:\n    importlib.import_module('opfuse.io')\nexcept DeprecationWarning as w:\n"
        "    assert 'opfuse.model.io' in str(w), w\nelse:\n    raise SystemExit('no warning')\n"
        "warnings.simplefilter('ignore'); import opfuse.io as old; assert old is new\n"
        "assert new.__spec__.name == 'opfuse.model.io'\n"
        "warnings.simplefilter('error'); from opfuse import api\n"
        "try:\n    api.optimize_file\nexcept DeprecationWarning as w:\n"
        "    assert 'opfuse.pipeline.run.optimize_file' in str(w), w\n"
        "else:\n    raise SystemExit('no warning')\n"
        "warnings.simplefilter('ignore'); from opfuse.pipeline.run import optimize_file\n"
        "assert api.optimize_file is optimize_file\n"
        "import opfuse; assert callable(opfuse.verify) and callable(opfuse.passes)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
