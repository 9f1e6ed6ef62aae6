"""The import-linter contracts in pyproject.toml cover what they must (``make lint`` runs
``lint-imports`` on them)."""

from __future__ import annotations

import sys
from pathlib import Path

from opfuse.passes import PIPELINE_ORDER

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
    folder = ROOT / "src" / "opfuse" / "passes"
    return {
        p.stem
        for p in folder.glob("*.py")
        if p.stem != "__init__" and p.stem.startswith("_") == helpers
    }


def test_the_independence_contract_covers_every_pass_module_and_allows_only_helpers():
    contract = _contract("Pass modules are independent")
    assert contract["modules"] == ["opfuse.passes.*"]  # a new pass module needs no line
    allowed = {line.rsplit(".", 1)[1] for line in contract["ignore_imports"]}
    assert all(line.startswith("opfuse.passes.* -> ") for line in contract["ignore_imports"])
    assert allowed == _modules(helpers=True)


def test_the_pipeline_order_names_every_pass_module():
    # a pass module missing from PIPELINE_ORDER would never be imported, so never run
    assert set(PIPELINE_ORDER) == _modules(helpers=False)
