"""The SLO monitor's control step: verdict, backups within the rails, sized to the load
where spill misses RT_max, topped up while judged, the fleet looked at again only when the
load rises past what the backups were sized to."""

from __future__ import annotations

import math
from dataclasses import replace

from provisioner.backup_step import (
    backup_launch,
    backup_topup,
    backups_sized,
    load_wanted,
    slo_step,
)
from provisioner.control_state import ControlState, ModelControl
from provisioner.greedy import PlannerOption
from provisioner.slo_monitor import SloMonitorConfig, backup_offering
from provisioner.spend_rails import SpendLimits
from provisioner.spill_evidence import SpillEvidence
from tests.provisioner.test_step import CFG, inst, snap

MON = SloMonitorConfig(rt_max_s=0.1, window=4, holdoff_s=120.0)
LATE = SpillEvidence().observe(within=0, total=100, cost=0.0)


def late_state() -> ControlState:
    return ControlState().with_model("m", replace(ModelControl(), spill=LATE))


def test_backups_fire_once_then_hold_off_and_pass_the_rail() -> None:
    action, state = slo_step(ControlState(), "m", 1000.0, MON, [math.inf] * 4)
    assert action is not None
    again, state = slo_step(state, "m", 1001.0, MON, [math.inf] * 4)
    assert again is None  # held off
    launch, notes = backup_launch(snap(1.0), CFG, MON, action, 0.085, state)
    assert launch is not None and launch.role == "backup" and notes == []
    broke = replace(CFG, limits=SpendLimits(per_model=0.05))
    launch, notes = backup_launch(snap(1.0), broke, MON, action, 0.085, state)
    assert launch is None and [n.action for n in notes] == ["spend-rail"]


def test_backups_carry_the_load_measured_above_the_fleet() -> None:
    """Given the load measured now (where spill misses RT_max), as many backups as carry
    what it exceeds the fleet by; no more than the fleet bound leaves room for; L where
    nothing is measured or nothing is short."""
    action, state = slo_step(ControlState(), "m", 1000.0, MON, [math.inf] * 4)
    assert action is not None and action.count == 1
    two = snap(1.0, fleet=(inst("a"), inst("b")))  # 2 × 10 r/s
    sized, _ = backup_launch(two, CFG, MON, action, 0.085, state, observed_rps=45.0)
    assert sized is not None and sized.count == 3  # (45 − 20) / 10, rounded up
    assert "45.0 r/s" in sized.reason and "20.0 r/s" in sized.reason
    for observed in (15.0, None):
        plain, _ = backup_launch(two, CFG, MON, action, 0.085, state, observed_rps=observed)
        assert plain is not None and plain.count == 1
    bounded = replace(CFG, guard=replace(CFG.guard, max_fleet=4))
    capped, notes = backup_launch(two, bounded, MON, action, 0.085, state, observed_rps=45.0)
    assert capped is not None and capped.count == 2
    (held,) = notes  # the one the bound left out is said
    assert held.action == "fleet-bound" and held.count == 1
    _, unbounded = backup_launch(two, CFG, MON, action, 0.085, state, observed_rps=45.0)
    assert unbounded == []
    # At the bound even the configured L is held, and said: the bound is the user's cap.
    full = replace(CFG, guard=replace(CFG.guard, max_fleet=2))
    for observed in (45.0, None):
        held_all, notes = backup_launch(two, full, MON, action, 0.085, state, observed)
        assert held_all is None and [(n.action, n.count) for n in notes] == [
            ("fleet-bound", 3 if observed else 1)
        ]


def test_the_load_is_wanted_only_where_spill_is_late_at_a_verdict_or_while_judged() -> None:
    start = late_state()
    assert not load_wanted(start, "m", 1000.0, None)  # nothing to decide
    action, state = slo_step(start, "m", 1000.0, MON, [math.inf] * 4)
    assert load_wanted(start, "m", 1000.0, action)  # the verdict
    assert load_wanted(state, "m", 1010.0, None)  # judged: a top-up may be due
    assert not load_wanted(state, "m", 1121.0, None)  # the hold-off is over
    in_time = SpillEvidence().observe(within=100, total=100, cost=0.0)
    spilling = state.with_model("m", replace(state.of("m"), spill=in_time))
    assert not load_wanted(spilling, "m", 1010.0, None)
    assert not load_wanted(spilling, "m", 1000.0, action)


