"""Fixtures: the materialized zoo for slow tests (skipped where ../shared/zoo is absent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from zoo import ZOO  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All zoo models, materialized once per session into a temp folder."""
    if not (ZOO / "materialize.py").exists():
        pytest.skip("../shared/zoo is not here")
    out = tmp_path_factory.mktemp("zoo")
    subprocess.run(
        [sys.executable, str(ZOO / "materialize.py"), str(out)], check=True, capture_output=True
    )
    return out


@pytest.fixture(autouse=True, scope="session")
def _calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The advisor's machine calibration is cached in a temp folder, not the user's home."""
    import os

    os.environ["OPFUSE_CACHE_DIR"] = str(tmp_path_factory.mktemp("opfuse-cache"))
