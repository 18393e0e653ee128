"""The load that has persisted as a floor under the plan: a level held for d seconds is
planned for d seconds ahead, never above what every window of the span carried."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from provisioner.control_state import ControlState
from provisioner.persisting_load import (
    MIN_WINDOWS,
    break_even_age,
    persisting_floor,
    with_floor,
)
from provisioner.step import plan_step
from tests.provisioner.test_step import CFG, RT, snap


def test_a_level_held_for_d_seconds_is_planned_for_d_seconds_ahead() -> None:
    # Newest first: 300 r/s for the last 3 minutes (36 windows of 5 s), 100 before.
    recent = [300.0] * 36 + [100.0] * 100
    assert persisting_floor(recent, 5.0, 6, 60.0, 0.0) == [300.0] * 4 + [100.0] * 2
    # A minute of it raises only the step under way and the next.
    young = [300.0] * 12 + [100.0] * 100
    assert persisting_floor(young, 5.0, 4, 60.0, 0.0) == [300.0, 300.0, 100.0, 100.0]
    # Not before the rise has lasted long enough to buy for: then for as long ahead.
    assert persisting_floor(recent, 5.0, 6, 60.0, 200.0) == [100.0] * 6
    assert persisting_floor(recent, 5.0, 6, 60.0, 150.0) == [300.0] * 4 + [100.0] * 2
    assert persisting_floor(recent, 5.0, 3, 60.0, math.inf) == [0.0] * 3
    # One window is counting noise; a history shorter than the span floors nothing.
    assert persisting_floor([300.0] + [100.0] * 30, 5.0, 1, 60.0, 0.0) == [100.0]
    assert persisting_floor([300.0] * 20, 5.0, 3, 60.0, 0.0) == [300.0, 300.0, 0.0]
    # A quiet window (none came) ends what held.
    assert persisting_floor([300.0, 0.0] + [300.0] * 40, 5.0, 3, 60.0, 0.0) == [0.0] * 3


def test_a_rise_pays_for_an_instance_once_it_has_lasted_past_the_break_even() -> None:
    """Held d and lasting d more, an instance booting b serves d − b and idles k after:
    it pays once c_λ (d − b) > c_o (d + k), i.e. d > (b + r k) / (1 − r), r = c_o/c_λ."""
    assert break_even_age(120.0, 1.0, 120.0) == 120.0  # spill dear beyond measure: the boot
    assert break_even_age(120.0, 0.0, 120.0) == math.inf  # an instance costs spill's price
    d, b, k, c_o, c_l = break_even_age(120.0, 0.75, 120.0), 120.0, 120.0, 1.0, 4.0
    assert d == 200.0 and c_l * (d - b) == c_o * (d + k)  # the break-even, exactly
    assert break_even_age(120.0, 0.75, 0.0) == 160.0


@given(
    st.lists(st.floats(0.0, 1e4, allow_nan=False), max_size=200),
    st.integers(1, 30),
    st.sampled_from([1.0, 5.0, 10.0]),
)
def test_the_floor_never_exceeds_what_every_window_of_its_span_carried(
    recent: list[float], steps: int, window_s: float
) -> None:
    floor = persisting_floor(recent, window_s, steps, 60.0, 0.0)
    assert len(floor) == steps
    assert all(a >= b for a, b in itertools.pairwise(floor))  # longer span, lower
    for j, f in enumerate(floor):
        span = max(MIN_WINDOWS, -(-j * 60 // int(window_s)))
        assert f == 0.0 or f <= min(recent[:span])
    raised = with_floor([5.0] * (steps + 2), floor)
    assert raised[:steps] == [max(5.0, f) for f in floor] and raised[steps:] == [5.0, 5.0]


def test_a_plan_buys_for_a_load_that_persisted_past_a_forecast_that_lags() -> None:
    """The forecast says 10 r/s; the load has held 60 r/s for five minutes: the plan
    buys for 60 r/s and says why. Held for a minute only, against a 120 s boot, it buys
    for the forecast: what it would buy boots after the span the rise has earned."""
    cfg = replace(CFG, boot_s=120.0, tau_steps=2, spill_cost_per_request=2e-5)
    held = tuple([60.0] * 60 + [10.0] * 60)
    lagging = replace(snap(10.0), recent_rates=held)
    step = plan_step(lagging, ControlState(), cfg, RT)
    capacity = sum(
        a.count * (10.0 if a.instance_type == "c5.large" else 21.0) for a in step.launches
    )
    assert capacity >= 60.0  # the fleet is empty: it all comes from launches
    assert "load-persisting" in [n.action for n in step.notes]
    assert step.state.of("m").planned_rps == 60.0  # early steps measure from what held
    young = replace(snap(10.0), recent_rates=tuple([60.0] * 12 + [10.0] * 60))
    early = plan_step(young, ControlState(), cfg, RT)
    forecast_only = plan_step(snap(10.0), ControlState(), cfg, RT)
    assert early.launches == forecast_only.launches


def test_where_spill_misses_rt_max_there_is_nothing_to_rent_and_no_floor() -> None:
    """Unpriced spill (not measured to answer within RT_max): the plan is the forecast's;
    the SLO monitor's backups are sized to a shortfall there."""
    cfg = replace(CFG, boot_s=120.0, tau_steps=2, spill_cost_per_request=None)
    held = replace(snap(10.0), recent_rates=tuple([60.0] * 60 + [10.0] * 60))
    step = plan_step(held, ControlState(), cfg, RT)
    assert step.launches == plan_step(snap(10.0), ControlState(), cfg, RT).launches
    assert "load-persisting" not in [n.action for n in step.notes]
    off = replace(cfg, spill_cost_per_request=2e-5, persisting_floor=False)  # configured off
    assert plan_step(held, ControlState(), off, RT).launches == step.launches
