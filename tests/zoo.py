"""Where the zoo is and which models it has (../shared/zoo beside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# OPFUSE_ZOO: the zoo's folder where it is not ../shared/zoo (a git worktree elsewhere)
ZOO = Path(os.environ.get("OPFUSE_ZOO", ROOT.parent / "shared" / "zoo"))
ZOO_MODELS = sorted(p.stem for p in (ZOO / "models").glob("*.onnx")) if ZOO.exists() else []
