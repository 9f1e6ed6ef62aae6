"""The import-linter contracts in pyproject.toml cover what they must (``make lint`` runs
``lint-imports`` on them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


RULES = ROOT / "src" / "opfuse" / "rules"


def _subpackages() -> set[str]:
    """The pass modules that are packages (rules/layout/): the pass and its internals."""
    return {p.parent.name for p in RULES.glob("*/__init__.py")}


def _modules(helpers: bool) -> set[str]:
    names = {p.stem for p in RULES.glob("*.py") if p.stem != "__init__"} | _subpackages()
    return {name for name in names if name.startswith("_") == helpers}


def test_the_independence_contract_covers_every_pass_module_and_allows_only_helpers():
    contract = _contract("Rule modules are independent")
    assert contract["modules"] == ["opfuse.rules.*"]  # a new pass module needs no line
    importers = {"opfuse.rules.*"} | {f"opfuse.rules.{p}.*" for p in _subpackages()}
    allowed = set()
    for line in contract["ignore_imports"]:
        importer, imported = line.split(" -> ")
        assert importer in importers, line
        package, name = imported.rsplit(".", 1)
        assert package == "opfuse.rules", line  # never a sub-package's internals
        allowed.add(name)
    # the shared helpers only, each open to the modules of every sub-package too
    assert allowed == _modules(helpers=True) == {"_affine", "_shape_arith", "_util"}
    for package in _subpackages():
        inner = {line.split(" -> ")[1] for line in contract["ignore_imports"]}
        used = {f"opfuse.rules.{m}" for m in _imported_helpers(package)}
        assert used <= inner, (package, used - inner)


def _imported_helpers(package: str) -> set[str]:
    """The shared helper modules (rules._*) that a sub-package's own modules import."""
    import grimp

    graph = grimp.build_graph("opfuse")
    found = set()
    for module in graph.find_children(f"opfuse.rules.{package}"):
        for imported in graph.find_modules_directly_imported_by(module):
            head, _, name = imported.rpartition(".")
            if head == "opfuse.rules" and name.startswith("_"):
                found.add(name)
    return found


def test_only_the_layout_package_imports_its_internals():
    import grimp

    graph = grimp.build_graph("opfuse")
    internals = {
        m for m in graph.find_children("opfuse.rules.layout") if m.rsplit(".", 1)[1].startswith("_")
    }
    assert internals == {f"opfuse.rules.layout.{m}" for m in ("_edit", "_ops", "_regions")}
    for module in internals:
        for importer in graph.find_modules_that_directly_import(module):
            assert importer.startswith("opfuse.rules.layout"), (importer, module)


def test_a_rule_opens_no_runtime_the_engine_evaluates_constants():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["include_external_packages"] is True  # else onnxruntime is not in the graph
    contract = _contract("A rule imports no model I/O")
    assert contract["source_modules"] == ["opfuse.rules"]
    assert {"onnxruntime", "opfuse.runtime", "opfuse.model.sessions"} <= set(
        contract["forbidden_modules"]
    )
    # the one way from a rule to onnxruntime: the engine's evaluator (a rewrite module),
    # through the one session opener
    assert contract["ignore_imports"] == ["opfuse.rewrite.evaluate -> opfuse.model.sessions"]
    assert contract.get("allow_indirect_imports") in (None, False)


def _lint_copy(tmp_path: Path, plant: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the package with ``plant`` (module path in rules/ ->
    a line appended to it)."""
    shutil.copytree(
        ROOT / "src" / "opfuse",
        tmp_path / "src" / "opfuse",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, line in plant.items():
        module = tmp_path / "src" / "opfuse" / "rules" / path
        module.write_text(module.read_text() + "\n" + line + "\n")
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    return subprocess.run(
        [str(lint), "--no-cache", "--config", "pyproject.toml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("plant", "broken"),
    [
        ({}, None),  # the copy itself keeps every contract: the harness is sound
        ({"hardswish.py": "import onnxruntime"}, "opfuse.rules.hardswish -> onnxruntime"),
        (
            {"hardswish.py": "from opfuse.model.sessions import open_session"},
            "opfuse.rules.hardswish -> opfuse.model.sessions",
        ),
        (
            {"softmax.py": "from opfuse.rules.layout._ops import Perm"},
            "opfuse.rules.softmax -> opfuse.rules.layout._ops",
        ),
        (
            {"layout/_ops.py": "import opfuse.rules.cse"},
            "opfuse.rules.layout._ops -> opfuse.rules.cse",
        ),
    ],
    ids=[
        "none",
        "onnxruntime-in-a-rule",
        "session-opener-in-a-rule",
        "layout-internals",
        "layout-imports-a-rule",
    ],
)
def test_the_contracts_catch_what_they_forbid(tmp_path, plant, broken):
    proc = _lint_copy(tmp_path, plant)
    if broken is None:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 broken" in proc.stdout
    else:
        assert proc.returncode != 0, proc.stdout
        assert broken in proc.stdout, proc.stdout


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
        "    assert 'opfuse.pipeline.conductor.optimize_file' in str(w), w\n"
        "else:\n    raise SystemExit('no warning')\n"
        "warnings.simplefilter('ignore'); from opfuse.pipeline.conductor import optimize_file\n"
        "assert api.optimize_file is optimize_file\n"
        "import opfuse; assert callable(opfuse.verify) and callable(opfuse.passes)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
