"""The newsvendor capacity target: how much of each step's peak instances should carry."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.capacity_target import (
    capacity_target,
    critical_quantile,
    quantile_to_peak,
    spill_price,
)
from provisioner.control_state import ControlState, Snapshot, StepConfig
from provisioner.greedy import PlannerOption
from provisioner.guards import GuardConfig
from provisioner.spill_evidence import SpillEvidence
from provisioner.step import plan_step

# $0.36/h at 10 r/s is 1e-5 per request at full use.
OPT = PlannerOption("c5.large", "on-demand", 0.36, 10.0, latency_s=0.01)


def test_critical_quantile_is_one_minus_instance_over_spill_price() -> None:
    assert critical_quantile(4e-5, [OPT]) == pytest.approx(0.75)
    dear = replace(OPT, instance_type="x", price_per_hour=0.72)
    assert critical_quantile(4e-5, [dear, OPT]) == pytest.approx(0.75)  # the cheapest
    pooled = replace(OPT, pool=((8, 20.0),))  # in a pool it carries 20 r/s
    assert critical_quantile(4e-5, [pooled]) == pytest.approx(0.875)
    assert critical_quantile(0.5e-5, [OPT]) == 0.0  # spill cheaper than any instance
    assert critical_quantile(0.0, [OPT]) == 1.0 and critical_quantile(4e-5, []) == 1.0


def test_quantile_to_peak_is_the_median_ratio_over_whole_minutes() -> None:
    ramp = [float(r) for r in range(1, 13)]  # 12 windows, 1..12 r/s
    flat = [6.0] * 12
    # numpy's linear quantile of 1..12 at 0.5 is 6.5: ratio 6.5/12; flat minutes give 1.
    assert quantile_to_peak([ramp], 0.5) == pytest.approx(6.5 / 12)
    assert quantile_to_peak([ramp, ramp, flat], 0.5) == pytest.approx(6.5 / 12)
    assert quantile_to_peak([ramp, flat, flat], 0.5) == 1.0
    assert quantile_to_peak([[5.0, 1.0], [0.0] * 12], 0.5) == 1.0  # too few windows; idle
    assert quantile_to_peak([ramp], 1.0) == 1.0


@given(
    st.lists(st.lists(st.floats(0, 1e4), min_size=6, max_size=12), max_size=20),
    st.floats(0, 1),
)
def test_the_ratio_is_a_share_of_the_peak(minutes: list[list[float]], q: float) -> None:
    assert 0.0 <= quantile_to_peak(minutes, q) <= 1.0 + 1e-12


def test_target_is_the_forecast_until_spill_has_a_price() -> None:
    ramp = [[float(r) for r in range(1, 13)]] * 3
    assert capacity_target([12.0, 24.0], ramp, None, [OPT]) == ([12.0, 24.0], 1.0)
    target, ratio = capacity_target([12.0, 24.0], ramp, 2e-5, [OPT])  # q = 0.5
    assert ratio == pytest.approx(6.5 / 12)
    assert target == pytest.approx([6.5, 13.0])


def test_spill_price_needs_the_switch_and_spill_in_time() -> None:
    fast = SpillEvidence().observe(within=100, total=100, cost=100 * 2e-5)
    slow = SpillEvidence().observe(within=10, total=100, cost=100 * 2e-5)
    assert spill_price(True, fast) == pytest.approx(2e-5)
    assert spill_price(False, fast) is None and spill_price(True, slow) is None


def test_plan_step_buys_for_the_target_not_the_peak() -> None:
    cfg = StepConfig(step_s=60.0, tau_steps=1, boot_s=60.0, window_steps=5, guard=GuardConfig())
    shape = tuple(tuple(float(r) for r in range(1, 13)) for _ in range(10))
    snap = Snapshot("m", 1000.0, (120.0,) * 5, 120.0, (OPT,), (), window_minutes=shape)
    peak = plan_step(snap, ControlState(), cfg, 0.1)
    assert sum(n.count for n in peak.launches) == 12  # 120 r/s at 10 r/s each
    priced = plan_step(snap, ControlState(), replace(cfg, spill_cost_per_request=2e-5), 0.1)
    assert sum(n.count for n in priced.launches) == 7  # 120 × 6.5/12 = 65 r/s