def test_while_backups_are_judged_a_top_up_adds_only_what_is_still_missing() -> None:
    """The verdict can come before a closed window shows a burst's rate; during the
    hold-off that follows, a top-up launches what the load still exceeds the fleet by,
    the booting backups counted, and only where spill is measured to miss RT_max."""
    start = late_state()
    assert backup_topup(start, "m", 1000.0, MON, 52.0) is None  # no verdict yet
    action, state = slo_step(start, "m", 1000.0, MON, [math.inf] * 4)
    assert action is not None
    unknown = state.with_model("m", replace(state.of("m"), spill=SpillEvidence()))
    assert backup_topup(unknown, "m", 1010.0, MON, 52.0) is None  # spill not measured late
    assert backup_topup(state, "m", 1010.0, MON, None) is None  # the load not measured
    topup = backup_topup(state, "m", 1010.0, MON, 52.0)
    assert topup is not None and topup.count == 0
    fleet = (inst("a"), inst("b"), inst("c", state="pending", at=1000.0, role="backup"))
    none, notes = backup_launch(snap(1.0, fleet=fleet), CFG, MON, topup, 0.085, state, 25.0)
    assert none is None and notes == []  # the booting backup covers it
    more, _ = backup_launch(snap(1.0, fleet=fleet), CFG, MON, topup, 0.085, state, 52.0)
    assert more is not None and more.count == 3 and more.reason.startswith("more backups")
    broke = replace(CFG, limits=SpendLimits(per_model=0.05))
    refused, notes = backup_launch(snap(1.0, fleet=fleet), broke, MON, topup, 0.085, state, 52.0)
    assert refused is None and notes == []  # no note every few seconds: the verdict had one
    assert backup_topup(state, "m", 1121.0, MON, 52.0) is None  # the hold-off is over


def test_a_top_up_is_due_only_once_the_load_rises_past_what_the_backups_were_sized_to() -> None:
    action, state = slo_step(late_state(), "m", 1000.0, MON, [math.inf] * 4)
    assert action is not None
    sized = backups_sized(state, "m", 52.0)
    assert backups_sized(state, "m", None) == state
    for load in (30.0, 52.0):
        assert backup_topup(sized, "m", 1010.0, MON, load) is None
    assert backup_topup(sized, "m", 1010.0, MON, 60.0) is not None
    assert backups_sized(sized, "m", 40.0).of("m").slo.sized_rps == 52.0  # never lowered
    # A new verdict starts from nothing sized: its hold-off judges new backups.
    after = sized.of("m").slo.holdoff_until + 1.0
    again, fresh = slo_step(sized, "m", after, MON, [math.inf] * 4)
    assert again is not None and fresh.of("m").slo.sized_rps == 0.0


def test_the_backup_offering_is_the_cheapest_by_hour_in_the_markets_the_plans_may_buy() -> None:
    gpu = PlannerOption("p2.xlarge", "on-demand", 0.9, 51.0)  # cheapest per request
    small = PlannerOption("c5.large", "on-demand", 0.085, 1.66)
    spot = PlannerOption("c5.large", "spot", 0.029, 1.66)
    big_spot = PlannerOption("c5.xlarge", "spot", 0.06, 3.4)
    useless = PlannerOption("t3.small", "on-demand", 0.02, 0.0)  # cannot meet the SLO
    assert backup_offering([gpu, small, useless]) == ("c5.large", "on-demand")
    assert backup_offering([gpu, small, spot, big_spot, useless]) == ("c5.large", "spot")
    assert backup_offering([gpu]) == ("p2.xlarge", "on-demand")
    assert backup_offering([useless]) is None
    # A configured type: its cheapest offering; on demand where the model has none of it.
    assert backup_offering([gpu, small, spot, big_spot], "c5.xlarge") == ("c5.xlarge", "spot")
    assert backup_offering([gpu, small], "c5.xlarge") == ("c5.xlarge", "on-demand")
