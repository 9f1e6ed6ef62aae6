"""OUTDIR/results.jsonl: one JSON record per line, appended as each model finishes.

Append-only, one line written and synced at a time, so an interrupted batch keeps every
record it finished; a line cut short by a crash of the whole batch is ignored on reading.
The last record of a model is its current one.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opfuse.batching.task import STATUSES
from opfuse.errors import OpfuseError

RESULTS = "results.jsonl"


def append(outdir: Path, record: dict[str, Any]) -> None:
    path = outdir / RESULTS
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise OpfuseError(f"{path}: cannot append the result: {exc.strerror or exc}") from None


def read(outdir: Path) -> list[dict[str, Any]]:
    """Every complete record of OUTDIR/results.jsonl, oldest first ([] when none)."""
    path = outdir / RESULTS
    if not path.exists():
        return []
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise OpfuseError(f"{path}: cannot read earlier results: {exc}") from None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line a killed batch left half-written
        if isinstance(record, dict) and "status" in record:
            records.append(record)
    return records


def resume_key(sha256: str | None, options_key: str, relpath: str) -> tuple[str | None, str, str]:
    return (sha256, options_key, relpath)


def last_records(records: Iterable[dict[str, Any]]) -> dict[tuple[str | None, str, str], dict]:
    """The last record of each (sha256, options key, relpath)."""
    return {
        resume_key(r.get("sha256"), r.get("options_key", ""), r.get("relpath", "")): r
        for r in records
    }


def reusable(record: dict[str, Any], limits: dict[str, Any], outdir: Path) -> bool:
    """Whether a rerun with these limits would only repeat ``record``: an ok record whose
    output is still there, a refusal or failed verification (same bytes, same options,
    same outcome), a timeout or out of memory under the same limits. A crash is retried."""
    status = record.get("status")
    if status == "ok":
        return bool(record.get("output")) and (outdir / record["output"]).exists()
    if status in ("verify_failed", "refused"):
        return True
    return status in ("timeout", "oom") and record.get("limits") == limits


def counts(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Records per status, every status listed (0 when none)."""
    found = Counter(r["status"] for r in records)
    return {status: found[status] for status in STATUSES}
