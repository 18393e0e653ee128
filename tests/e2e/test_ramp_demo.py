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

# Up over 20 s, 15 s at 60 r/s, down by 40 s, then base; offset 25 s lands on a minute boundary.
PROFILE = RateProfile.parse("0:2,20:60,35:60,40:2,200:2")
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
