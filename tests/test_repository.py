"""The repository itself: no tracked file whose name a shell or another platform would
choke on (a pasted terminal line once landed as a file name)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAFE_NAME = re.compile(r"[A-Za-z0-9._/-]+")


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name.decode("utf-8", "replace") for name in out.split(b"\0") if name]


def test_every_tracked_file_name_is_plain():
    names = tracked_files()
    assert names, "git ls-files listed nothing"
    bad = [n for n in names if not SAFE_NAME.fullmatch(n)]
    assert bad == [], f"file names outside [A-Za-z0-9._/-]: {bad}"


def test_the_check_catches_a_pasted_line():
    assert not SAFE_NAME.fullmatch("orst element at 2.3% of its bound: ok|")
    assert SAFE_NAME.fullmatch("src/opfuse/rules/hardswish.py")
