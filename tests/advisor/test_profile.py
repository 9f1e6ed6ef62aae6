"""Per-node times are the median over the kept runs: one run slowed down by another process
does not move a node's figure, and totals are the sums of the per-node figures."""

from __future__ import annotations

import pytest
from advisor_models import SWISH_TIMES, ort_profile

from opfuse.advisor.profile_readers import op_statistic, parse_ort_events, read_op_summary


def test_one_slow_run_does_not_move_the_onnxruntime_times() -> None:
    # five kept runs; in the first every node took 100x as long (a preempted run)
    profile = parse_ort_events(ort_profile(SWISH_TIMES, runs=5), warmup=0)
    assert profile.runs == 5
    times = {r.name: r.duration_us for r in profile.records}
    assert times == pytest.approx({k: us for k, (_, us) in SWISH_TIMES.items()})
    assert profile.total_us == pytest.approx(sum(times.values()))
    stats = {s.op_type: s for s in op_statistic(profile.records)}
    assert stats["Conv"].total_us == pytest.approx(150.0) and stats["Conv"].count == 2


def test_a_node_missing_from_some_runs_counts_zero_there() -> None:
    events = ort_profile({"a": ("Relu", 4.0)}, runs=3, warmup_factor=1.0)
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    # "b" (an If branch) ran in the second run only
    events.append(
        {"cat": "Node", "name": "b_kernel_time", "ts": runs[1] + 1, "dur": 50, "args": {}}
    )
    times = {r.name: r.duration_us for r in parse_ort_events(events, warmup=0).records}
    assert times == {"a": 4.0, "b": 0.0}


@pytest.mark.parametrize("infer_id", [True, False])
def test_op_summary_median_per_run(infer_id, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three runs; conv and relu run once per run, the cast twice; run 2 was slow. The runs
    are msprof's Infer IDs, or without that column the number of times most ops ran."""
    rows = ["Op Name,OP Type,Task Type,Task Start Time,Task Duration(us)" + ",Infer ID" * infer_id]
    start = 0
    for run, slow in ((1, 1.0), (2, 50.0), (3, 1.0)):
        for name, op, us in (
            ("cast", "Cast", 2.0),
            ("conv", "Conv2D", 10.0),
            ("cast", "Cast", 3.0),
            ("relu", "Relu", 1.0),
        ):
            rows.append(f"{name},{op},AI_CORE,{start},{us * slow}" + f",{run}" * infer_id)
            start += 100
    path = tmp_path / "op_summary_0_1.csv"
    path.write_text("\n".join(rows) + "\n")
    profile = read_op_summary(path)
    assert profile.runs == 3
    times = {r.name: (r.duration_us, r.calls) for r in profile.records}
    assert times == {"conv": (10.0, 1), "cast": (5.0, 2), "relu": (1.0, 1)}
