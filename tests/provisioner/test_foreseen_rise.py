"""Buying ahead for a foreseen rise: the break-even chance, by hand and in a plan step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provisioner.control_state import ControlState, Snapshot, StepConfig
from provisioner.foreseen_rise import UNPRICED_CHANCE, buy_ahead_chance, with_rises
from provisioner.greedy import PlannerOption
from provisioner.guards import GuardConfig
from provisioner.step import plan_step

# 10 r/s for $0.036/h: $1e-6 per request at full use.
CHEAP = PlannerOption("c5.large", "spot", 0.036, 10.0, latency_s=0.01)
# 10 r/s for $0.54/h: $1.5e-5 per request, three quarters of spill's price.
DEAR = PlannerOption("c5.large", "on-demand", 0.54, 10.0, latency_s=0.01)
SPILL = 2e-5  # $ per request
LEAD, REACT, HOLD = 120.0, 180.0, 120.0
RT = 0.1


def _expected_saving(p: float, c_o: float) -> float:
    """What buying one instance (10 r/s) ahead saves on average, by the module's ledger."""
    comes = 10.0 * SPILL * REACT - 10.0 * c_o * LEAD
    false_alarm = 10.0 * c_o * (LEAD + HOLD)
    return p * comes - (1.0 - p) * false_alarm


@pytest.mark.parametrize(("option", "c_o"), [(CHEAP, 1e-6), (DEAR, 1.5e-5)])
def test_the_least_chance_is_where_buying_ahead_breaks_even(
    option: PlannerOption, c_o: float
) -> None:
    p = buy_ahead_chance(SPILL, [option], lead_s=LEAD, react_s=REACT, hold_s=HOLD)
    # by hand: c_o (lead + hold) / (c_λ react + c_o hold)
    assert p == pytest.approx(c_o * (LEAD + HOLD) / (SPILL * REACT + c_o * HOLD))
    assert _expected_saving(p, c_o) == pytest.approx(0.0, abs=1e-12)
    assert _expected_saving(p + 0.05, c_o) > 0.0 > _expected_saving(p - 0.05, c_o)


def test_cheap_capacity_buys_for_unlikely_rises_and_dear_only_for_likely_ones() -> None:
    cheap = buy_ahead_chance(SPILL, [CHEAP, DEAR], lead_s=LEAD, react_s=REACT, hold_s=HOLD)
    dear = buy_ahead_chance(SPILL, [DEAR], lead_s=LEAD, react_s=REACT, hold_s=HOLD)
    assert cheap < 0.1 < 0.5 < dear  # the cheapest offering decides


def test_an_unpriced_spill_buys_only_for_a_certain_rise() -> None:
    p = buy_ahead_chance(None, [CHEAP], lead_s=LEAD, react_s=REACT, hold_s=HOLD)
    assert p == UNPRICED_CHANCE
    assert with_rises([10.0], [0.99], [50.0], p) == ([10.0], 0)
    assert with_rises([10.0], [1.0], [50.0], p) == ([50.0], 1)
    assert buy_ahead_chance(SPILL, [], lead_s=LEAD, react_s=REACT, hold_s=HOLD) == UNPRICED_CHANCE


def test_a_rise_raises_only_the_steps_it_is_likely_enough_and_higher_on() -> None:
    out, raised = with_rises(
        [10.0] * 5, [0.0, 0.4, 0.4, 0.2, 0.4], [0.0, 50.0, 5.0, 50.0, 30.0], 0.3
    )
    assert out == [10.0, 50.0, 10.0, 10.0, 30.0] and raised == 2
    assert with_rises([10.0] * 3, [], [], 0.0) == ([10.0] * 3, 0)


CFG = StepConfig(
    step_s=60.0,
    tau_steps=2,
    boot_s=LEAD,
    window_steps=5,
    guard=GuardConfig(cooldown_s=HOLD, billing_minimum_s=60.0),
    spill_cost_per_request=SPILL,
)


def _rise_in_two_steps(option: PlannerOption, chance: float) -> Snapshot:
    """10 r/s, a rise to 40 r/s foreseen from step 2 with ``chance`` (seen yesterday)."""
    base = Snapshot("m", 1000.0, (10.0,) * 5, 40.0, (option,), ())
    return replace(base, rise_chance=(0.0, 0.0, chance, chance, 0.0), rise_rate=(0, 0, 40, 40, 0))


def test_a_plan_buys_ahead_for_a_rise_when_its_chance_pays_for_it() -> None:
    cheap = plan_step(_rise_in_two_steps(CHEAP, 0.3), ControlState(), CFG, RT)
    assert sum(a.count for a in cheap.launches) == 4  # 40 r/s, bought now to serve at step 2
    assert cheap.forecast[2] == 40.0
    (note,) = [n for n in cheap.notes if n.action == "rise-ahead"]
    assert "30%" in note.reason and note.count == 2
    dear = plan_step(_rise_in_two_steps(DEAR, 0.3), ControlState(), CFG, RT)
    assert sum(a.count for a in dear.launches) == 1  # the 10 r/s now; the rise waits
    assert dear.forecast == (10.0,) * 5 and not [n for n in dear.notes if n.action == "rise-ahead"]
