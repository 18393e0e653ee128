"""Cool-down, billing minimum, reuse and fleet cap around a raw decision."""

from provisioner.greedy import PlannerOption, RunningInstance, plan_greedy
from provisioner.guards import (
    Decision,
    FleetInstance,
    GuardConfig,
    GuardState,
    RawDecision,
    apply_guards,
)

C5 = ("c5.large", "on-demand")
P2 = ("p2.xlarge", "spot")
CFG = GuardConfig(cooldown_s=300, billing_minimum_s=60, max_fleet=4)


def raw(keep: set[str], **launch: int) -> RawDecision:
    keys = {"c5": C5, "p2": P2}
    return RawDecision(frozenset(keep), tuple((keys[k], n) for k, n in launch.items()))


def test_launches_go_out_at_once() -> None:
    decision, state = apply_guards(raw(set(), c5=2), [], GuardState(), 0.0, CFG)
    assert decision.launch == ((C5, 2),)
    assert decision.retire == ()
    assert state.last_wanted == {}


def test_unwanted_instance_retires_only_after_cooldown_since_last_wanted() -> None:
    fleet = [FleetInstance("i-1", C5, launched_at=0.0)]
    _, state = apply_guards(raw({"i-1"}), fleet, GuardState(), 900.0, CFG)
    assert state.last_wanted == {"i-1": 900.0}
    decision, state = apply_guards(raw(set()), fleet, state, 1100.0, CFG)
    assert decision.retire == ()
    assert decision.held == (("i-1", "cool-down until t=1200"),)
    decision, state = apply_guards(raw(set()), fleet, state, 1200.0, CFG)
    assert decision.retire == ("i-1",)
    assert state.last_wanted == {}


def test_never_retired_before_the_billing_minimum() -> None:
    fleet = [FleetInstance("i-1", C5, launched_at=1000.0)]
    no_cooldown = GuardConfig(cooldown_s=0, billing_minimum_s=60)
    decision, state = apply_guards(raw(set()), fleet, GuardState(), 1030.0, no_cooldown)
    assert decision.retire == ()
    assert decision.held[0][1].startswith("billing minimum")
    decision, _ = apply_guards(raw(set()), fleet, state, 1060.0, no_cooldown)
    assert decision.retire == ("i-1",)


def test_unwanted_instance_of_the_same_offering_is_reused_not_relaunched() -> None:
    fleet = [FleetInstance("i-1", C5, 0.0), FleetInstance("i-2", P2, 0.0)]
    decision, state = apply_guards(raw({"i-2"}, c5=2), fleet, GuardState(), 500.0, CFG)
    assert decision.reused == ("i-1",)
    assert decision.launch == ((C5, 1),)
    assert state.last_wanted["i-1"] == 500.0


def test_fleet_cap_drops_launches_and_counts_cooling_instances() -> None:
    fleet = [FleetInstance(f"i-{n}", P2, 0.0) for n in range(3)]
    decision, _ = apply_guards(raw({"i-0", "i-1"}, c5=3), fleet, GuardState(), 100.0, CFG)
    # i-2 is unwanted but cooling down, so only one slot of four is free.
    assert decision.launch == ((C5, 1),)
    assert decision.dropped == ((C5, 2),) and decision.dropped_launches == 2


def test_wraps_a_greedy_plan() -> None:
    option = PlannerOption("c5.large", "on-demand", 0.085, 4.7)
    running = [RunningInstance("i-1", option), RunningInstance("i-2", option)]
    plan = plan_greedy([4.0] * 10, running, [option], tau_steps=0)
    fleet = [FleetInstance("i-1", C5, 0.0), FleetInstance("i-2", C5, 0.0)]
    decision: Decision
    decision, _ = apply_guards(RawDecision.from_plan(plan), fleet, GuardState(), 30.0, CFG)
    assert plan.retire == ("i-2",)
    assert decision.retire == () and decision.launch == ()


def test_a_hold_retires_nothing_and_restarts_the_cooldown_when_it_ends() -> None:
    fleet = [FleetInstance("i-1", C5, launched_at=0.0)]
    state = GuardState({"i-1": 100.0})  # unwanted since t=100: due at t=400
    decision, state = apply_guards(raw(set()), fleet, state, 500.0, CFG, hold="SLO missed")
    assert decision.retire == () and decision.held == (("i-1", "SLO missed"),)
    assert state.last_wanted == {"i-1": 500.0}  # counts as wanted while the SLO is missed
    decision, state = apply_guards(raw(set()), fleet, state, 700.0, CFG)
    assert decision.retire == ()  # a full cool-down from the hold
    decision, _ = apply_guards(raw(set()), fleet, state, 800.0, CFG)
    assert decision.retire == ("i-1",)
