"""The warm pool's rules, pure: stop or terminate, the ski-rental hold, start before
launch, a start's cool-down and readiness; and the planning step that uses them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from provisioner.control_state import (
    ControlState,
    Launch,
    Member,
    Snapshot,
    StepConfig,
    WarmPoolConfig,
    WarmState,
)
from provisioner.greedy import PlannerOption
from provisioner.guards import GuardConfig
from provisioner.health_step import HealthConfig, HealthFact, health_step
from provisioner.step import plan_step
from provisioner.warm_pool import Rating, hold_s, keeps_warm, ready_at, substitute, warm_step

SMALL = PlannerOption("c5.large", "on-demand", 0.085, 10.0, latency_s=0.01)
SPOT = PlannerOption("c5.large", "spot", 0.03, 10.0, latency_s=0.01)
WARM = WarmPoolConfig(start_s=20.0, ebs_per_hour=8 * 0.08 / 730)  # 8 GB of gp3
BOOT = 120.0
CFG = StepConfig(
    step_s=60.0,
    tau_steps=2,
    boot_s=BOOT,
    window_steps=5,
    guard=GuardConfig(cooldown_s=BOOT, billing_minimum_s=60.0),
    warm=WARM,
)
RT = 0.1


def inst(iid: str, state: str = "ready", at: float = 0.0, opt: PlannerOption = SMALL) -> Member:
    return Member(iid, "m", opt.instance_type, opt.market, "serving", state, at, opt.price_per_hour)


def snap(rate: float, now: float, fleet: tuple[Member, ...]) -> Snapshot:
    return Snapshot("m", now, (rate,) * 5, rate, (SMALL,), fleet)


def test_the_hold_is_the_break_even_of_the_volume_against_the_boot_a_start_spares() -> None:
    # c5.large: $0.085/h × 100 s spared = $0.00236; 8 GB at $0.08/GB-month = $0.000877/h.
    expected_h = (0.085 * 100 / 3600) / (8 * 0.08 / 730)
    small = replace(inst("a", "stopped"), price_per_hour=0.085)
    assert hold_s(small, BOOT, WARM) == pytest.approx(expected_h * 3600)
    assert 2.6 < expected_h < 2.8
    assert hold_s(small, 20.0, WARM) == 0.0  # a start no faster than a launch: never kept
    assert hold_s(small, BOOT, replace(WARM, ebs_per_hour=0.0)) == math.inf


def test_where_spill_answers_in_time_the_hold_counts_the_spill_starts_spare() -> None:
    # What the offering's capacity would cost an hour on spill: a start that meets a load
    # outrunning the fleet serves it the boot − start sooner, and that much spill is
    # spared besides the price; a start planned ahead spares none. The hold counts it at
    # the share of starts that met such a load.
    small = replace(inst("a", "stopped"), price_per_hour=0.085)
    spilling = replace(WARM, spill_per_hour={small.key: 0.28})
    alone = hold_s(small, BOOT, WARM)
    assert hold_s(small, BOOT, spilling) == pytest.approx(alone)  # no start met one yet
    every = hold_s(small, BOOT, spilling, outrun_share=1.0)
    assert every == pytest.approx(alone * (0.085 + 0.28) / 0.085)
    half = hold_s(small, BOOT, spilling, outrun_share=0.5)
    assert half == pytest.approx(alone * (0.085 + 0.14) / 0.085)
    other = replace(WARM, spill_per_hour={("c5.xlarge", "on-demand"): 0.28})
    assert hold_s(small, BOOT, other, 1.0) == pytest.approx(alone)  # another offering's spill
    assert hold_s(small, 20.0, spilling, 1.0) == 0.0  # never kept where a start is no faster


def test_the_share_of_starts_that_met_an_outrun_load_is_learned_from_the_starts() -> None:
    pool = tuple(inst(f"p{i}", "stopped") for i in range(6))
    warm = WarmState({f"p{i}": 100.0 + i for i in range(6)})
    want = [Launch("m", "c5.large", "on-demand", 2, "serving", "load")]
    assert warm.outrun_share() == 0.0
    planned = warm_step(pool, 300.0, want, (), BOOT, WARM, warm).state
    assert planned.starts == pytest.approx(2.0) and planned.outrun_share() == 0.0
    rest = tuple(m for m in pool if m.instance_id not in planned.started_at)
    surge = warm_step(rest, 360.0, want, (), BOOT, WARM, planned, outrun=True).state
    assert surge.outrun_share() == pytest.approx(0.5, abs=0.02)  # 2 of 4, the older faded
    assert surge.outrun_starts < surge.starts < 4.0
    assert warm_step(rest, 400.0, (), (), BOOT, WARM, surge).state.starts == surge.starts


def test_only_on_demand_serving_instances_are_kept_warm() -> None:
    assert keeps_warm(inst("a"), BOOT, WARM)
    assert not keeps_warm(inst("s", opt=SPOT), BOOT, WARM)  # a spot request cannot stop
    assert not keeps_warm(replace(inst("x"), role="explore"), BOOT, WARM)
    assert not keeps_warm(inst("a"), BOOT, None)


def test_launches_start_stopped_instances_first_newest_stopped_first() -> None:
    pool = (inst("old", "stopped"), inst("new", "stopped"), inst("busy"))
    warm = WarmState({"old": 100.0, "new": 200.0})
    want = [Launch("m", "c5.large", "on-demand", 3, "serving", "load")]
    step = warm_step(pool, 300.0, want, (), BOOT, WARM, warm)
    assert step.start == ("new", "old")
    assert step.launches == (Launch("m", "c5.large", "on-demand", 1, "serving", "load"),)
    assert step.state.started_at == {"new": 300.0, "old": 300.0}
    assert step.state.stopped_at == {}
    one = warm_step(pool, 300.0, [replace(want[0], count=1)], (), BOOT, WARM, warm)
    assert one.start == ("new",) and one.launches == () and one.state.stopped_at == {"old": 100.0}
    spot = warm_step(pool, 300.0, [replace(want[0], market="spot")], (), BOOT, WARM, warm)
    assert spot.start == () and spot.launches == (replace(want[0], market="spot"),)


def test_retired_on_demand_instances_stop_spot_ones_terminate() -> None:
    fleet = (inst("a"), inst("s", opt=SPOT))
    step = warm_step(fleet, 500.0, (), ("a", "s"), BOOT, WARM, WarmState())
    assert step.stop == ("a",) and step.terminate == ("s",)
    assert step.state.stopped_at == {"a": 500.0}
    off = warm_step(fleet, 500.0, (), ("a", "s"), BOOT, None, WarmState())
    assert off.stop == () and set(off.terminate) == {"a", "s"}


def test_a_stopped_instance_is_terminated_once_held_past_the_break_even() -> None:
    held = hold_s(inst("a", "stopped"), BOOT, WARM)
    pool = (inst("a", "stopped"),)
    warm = WarmState({"a": 1000.0})
    kept = warm_step(pool, 1000.0 + held - 1.0, (), (), BOOT, WARM, warm)
    assert kept.terminate == () and kept.state.stopped_at == {"a": 1000.0}
    ended = warm_step(pool, 1000.0 + held, (), (), BOOT, WARM, warm)
    assert ended.terminate == ("a",) and ended.state.stopped_at == {}
    assert [n.action for n in ended.notes] == ["warm-expired"]
    # The pool switched off: what it left stopped is ended at once.
    assert warm_step(pool, 1001.0, (), (), BOOT, None, warm).terminate == ("a",)
    # One stopped that the state does not know (a restart lost it) is held from now.
    lost = warm_step(pool, 5000.0, (), (), BOOT, WARM, WarmState())
    assert lost.terminate == () and lost.state.stopped_at == {"a": 5000.0}


def test_a_started_instance_serves_a_start_after_its_start_not_a_boot() -> None:
    m = inst("a", "running", at=0.0)
    assert ready_at(m, BOOT, WarmState(started_at={"a": 1000.0}), WARM) == 1020.0
    assert ready_at(m, BOOT, WarmState(), WARM) == BOOT


def test_the_step_stops_after_a_start_s_cool_down_and_starts_before_launching() -> None:
    fleet = (inst("a"), inst("b"))
    s1 = plan_step(snap(15.0, 1000.0, fleet), ControlState(), CFG, RT)  # both wanted
    assert s1.stop == () and s1.retire == ()
    s2 = plan_step(snap(5.0, 1060.0, fleet), s1.state, CFG, RT)  # one unwanted for 60 s
    assert len(s2.stop) == 1 and s2.retire == ()  # past a start's 20 s: stopped, not ended
    (stopped,) = s2.stop
    assert s2.state.warm.stopped_at == {stopped: 1060.0}
    fleet2 = tuple(replace(m, state="stopped") if m.instance_id == stopped else m for m in fleet)
    s3 = plan_step(snap(25.0, 1120.0, fleet2), s2.state, CFG, RT)  # wants 3: start 1, launch 2
    assert s3.start == (stopped,)
    assert [(a.instance_type, a.count) for a in s3.launches] == [("c5.large", 1)]
    assert s3.state.warm.started_at == {stopped: 1120.0}
    assert "warm-start" in [n.action for n in s3.notes]
    # The started one counts: nothing more is launched for the same load.
    fleet3 = tuple(replace(m, state="running") if m.instance_id == stopped else m for m in fleet2)
    s4 = plan_step(snap(15.0, 1180.0, fleet3), s3.state, CFG, RT)
    assert s4.launches == () and s4.start == ()


def test_without_the_pool_the_step_terminates_after_the_full_cool_down() -> None:
    cfg = replace(CFG, warm=None)
    fleet = (inst("a"), inst("b"))
    s1 = plan_step(snap(15.0, 1000.0, fleet), ControlState(), cfg, RT)
    s2 = plan_step(snap(5.0, 1060.0, fleet), s1.state, cfg, RT)
    assert s2.stop == () and s2.retire == ()  # cooling down for the boot time
    s3 = plan_step(snap(5.0, 1120.0, fleet), s2.state, cfg, RT)
    assert s3.stop == () and len(s3.retire) == 1


def test_a_started_instance_s_boot_deadline_runs_from_its_start() -> None:
    # moto keeps the first launch time across a stop and start: the deadline must not.
    m = inst("a", "running", at=0.0)
    cfg = HealthConfig(boot_deadline_s=360.0, unhealthy_after_s=15.0)
    started = ControlState(warm=WarmState(started_at={"a": 5000.0}))
    change, _, _ = health_step(snap(1.0, 5100.0, (m,)), started, {}, cfg, 0.0)
    assert change is None
    change, notes, _ = health_step(snap(1.0, 5360.0, (m,)), started, {"a": HealthFact()}, cfg, 0.0)
    assert change is not None and change.instance_ids == ("a",)
    assert "360 s after launch or start" in notes[0].reason
    stale, _, _ = health_step(snap(1.0, 5100.0, (m,)), ControlState(), {}, cfg, 0.0)
    assert stale is not None  # without the start known, judged from its launch


def test_while_the_pool_holds_an_instance_the_plan_buys_a_start_ahead_not_a_boot() -> None:
    from provisioner.step import lead_steps

    cfg = replace(CFG, warm_tau_steps=1)
    running = snap(10.0, 1000.0, (inst("a"),))
    a, b = inst("a"), inst("b", "stopped")
    # nothing stopped: a launch's boot ahead
    assert lead_steps(running, cfg, [10.0] * 5, [a], [SMALL]) == 2
    pooled = snap(10.0, 1000.0, (a, b))
    assert lead_steps(pooled, cfg, [20.0] * 5, [a], [SMALL]) == 1  # the pool carries it
    assert lead_steps(pooled, cfg, [5.0, 5.0, 20.1], [a], [SMALL]) == 2  # it cannot
    assert lead_steps(pooled, cfg, [5.0, 5.0, 5.0, 30.0], [a], [SMALL]) == 1  # past a boot
    assert lead_steps(pooled, CFG, [5.0] * 5, [a], [SMALL]) == 2  # no warm τ configured
    # Ahead of a rise two steps out, only the nearer plan waits for it: τ 2 buys now.
    rising = replace(pooled, forecast=(5.0, 5.0, 25.0, 25.0, 25.0))
    assert plan_step(rising, ControlState(), CFG, RT).start == ("b",)
    assert plan_step(rising, ControlState(), cfg, RT).start == ()


def test_a_launch_of_another_role_takes_nothing_from_the_pool_and_leaves_it_whole() -> None:
    pool = (inst("p", "stopped"),)
    standby = Launch("m", "c5.large", "on-demand", 1, "standby", "pool")
    serving = Launch("m", "c5.large", "on-demand", 1, "serving", "load")
    step = warm_step(pool, 300.0, [standby, serving], (), BOOT, WARM, WarmState({"p": 100.0}))
    assert step.start == ("p",) and step.launches == (standby,)


BIG = PlannerOption("p2.xlarge", "on-demand", 0.9, 51.0, latency_s=0.01)
MID = PlannerOption("c5.xlarge", "on-demand", 0.17, 9.0, latency_s=0.01)
SMALL_R = Rating(0.085, 4.0)
BIG_R = Rating(0.9, 51.0)


def test_stopped_instances_of_another_type_replace_launches_they_carry_for_no_more() -> None:
    # 30 c5.large (120 r/s, $2.55/h): two stopped p2.xlarge carry 102 r/s of it, the
    # capacity of 25 c5.large, for $1.80 against their $2.125; a third for the last 5
    # ($0.90 against $0.425) would cost more, so they are launched.
    assert substitute(30, SMALL_R, BIG_R, available=2) == (2, 25)
    assert substitute(30, SMALL_R, BIG_R, available=3) == (2, 25)
    # twelve c5.large (48 r/s, $1.02/h): one p2.xlarge carries them for $0.90
    assert substitute(12, SMALL_R, BIG_R, available=3) == (1, 12)
    # a single small launch is never replaced by a big start: it would cost more an hour
    assert substitute(1, SMALL_R, BIG_R, available=2) == (0, 0)
    # the other way round: thirteen c5.large to carry one p2.xlarge cost more an hour
    assert substitute(1, BIG_R, SMALL_R, available=20) == (0, 0)
    # c5.xlarge at twice the price and more than twice the capacity: three for six
    assert substitute(6, SMALL_R, Rating(0.17, 9.0), available=4) == (3, 6)
    assert substitute(0, SMALL_R, BIG_R, available=2) == (0, 0)
    assert substitute(5, SMALL_R, BIG_R, available=0) == (0, 0)


def test_a_start_dearer_an_hour_carries_a_remainder_where_the_waiting_load_uses_it_all() -> None:
    # nine c5.large (36 r/s, $0.765/h): one p2.xlarge ($0.90/h, 51 r/s) costs more an
    # hour, but less per request ($0.0176 against $0.0213 per r/s-hour); it carries 15 r/s
    # beyond them, used at once where that much load waits beyond the fleet and launches
    assert substitute(9, SMALL_R, BIG_R, available=1) == (0, 0)
    assert substitute(9, SMALL_R, BIG_R, available=1, spare_rps=14.9) == (0, 0)
    assert substitute(9, SMALL_R, BIG_R, available=1, spare_rps=15.0) == (1, 9)
    # whole multiples first, as before; the remainder of five needs 31 r/s waiting
    assert substitute(30, SMALL_R, BIG_R, available=3, spare_rps=30.0) == (2, 25)
    assert substitute(30, SMALL_R, BIG_R, available=3, spare_rps=31.0) == (3, 30)
    # never a type dearer per request, whatever waits
    dear = Rating(0.9, 30.0)  # $0.030 per r/s-hour against $0.02125
    assert substitute(7, SMALL_R, dear, available=1, spare_rps=100.0) == (0, 0)


def test_the_waiting_load_is_shared_by_a_step_s_launches() -> None:
    pool = (inst("big1", "stopped", opt=BIG), inst("big2", "stopped", opt=BIG))
    warm = WarmState({"big1": 100.0, "big2": 110.0})
    want = [
        Launch("m", "c5.large", "on-demand", 9, "serving", "load"),  # 36 r/s, $0.765/h
        Launch("m", "c5.xlarge", "on-demand", 4, "serving", "load"),  # 36 r/s, $0.68/h
    ]
    rated = {SMALL.key: SMALL_R, BIG.key: BIG_R, MID.key: Rating(0.17, 9.0)}
    # 20 r/s waiting: the first p2.xlarge uses 15 of it, the second would need 15 more
    step = warm_step(pool, 300.0, want, (), BOOT, WARM, warm, rated, True, spare_rps=20.0)
    assert step.start == ("big2",) and step.launches == (want[1],)
    both = warm_step(pool, 300.0, want, (), BOOT, WARM, warm, rated, True, spare_rps=30.0)
    assert set(both.start) == {"big1", "big2"} and both.launches == ()
    # while the load does not outrun the fleet, nothing waits: its own type only
    calm = warm_step(pool, 300.0, want, (), BOOT, WARM, warm, rated, False, spare_rps=30.0)
    assert calm.start == () and calm.launches == tuple(want)


def test_a_launch_is_carried_by_stopped_instances_the_cheapest_per_request_first() -> None:
    pool = (
        inst("small", "stopped"),
        inst("big1", "stopped", opt=BIG),
        inst("big2", "stopped", opt=BIG),
        inst("mid", "stopped", opt=MID),
    )
    warm = WarmState({"small": 100.0, "big1": 110.0, "big2": 120.0, "mid": 130.0})
    want = [Launch("m", "c5.large", "on-demand", 30, "serving", "load")]
    rated = {SMALL.key: SMALL_R, BIG.key: BIG_R, MID.key: Rating(0.17, 9.0)}
    step = warm_step(pool, 300.0, want, (), BOOT, WARM, warm, rated, outrun=True)
    # both p2.xlarge, the cheapest per request (25 of them, 5 left), then the c5.xlarge
    # (two c5.large's worth, 3 left), then its own stopped c5.large (2 left)
    assert set(step.start) == {"small", "big1", "big2", "mid"}
    assert step.launches == (replace(want[0], count=2),)
    assert step.state.stopped_at == {}
    assert sum(n.count for n in step.notes if n.action == "warm-start") == 4
    # without ratings, only its own type
    plain = warm_step(pool, 300.0, want, (), BOOT, WARM, warm)
    assert plain.start == ("small",) and plain.launches == (replace(want[0], count=29),)


def test_one_stopped_big_instance_carries_a_launch_its_own_stopped_type_would_only_start() -> None:
    # twelve c5.large wanted, four of them stopped: one stopped p2.xlarge carries all
    # twelve for $0.90 an hour against $1.02, and all of it serves after a start
    pool = (*(inst(f"s{i}", "stopped") for i in range(4)), inst("big", "stopped", opt=BIG))
    warm = WarmState({**{f"s{i}": 100.0 + i for i in range(4)}, "big": 50.0})
    want = [Launch("m", "c5.large", "on-demand", 12, "serving", "load")]
    rated = {SMALL.key: SMALL_R, BIG.key: BIG_R}
    step = warm_step(pool, 300.0, want, (), BOOT, WARM, warm, rated, outrun=True)
    assert step.start == ("big",) and step.launches == ()
    assert step.replaced == (want[0],)  # if the start fails: the plan's twelve, not a p2
    assert set(step.state.stopped_at) == {f"s{i}" for i in range(4)}
    # while the fleet carries the load, speed is worth nothing: its own type only
    calm = warm_step(pool, 300.0, want, (), BOOT, WARM, warm, rated)
    assert set(calm.start) == {f"s{i}" for i in range(4)}
    assert calm.launches == (replace(want[0], count=8),)
    assert calm.replaced == (replace(want[0], count=4),)
    # three wanted: the p2.xlarge would cost more an hour, so its own three start
    few = warm_step(
        pool, 300.0, [replace(want[0], count=3)], (), BOOT, WARM, warm, rated, outrun=True
    )
    assert few.start == ("s3", "s2", "s1") and few.launches == ()


def _rise_beside_a_stopped_big_instance(rise: float) -> tuple[Snapshot, ControlState]:
    """A rise of ``rise`` r/s two steps out, with a stopped p2.xlarge (120 r/s, $0.90/h)
    beside c5.large (10 r/s, $0.085/h) and nothing serving: the snapshot and the state."""
    big = PlannerOption("p2.xlarge", "on-demand", 0.9, 120.0, latency_s=0.01)
    forecast = (20.0, 20.0, rise, 20.0, 20.0)
    base = Snapshot("m", 1000.0, forecast, rise, (SMALL, big), (inst("big", "stopped", opt=big),))
    return base, ControlState(warm=WarmState({"big": 100.0}))


def test_the_plan_lets_another_type_carry_its_launch_only_while_the_load_outruns_it() -> None:
    # a rise two steps out: the plan buys twelve c5.large for it (they retire sooner)
    base, state = _rise_beside_a_stopped_big_instance(115.0)
    calm = plan_step(base, state, CFG, RT)
    assert [(la.instance_type, la.count) for la in calm.launches] == [("c5.large", 12)]
    assert "big" not in calm.state.warm.started_at
    # the last two 5 s windows ran above what the fleet carries (nothing serves): the
    # twelve c5.large ($1.02/h, 120 r/s) are carried by the stopped p2.xlarge ($0.90/h)
    outrun = replace(base, recent_rates=(115.0, 115.0), window_s=5.0)
    rising = plan_step(outrun, state, CFG, RT)
    assert "big" in rising.state.warm.started_at
    assert rising.launches == ()
    assert rising.state.warm.outrun_share() == 1.0
    one = replace(base, recent_rates=(115.0,), window_s=5.0)  # one window: a burst, maybe
    assert "big" not in plan_step(one, state, CFG, RT).state.warm.started_at


def test_the_plan_counts_the_load_waiting_beyond_its_launches_for_a_dearer_start() -> None:
    # the plan buys nine c5.large (90 r/s, $0.765/h) for a rise of 85 r/s: the p2.xlarge
    # would cost more an hour, and carries 30 r/s more
    base, state = _rise_beside_a_stopped_big_instance(85.0)
    assert [(la.instance_type, la.count) for la in plan_step(base, state, CFG, RT).launches] == [
        ("c5.large", 9)
    ]
    # two windows at 115 r/s: 25 r/s wait beyond nothing serving and the launches
    short = plan_step(replace(base, recent_rates=(115.0, 118.0), window_s=5.0), state, CFG, RT)
    assert "big" not in short.state.warm.started_at
    # at 121 r/s, 31 r/s wait: the p2.xlarge's extra capacity is used at once
    waiting = replace(base, recent_rates=(121.0, 125.0), window_s=5.0)
    rising = plan_step(waiting, state, CFG, RT)
    assert "big" in rising.state.warm.started_at and rising.launches == ()
