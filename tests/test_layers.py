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


def test_every_pass_module_is_in_the_independence_contract():
    folder = ROOT / "src" / "opfuse" / "passes"
    modules = {f"opfuse.passes.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert set(_contract("Pass modules are independent")["modules"]) == modules


def test_the_pipeline_order_names_the_independent_pass_modules():
    listed = {m.rsplit(".", 1)[1] for m in _contract("Pass modules are independent")["modules"]}
    assert listed == set(PIPELINE_ORDER)
