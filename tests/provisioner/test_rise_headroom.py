"""Pooled capacity where spill cannot answer in time (``provisioner.rise_headroom``): the
worst rise the history shows within a lead time, and the fleet planned to carry it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bouncer.miss_budget import MissTally
from provisioner.control_state import ControlState, Member, Rise, Snapshot, StepConfig
from provisioner.greedy import PlannerOption
from provisioner.guards import GuardConfig
from provisioner.pooling import capacity_in_pool
from provisioner.rise_headroom import (
    LEVEL_MINUTES,
    absorbing,
    by_misses,
    carried_rise,
    rating,
    rise_allowance,
    rise_to_carry,
    worst_rise,
)
from provisioner.standby_step import interruption_step
from provisioner.step import plan_step

# Alone 0.5 r/s, 4 r/s each in a pool of 8 or more (a GPU batching behind a tight RT_max).
GPU = PlannerOption(
    "p2.xlarge", "on-demand", 0.9, 0.5, latency_s=0.5, pool=((2, 1.0), (4, 2.5), (8, 4.0))
)
CFG = StepConfig(
    step_s=60.0,
    tau_steps=2,
    boot_s=120.0,
    window_steps=5,
    guard=GuardConfig(cooldown_s=120.0, billing_minimum_s=60.0),
    pooled=False,  # spill is not measured to answer in time
)


def test_a_flat_history_has_no_rise_and_a_step_shows_its_ratio() -> None:
    flat = [10.0] * 60
    assert worst_rise(flat, 2) == 1.0
    stepped = [10.0] * 30 + [30.0] * 30
    assert worst_rise(stepped, 2) == pytest.approx(3.0)
    # A fall is no rise; a rise further ahead than the lead is not counted at its start.
    assert worst_rise([30.0] * 30 + [10.0] * 30, 2) == 1.0


def test_the_level_is_the_median_so_one_spike_before_a_minute_does_not_hide_a_rise() -> None:
    x = [10.0] * 20 + [40.0] + [10.0] * 5 + [25.0] * 10
    assert worst_rise(x, 2) == pytest.approx(4.0)  # the spike itself, from a level of 10
    assert worst_rise(x[21:], 2) is not None


def test_too_little_or_unobserved_or_idle_history_tells_nothing() -> None:
    assert worst_rise([5.0] * (LEVEL_MINUTES + 1), 2) is None
    assert worst_rise([math.nan] * 40, 2) is None
    assert worst_rise([0.0] * 40, 2) is None
    # Unobserved minutes are skipped, not read as a rise from nothing.
    x = [10.0] * 20 + [math.nan] * 5 + [10.0] * 20
    assert worst_rise(x, 2) == 1.0


def _grid(per_minute: list[float], windows: int = 12) -> np.ndarray:
    return np.repeat(np.asarray(per_minute, dtype=float)[:, None], windows, axis=1)


def test_the_carried_rise_spends_the_allowed_misses_on_the_rarest_rise() -> None:
    """Two minutes at 30 r/s in a history at 10: the rows with a level hold 29 minutes at
    10 and two at 30, 4,200 requests per window-second; above R·10 the 24 windows of the
    rise miss 24·(30 − 10R), which is 5 % of all at R = 3 − 17.5·0.05 = 2.125."""
    grid = _grid([10.0] * 20 + [30.0] * 2 + [10.0] * 20)
    assert carried_rise(grid, 2, 0.0) == pytest.approx(3.0)  # nothing to spend: the worst
    assert carried_rise(grid, 2, 0.05) == pytest.approx(2.125)
    assert carried_rise(grid, 2, 24 * 20 / 4200) == 1.0  # the whole rise fits the allowance
    shares = [0.0, 0.01, 0.03, 0.05, 0.1, 0.2]
    rises: list[float] = []
    for s in shares:
        rise = carried_rise(grid, 2, s)
        assert rise is not None
        rises.append(rise)
    assert rises == sorted(rises, reverse=True)  # more allowance, less to carry


def _missed(grid: np.ndarray, rise: float) -> float:
    """The largest share, over the history's hours, of requests above ``rise`` times the
    level, written out (lead 2)."""
    peaks = np.nanmax(grid, axis=1)
    level = np.full(peaks.size, np.nan)
    for m in range(LEVEL_MINUTES + 1, peaks.size):
        level[m] = np.median(peaks[m - 2 - LEVEL_MINUTES + 1 : m - 2 + 1])
    rows = np.isfinite(level)
    rates = np.where(rows[:, None], np.nan_to_num(grid), 0.0)
    over = np.maximum(rates - rise * np.where(rows, level, 0.0)[:, None], 0.0).sum(axis=1)
    total = rates.sum(axis=1)
    return max(
        float(over[a : a + 60].sum() / total[a : a + 60].sum()) for a in range(peaks.size - 60 + 1)
    )


def test_the_carried_rise_is_the_least_that_fits_on_noisy_histories() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        minutes = rng.gamma(4.0, 5.0, size=150)
        grid = rng.poisson(np.repeat(minutes[:, None] * 5.0, 12, axis=1)) / 5.0
        grid[rng.random(grid.shape) < 0.02] = np.nan  # windows not recorded
        share = float(rng.uniform(0.001, 0.05))
        got = carried_rise(grid, 2, share)
        peaks = np.nanmax(grid, axis=1)
        worst = worst_rise(peaks, 2)
        assert got is not None and worst is not None and 1.0 <= got <= worst + 1e-9

        assert _missed(grid, got) <= share + 1e-9
        if 1.0 + 1e-6 < got < worst - 1e-6:
            assert _missed(grid, got - 1e-3) > share  # and no less would do


def test_every_hour_must_fit_not_only_the_whole_history() -> None:
    """A two-minute rise in a day-long history: 5 % of the whole day's requests would
    cover all of it (R = 1), but the first hour holds it with only 47 minutes at 10 r/s
    beside it (the first 11 have no level yet): 24·(30 − 10R) ≤ 0.05·12·530."""
    day = carried_rise(_grid([10.0] * 20 + [30.0] * 2 + [10.0] * 1400), 2, 0.05)
    assert day == pytest.approx(3.0 - 0.05 * 12 * 530 / 24 / 10.0)


def test_the_allowance_is_what_the_last_hour_left() -> None:
    assert rise_allowance(0.015, MissTally(0, 0)) == 0.0  # nothing measured: the worst rise
    assert rise_allowance(0.015, MissTally(10_000, 50)) == pytest.approx(0.01)
    assert rise_allowance(0.015, MissTally(10_000, 400)) == 0.0  # spent already
    assert rise_allowance(0.0, MissTally(10_000, 0)) == 0.0
    # The period's misses are by_misses's, not the allowance's.
    assert rise_allowance(0.015, MissTally(10_000, 50, 50_000, 5_000)) == pytest.approx(0.01)


def test_by_misses_carries_the_part_of_the_rise_the_measured_misses_show() -> None:
    share = 0.015
    assert by_misses(3.0, share, MissTally(10_000, 0)) == 1.0  # nothing missed: pool outright
    assert by_misses(3.0, share, MissTally(10_000, 75)) == pytest.approx(2.0)  # half spent
    assert by_misses(3.0, share, MissTally(10_000, 150)) == 3.0  # all of it spent
    assert by_misses(3.0, share, MissTally(10_000, 900)) == 3.0  # never more than the rise
    assert by_misses(3.0, share, MissTally(0, 0)) == 3.0  # nothing measured: all of it
    assert by_misses(3.0, 0.0, MissTally(10_000, 0)) == 3.0  # no share for rises: all of it


def test_a_period_near_its_allowance_keeps_the_rise_after_a_quiet_hour() -> None:
    share = 0.015
    # A quiet hour in a period that has spent 3/4 of the share: the period decides.
    assert by_misses(3.0, share, MissTally(10_000, 0, 80_000, 900)) == pytest.approx(2.5)
    # A bad hour in a quiet period: the hour decides.
    assert by_misses(3.0, share, MissTally(10_000, 150, 80_000, 150)) == 3.0


def test_the_rise_to_carry_is_by_misses_unless_configured_off() -> None:
    grid = _grid([10.0] * 20 + [30.0] * 3)
    cfg = replace(CFG, rise_miss_share=0.015, rise_by_misses=False)
    counted = carried_rise(grid, 2, 0.015 - 0.005)
    assert counted is not None and counted > 1.0
    misses = MissTally(10_000, 50)
    whole = rise_to_carry(grid, cfg, misses)
    assert whole is not None and whole.carried == whole.counted == pytest.approx(counted)
    by = rise_to_carry(grid, replace(cfg, rise_by_misses=True), misses)
    assert by is not None and by.counted == pytest.approx(counted)
    assert by.carried == pytest.approx(1.0 + (counted - 1.0) / 3)
    assert rise_to_carry(grid, replace(cfg, tau_steps=0), misses) is None
    short = _grid([10.0] * 5)
    assert rise_to_carry(short, replace(cfg, rise_by_misses=True), MissTally(1, 0)) is None


def test_no_carried_rise_without_a_level_and_a_lead() -> None:
    assert carried_rise(_grid([10.0] * 5), 2, 0.01) is None
    assert carried_rise(np.full((40, 12), np.nan), 2, 0.01) is None


def test_absorbing_divides_the_pool_and_keeps_the_stand_alone_floor() -> None:
    got = absorbing(GPU, 2.0)
    assert got.capacity_rps == GPU.capacity_rps
    assert got.pool == ((2, 0.5), (4, 1.25), (8, 2.0))
    assert absorbing(GPU, 100.0).pool == ((2, 0.5), (4, 0.5), (8, 0.5))
    no_pool = replace(GPU, pool=())
    assert absorbing(no_pool, 2.0) is no_pool


def _carried(rise: float | None) -> Rise | None:
    return None if rise is None else Rise(rise, rise)


def _fleet_for(rate: float, worst: float | None) -> int:
    snap = Snapshot("m", 0.0, (rate,) * 5, rate, (GPU,), (), carried_rise=_carried(worst))
    step = plan_step(snap, ControlState(), CFG, 1.0)
    return sum(launch.count for launch in step.launches)


def test_without_in_time_spill_the_fleet_carries_the_worst_rise_not_each_alone() -> None:
    alone = _fleet_for(8.0, None)  # no history: stand-alone, 0.5 r/s each
    assert alone == 16
    sizes = [_fleet_for(8.0, r) for r in (1.0, 1.5, 2.0, 3.0)]
    assert sizes == sorted(sizes) and sizes[-1] < alone  # more rise, more instances
    for rise, n in zip((1.0, 1.5, 2.0, 3.0), sizes, strict=True):
        # The plan holds at its own pool size, and that pool carries the rise.
        assert n * capacity_in_pool(absorbing(GPU, rise), n) >= 8.0 - 1e-9
        assert n * capacity_in_pool(GPU, n) >= rise * 8.0 - 1e-9
    # A rise beyond what pooling gains: stand-alone again.
    assert _fleet_for(8.0, 8.0) == _fleet_for(8.0, 100.0) == alone


def test_where_spill_answers_in_time_the_rise_changes_nothing() -> None:
    cfg = replace(CFG, pooled=True)
    snap = Snapshot("m", 0.0, (8.0,) * 5, 8.0, (GPU,), ())
    plain = plan_step(snap, ControlState(), cfg, 1.0)
    with_rise = plan_step(replace(snap, carried_rise=Rise(3.0, 3.0)), ControlState(), cfg, 1.0)
    assert plain.launches == with_rise.launches


def test_stand_alone_as_configured_stays_stand_alone() -> None:
    """``planner.pooled_capacity = false`` (the paper's planner): no pooling for rises."""
    snap = Snapshot("m", 0.0, (8.0,) * 5, 8.0, (GPU,), (), carried_rise=Rise(2.0, 2.0))
    step = plan_step(snap, ControlState(), replace(CFG, pool_for_rises=False), 1.0)
    assert sum(launch.count for launch in step.launches) == 16


def test_a_spot_notice_rates_the_lost_instance_as_the_plan_counted_it() -> None:
    """The standbys a notice starts cover what the plan counted the victim for: in a pool
    sized for the worst rise, more than it carries alone."""
    spot = replace(GPU, market="spot", price_per_hour=0.3)
    fleet = tuple(
        Member(f"s{k}", "m", "p2.xlarge", "spot", "serving", "ready", 0.0, 0.3) for k in range(8)
    )
    standbys = tuple(
        Member(f"t{k}", "m", "t3.large", "on-demand", "standby", "stopped", 0.0, 0.0832)
        for k in range(4)
    )
    cfg = replace(CFG, standby_type="t3.large", standby_price=0.0832, standby_capacity_rps=0.5)

    def started(worst: float | None) -> int:
        snap = Snapshot(
            "m", 0.0, (8.0,) * 5, 8.0, (spot,), (*fleet, *standbys), carried_rise=_carried(worst)
        )
        res = interruption_step(snap, ControlState(), cfg, "s0", 120.0)
        assert res is not None and res.start is not None
        return len(res.start.instance_ids)

    assert started(None) == 1  # alone: 0.5 r/s lost, one standby
    # With a worst rise of 2 the plan counts each of the 8 at 4.0 / 2 = 2 r/s: four.
    assert started(2.0) == 4


def test_the_rating_says_how_the_plan_counted_each_instance() -> None:
    snap = Snapshot("m", 0.0, (8.0,) * 5, 8.0, (GPU,), ())
    assert rating(snap, replace(CFG, pooled=True)).startswith("in a pool (spill")
    assert rating(snap, CFG).startswith("alone")
    whole = replace(snap, carried_rise=Rise(2.5, 2.5))
    assert "rise of x2.50 within 2 min" in rating(whole, CFG)
    scaled = rating(replace(snap, carried_rise=Rise(1.4, 3.1)), CFG)
    assert "x1.40 of the x3.10 the history shows" in scaled and "within 2 min" in scaled
    assert rating(whole, replace(CFG, pool_for_rises=False)).startswith("alone")
