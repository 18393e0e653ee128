"""The ramp demo, shortened, in the real local world: the fleet follows the load up and down.

The control loop keeps its history in whole wall-clock minutes, so even
shortened this needs two minute boundaries after the ramp: the load is placed
so that its peak straddles one (the planner sees it at the next step), and
the fall is seen one minute later; then the cool-down. About 4 minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mark.config import load_settings
from mark.demo import ensure_demo_model
from mark.loadgen import RateProfile
from mark.ramp_demo import (
    deep_merge,
    demo_overrides,
    forecaster_overrides,
    heavy_model_overrides,
    launch_checks,
    prepare_forecaster,
    retire_checks,
    run_ramp,
)
from tests.e2e.test_local_world import _live_children

# Up over 20 s, 15 s at 45 r/s, down by 40 s, then base; offset 25 s lands on a minute boundary.
# 45 r/s needs two instances; at 60 r/s the spill to the 4 local Lambda runtimes (one
# invocation per request) sometimes overran them on this 2-core machine (503s, timeouts).
PROFILE = RateProfile.parse("0:2,20:45,35:45,40:2,200:2")
BOUNDARY_AT = 25.0
COOLDOWN_S = 30.0  # longer than the minute the history lags: an early backup is kept
P_U = 5.0


@pytest.mark.slow
async def test_fleet_grows_with_the_ramp_and_retires_after_the_cooldown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_demo_model(tmp_path)
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path))  # where agents and Lambda find it
    demo = demo_overrides(
        update_period_s=P_U,
        cooldown_s=COOLDOWN_S,
        billing_minimum_s=10.0,
        boot_delay_s=2.0,
        slowdown=15.0,  # ~25 r/s per c5.large serving digits x40: the peak needs several
    )
    base = deep_merge(deep_merge(demo, heavy_model_overrides()), {"data_dir": str(tmp_path)})
    model_file = prepare_forecaster("last", PROFILE, tmp_path, 15)
    settings = load_settings(overrides=deep_merge(base, forecaster_overrides(model_file)))

    run = await run_ramp(
        settings, PROFILE, seed=3, align_start_second=None, load_offset_at_minute=BOUNDARY_AT
    )

    summary = run.load.summary
    assert summary is not None
    assert summary.sent > 500 and summary.errors == 0 and summary.ok == summary.sent  # all answered

    launches = launch_checks(run)
    planned = [c for c in launches if c.by == "planner"]
    assert planned, f"the planner launched nothing: {launches}"
    # The planner grew the fleet while the load was high: at the first step after the
    # boundary, from the minute that held the ramp (its history is per whole minute).
    high = [c for c in planned if 20.0 <= c.at <= 40.0]
    assert high, f"no planner launch while the load was high: {planned}"
    peak_fleet = max(len(s.pending) + len(s.serving) for s in run.samples)
    assert peak_fleet >= 2

    retires = retire_checks(run)
    assert retires, "nothing was retired after the load fell"
    for r in retires:
        assert r.fell_at is None or r.at > r.fell_at
        assert r.after_cooldown, f"{r.instance_id} retired {r.quiet_s} s after the load fell"
        assert r.last_wanted_at is not None and r.at - r.last_wanted_at >= COOLDOWN_S
    assert min(r.at for r in retires) > 40.0 + COOLDOWN_S
    assert _live_children(os.getpid()) == []  # every agent and Lambda runtime stopped


def test_checks_judge_launches_and_retirements_against_the_load() -> None:
    """The verdicts on a made-up run: fast, no daemon (the slow test runs the real one)."""
    from mark.loadgen import LoadResult, ModelInput
    from mark.ramp_demo import FleetSample, RampRun, format_report, timeline
    from mark.state.records import ArrivalWindow, InstanceRecord, PlanRecord

    t0 = 1000.0
    rate = {w: (30.0 if 1100 <= w < 1300 else 5.0) for w in range(1000, 1500, 5)}
    windows = [ArrivalWindow("m", float(w), 5.0, int(r * 5)) for w, r in rate.items()]

    def rec(iid: str, at: float) -> InstanceRecord:
        return InstanceRecord(iid, "m", "c5.large", "on-demand", "serving", "x", 0.1, at, at)

    def plan(at: float, held: list[str]) -> PlanRecord:
        return PlanRecord(
            "m",
            at,
            "greedy",
            [30.0, 30.0],
            0.2,
            {"held": [[h, "cool-down until t=9"] for h in held]},
        )

    def serving(t: int) -> tuple[str, ...]:  # a serves from 1010; b from 1070 until retired
        return (*(["a"] if t >= 1010 else []), *(["b"] if 1070 <= t < 1400 else []))

    run = RampRun(
        model="m",
        started_at=t0,
        ended_at=1500.0,
        update_period_s=60.0,
        cooldown_s=90.0,
        load=LoadResult(
            RateProfile.parse("0:5,500:5"), ModelInput("m", "input", "FP32", (1,)), "v2", t0
        ),
        samples=[FleetSample(float(t), (), serving(t)) for t in range(1000, 1500, 10)],
        plans=[plan(1240.0, []), plan(1300.0, []), plan(1360.0, ["b"])],
        decisions=[],
        windows=windows,
        instances=[rec("a", 1000.0), rec("b", 1060.0)],
        first_event={"a": (1000.0, "SLO monitor"), "b": (1060.0, "planner")},
        retired_at={"b": 1400.0},
        capacity={("c5.large", "on-demand"): 20.0},
    )
    a, b = launch_checks(run)
    assert a.by == "SLO monitor" and a.capacity_before == 0 and a.need_at == 0.0
    assert b.by == "planner" and b.capacity_before == 20 and b.ahead
    assert (b.at, b.need_at, b.ready_at) == (60.0, 100.0, 70.0)
    assert b.verdict() == "ahead by 40 s, serving 30 s early"
    (r,) = retire_checks(run)
    assert r.capacity_after == 20 and r.fell_at == 300.0 and r.quiet_s == 100.0
    assert r.after_cooldown and r.last_wanted_at == 300.0
    assert r.verdict() == "100 s after the load fell ≥ cool-down 90 s; last wanted 100 s before"
    assert [row.actions for row in timeline(run)][-1] == ("hold b (cool-down)",)
    assert "ahead by 40 s" in format_report(run)
