"""When the load outruns the last plan, the step runs early (``provisioner.early_step``)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from provisioner.control_state import ControlState, Member, Snapshot, StepConfig
from provisioner.early_step import (
    EARLY_WINDOWS,
    Window,
    above_plan,
    fleet_capacity,
    plan_early,
)
from provisioner.greedy import PlannerOption

T = 1_000.0


def windows(rates: list[float], start: float = T) -> list[Window]:
    return [Window(start + 5.0 * k, 5.0, r) for k, r in enumerate(rates)]


def test_two_windows_in_a_row_above_the_plan_trigger_and_say_why() -> None:
    why = plan_early(windows([50.0, 90.0, 95.0]), 50.0, T, T + 15.0)
    assert why is not None and "90.0, 95.0" in why and "50.0 r/s planned 15 s ago" in why


def test_one_window_above_or_windows_within_noise_do_not() -> None:
    assert plan_early(windows([50.0, 50.0, 95.0]), 50.0, T, T + 15.0) is None
    # 2 sd of a Poisson count of 250 (50 r/s over 5 s) is 31.6 requests, 6.3 r/s.
    assert plan_early(windows([51.0, 51.0]), 50.0, T, T + 10.0) is None
    assert not above_plan(56.2, 50.0, 5.0) and above_plan(56.5, 50.0, 5.0)


def test_only_windows_closed_after_the_plan_count() -> None:
    # The plan saw the high windows before it was made: they are not news.
    assert plan_early(windows([90.0, 95.0], start=T - 10.0), 50.0, T, T + 1.0) is None
    # A window still open at ``now`` is not counted.
    assert plan_early(windows([90.0, 95.0]), 50.0, T, T + 9.0) is None
    assert plan_early(windows([90.0, 95.0]), 50.0, T, T + 10.0) is not None


def test_no_plan_yet_never_triggers() -> None:
    assert plan_early(windows([90.0, 95.0]), math.inf, -math.inf, T + 10.0) is None
    assert plan_early(windows([90.0, 95.0]), 50.0, -math.inf, T + 10.0) is None


def test_a_plan_made_for_no_load_is_left_by_the_first_requests() -> None:
    assert plan_early(windows([2.0, 3.0]), 0.0, T, T + 10.0) is not None
    assert plan_early(windows([0.2, 0.2]), 0.0, T, T + 10.0) is None  # one request per window


def test_poisson_load_at_the_planned_rate_rarely_triggers() -> None:
    """A forecast of the minute's highest window that is right: seeded Poisson counts at
    the planned rate trigger in well under 1 % of the 12 pairs of a minute."""
    rng = np.random.default_rng(7)
    rate, fired = 60.0, 0
    trials = 5000
    for _ in range(trials):
        counts = rng.poisson(rate * 5.0, EARLY_WINDOWS)
        if plan_early(windows([c / 5.0 for c in counts]), rate, T, T + 10.0) is not None:
            fired += 1
    assert fired / trials < 0.01


def test_no_early_step_in_the_window_before_a_regular_one() -> None:
    assert plan_early(windows([90.0, 95.0]), 50.0, T, T + 10.0, next_step_at=T + 14.0) is None
    assert plan_early(windows([90.0, 95.0]), 50.0, T, T + 10.0, next_step_at=T + 15.0) is not None


def test_load_the_fleet_already_carries_plans_nothing_early() -> None:
    """A fleet held through its cool-down carries the excursion: no step is needed."""
    ws = windows([90.0, 95.0])
    assert plan_early(ws, 50.0, T, T + 10.0, capacity_rps=100.0) is None
    why = plan_early(ws, 50.0, T, T + 10.0, capacity_rps=60.0)
    assert why is not None and "the fleet's 60.0 r/s" in why


def test_fleet_capacity_counts_booting_instances_not_doomed_failing_or_standbys() -> None:
    small = PlannerOption("c5.large", "on-demand", 0.085, 10.0, latency_s=0.01)

    def member(iid: str, state: str = "ready", role: str = "serving") -> Member:
        return Member(iid, "m", "c5.large", "on-demand", role, state, 0.0, 0.085)

    fleet = (
        member("ready"),
        member("booting", "pending"),
        member("backup", role="backup"),
        member("failing", "failing"),
        member("doomed"),
        member("standby", role="standby"),
        member("stopped", "stopped"),
        replace(member("other"), model="n"),
    )
    snap = Snapshot("m", T, (), 0.0, (small,), fleet)
    state = ControlState(doomed={"doomed": T + 120.0})
    cfg = StepConfig(step_s=60.0, tau_steps=2, boot_s=120.0, pooled=False)
    assert fleet_capacity(snap, state, cfg) == 30.0  # ready, booting, backup


def test_no_early_step_while_spill_is_not_measured_in_time() -> None:
    assert plan_early(windows([90.0, 95.0]), 50.0, T, T + 10.0, spill_in_time=False) is None
