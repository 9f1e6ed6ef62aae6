"""The collector's pause around the engine: garbage freed when it ends, or frozen in a
process that exits after one model (``opfuse optimize``)."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from opfuse import cli
from opfuse.pipeline import gcpause


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def fresh_flag(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    flag = {"on": False}
    monkeypatch.setattr(gcpause, "_ONE_SHOT", flag)
    return flag


def test_a_pause_collects_the_cycles_made_inside(fresh_flag: dict[str, bool]) -> None:
    assert gc.isenabled()
    with gcpause.paused_gc():
        assert not gc.isenabled()
        ref = weakref.ref(_Cycle())
        assert ref() is not None  # a cycle: only the collector frees it
    assert gc.isenabled()
    assert ref() is None


def test_one_model_per_process_freezes_instead(fresh_flag: dict[str, bool]) -> None:
    gcpause.one_model_per_process()
    assert fresh_flag["on"]
    before = gc.get_freeze_count()
    try:
        with gcpause.paused_gc():
            ref = weakref.ref(_Cycle())
        assert gc.isenabled()
        assert gc.get_freeze_count() > before
        assert ref() is not None  # not collected: the process's exit frees it
    finally:
        gc.unfreeze()
        gc.collect()


def test_a_nested_pause_leaves_the_collector_to_the_outer(fresh_flag: dict[str, bool]) -> None:
    with gcpause.paused_gc():
        with gcpause.paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.parametrize(
    ("argv", "one_shot"),
    [
        (["opfuse", "optimize", "--help"], True),
        (["opfuse", "--debug", "optimize", "--help"], True),
        (["opfuse", "batch", "--help"], False),  # many models in one process: collect
        (["opfuse", "tune", "--help"], False),
    ],
)
def test_the_entry_point_declares_one_model_commands(
    fresh_flag: dict[str, bool], monkeypatch: pytest.MonkeyPatch, argv: list[str], one_shot: bool
) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()  # --help: the usage, no work
    assert fresh_flag["on"] is one_shot
