"""The pure control steps, by table: a snapshot with overrides, the state threaded on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provisioner.control_state import ControlState, Member, ModelControl, Snapshot, StepConfig
from provisioner.greedy import PlannerOption
from provisioner.guards import GuardConfig
from provisioner.slo_monitor import SloMonitorState
from provisioner.spend_rails import SpendLimits
from provisioner.standby_step import interruption_step, standby_pool_step
from provisioner.step import avoid_offering, plan_step, retirements

SMALL = PlannerOption("c5.large", "on-demand", 0.085, 10.0, latency_s=0.01)
BIG = PlannerOption("c5.xlarge", "on-demand", 0.17, 21.0, latency_s=0.01)
SPOT = PlannerOption("c5.large", "spot", 0.03, 10.0, latency_s=0.01)
CFG = StepConfig(
    step_s=60.0,
    tau_steps=1,
    boot_s=60.0,
    window_steps=5,
    guard=GuardConfig(cooldown_s=300.0, billing_minimum_s=60.0),
    standby_type="t3.large",
    standby_price=0.0832,
    standby_capacity_rps=10.0,
    standby_loss_fraction=0.5,
)
RT = 0.1


def snap(
    rate: float, now: float = 1000.0, fleet: tuple[Member, ...] = (), **kw: object
) -> Snapshot:
    base = Snapshot("m", now, (rate,) * 5, rate, (SMALL, BIG), fleet)
    return replace(base, **kw)  # type: ignore[arg-type]


def inst(iid: str, opt: PlannerOption = SMALL, at: float = 0.0, **kw: object) -> Member:
    m = Member(iid, "m", opt.instance_type, opt.market, "serving", "ready", at, opt.price_per_hour)
    return replace(m, **kw)  # type: ignore[arg-type]


def test_unneeded_instances_retire_only_after_the_cooldown() -> None:
    fleet = (inst("a"), inst("b"))
    state = ControlState()
    s1 = plan_step(snap(15.0, 1000.0, fleet), state, CFG, RT)  # both needed
    assert s1.retire == () and s1.launches == ()
    state = s1.state
    held = plan_step(snap(5.0, 1100.0, fleet), state, CFG, RT)  # one surplus, cooling
    assert held.retire == () and len(held.held) == 1 and "cool-down" in held.held[0][1]
    done = plan_step(snap(5.0, 1000.0 + 300.0, fleet), held.state, CFG, RT)
    assert len(done.retire) == 1


def test_slo_hold_off_keeps_the_fleet() -> None:
    fleet = (inst("a"), inst("b"))
    state = ControlState({"m": ModelControl(slo=SloMonitorState((), holdoff_until=2000.0))})
    s = plan_step(snap(0.5, 1900.0, fleet), state, CFG, RT)
    assert s.retire == () and all("SLO missed" in why for _, why in s.held)


def test_an_avoided_offering_is_not_bought_until_its_ttl_ends() -> None:
    state = avoid_offering(ControlState(), BIG.key, 1000.0, 180.0)
    s = plan_step(snap(30.0, 1000.0), state, CFG, RT)
    assert s.launches and {a.key for a in s.launches} == {SMALL.key}
    later = plan_step(snap(30.0, 1181.0), state, CFG, RT)
    assert BIG.key in {a.key for a in later.launches}


def test_forecast_clip_and_spend_rail_are_notes() -> None:
    cfg = replace(CFG, limits=SpendLimits(per_model=0.2))
    s = plan_step(snap(30.0, forecast=(30.0, 1e6, 1e6, 1e6, 1e6)), ControlState(), cfg, RT)
    actions = [n.action for n in s.notes]
    assert actions[0] == "forecast-clipped" and "spend-rail" in actions
    assert max(s.forecast) == 60.0
    assert (
        sum(a.count * (BIG if a.key == BIG.key else SMALL).price_per_hour for a in s.launches)
        <= 0.2
    )


def test_launches_the_fleet_bound_leaves_out_are_a_note_per_offering() -> None:
    """At ``max_instances`` the plan's launches are cut, and the step says which and why."""
    bounded = replace(CFG, guard=replace(CFG.guard, max_fleet=3))
    fleet = (inst("a"), inst("b"))
    s = plan_step(snap(100.0, fleet=fleet), ControlState(), bounded, RT)
    assert sum(a.count for a in s.launches) == 1  # one slot of three was free
    (note,) = [n for n in s.notes if n.action == "fleet-bound"]
    wanted = plan_step(snap(100.0, fleet=fleet), ControlState(), CFG, RT)
    assert note.count == sum(a.count for a in wanted.launches) - 1
    assert "offerings.max_instances (3)" in note.reason
    unbounded = [n for n in wanted.notes if n.action == "fleet-bound"]
    assert unbounded == []


@pytest.mark.parametrize(("failed", "kept"), [(0, ("x",)), (1, ())])
def test_retire_nothing_when_launches_failed(failed: int, kept: tuple[str, ...]) -> None:
    retire, note = retirements(("x",), failed)
    assert retire == kept
    assert (note is not None) is (failed > 0)


def test_standby_pool_is_sized_to_spot_at_risk_then_released() -> None:
    spot = (inst("s1", SPOT), inst("s2", SPOT))
    s = snap(20.0, 1000.0, spot, options=(SMALL, SPOT))
    launch = standby_pool_step(s, ControlState(), CFG, spot, 20.0).launch
    # one offering holds all 20 r/s: all of it could go at once, two 10 r/s standbys cover it
    assert launch is not None and launch.count == 2 and launch.role == "standby"
    # a started standby is stopped once ready replacements cover the load
    standby = inst("t", at=0.0, role="standby", state="running", instance_type="t3.large")
    s2 = replace(s, fleet=(*spot, standby))
    stop = standby_pool_step(s2, ControlState(), CFG, spot, 20.0).stop
    assert stop is not None and stop.instance_ids == ("t",)
    held = ControlState({"m": ModelControl(hold_standbys_until=2000.0)})
    stop = standby_pool_step(s2, held, CFG, spot, 20.0).stop
    assert stop is None  # replacements still booting: the hold keeps it


def test_interruption_starts_standbys_dooms_the_victim_and_avoids_its_offering() -> None:
    standby = inst("t", role="standby", state="stopped", instance_type="t3.large")
    standby = replace(standby, price_per_hour=0.0832)
    victim = inst("s1", SPOT)
    s = snap(10.0, 1000.0, (victim, standby), options=(SMALL, SPOT))
    res = interruption_step(s, ControlState(), CFG, "s1", 1120.0)
    assert res is not None and res.start is not None and res.start.instance_ids == ("t",)
    assert res.state.doomed == {"s1": 1120.0}
    assert res.state.avoid.avoid_until[SPOT.key] > 1000.0
    assert res.state.of("m").hold_standbys_until == 1120.0 + CFG.boot_s
    assert interruption_step(s, res.state, CFG, "s1", 1120.0) is None  # repeated notice
    # the doomed instance is planned without: the plan replaces it, not with spot
    p = plan_step(replace(s, fleet=(victim,)), res.state, CFG, RT)
    assert p.launches and all(a.key != SPOT.key for a in p.launches)


def test_a_plan_remembers_the_rate_it_was_made_for_and_when() -> None:
    """What load above it means an early step (``early_step``): the first step of the
    clipped forecast, foreseen rises included."""
    stepped = plan_step(snap(15.0, observed_peak=60.0), ControlState(), CFG, RT)
    control = stepped.state.of("m")
    assert control.planned_rps == stepped.forecast[0] == 15.0 and control.planned_at == 1000.0
    rising = replace(snap(15.0, observed_peak=60.0), rise_chance=(1.0,) * 5, rise_rate=(40.0,) * 5)
    assert plan_step(rising, ControlState(), CFG, RT).state.of("m").planned_rps == 40.0
