"""A spot notice whose standby start the cloud refuses: remembered, and the start owed."""

from __future__ import annotations

from dataclasses import replace

from provisioner.control_state import (
    ControlState,
    Member,
    ModelControl,
    PendingStart,
    Snapshot,
    StepConfig,
    forget_gone,
)
from provisioner.greedy import PlannerOption
from provisioner.spend_rails import SpendLimits
from provisioner.standby_step import interruption_step, owed_standbys_step

SMALL = PlannerOption("c5.large", "on-demand", 0.085, 10.0, latency_s=0.01)
SPOT = PlannerOption("c5.large", "spot", 0.03, 10.0, latency_s=0.01)
CFG = StepConfig(
    step_s=60.0,
    tau_steps=1,
    boot_s=60.0,
    standby_type="t3.large",
    standby_price=0.0832,
    standby_capacity_rps=10.0,
)


def member(iid: str, **kw: object) -> Member:
    m = Member(iid, "m", "c5.large", "spot", "serving", "ready", 0.0, 0.03)
    return replace(m, **kw)  # type: ignore[arg-type]


def standby(iid: str, state: str = "stopped") -> Member:
    return member(
        iid,
        role="standby",
        state=state,
        instance_type="t3.large",
        market="on-demand",
        price_per_hour=0.0832,
    )


def snap(now: float, *fleet: Member) -> Snapshot:
    return Snapshot("m", now, (10.0,), 10.0, (SMALL, SPOT), tuple(fleet))


def test_a_refused_start_keeps_the_notice_and_owes_the_start() -> None:
    s = snap(1000.0, member("v"), standby("t"))
    res = interruption_step(s, ControlState(), CFG, "v", 1120.0)
    assert res is not None and res.start is not None
    assert res.state.pending_starts == {}  # started: nothing owed
    failed = res.if_start_fails
    assert failed.doomed == {"v": 1120.0}  # remembered all the same
    assert SPOT.key in failed.avoid.avoid_until
    assert failed.of("m").hold_standbys_until == 1180.0
    assert failed.pending_starts == {"v": PendingStart("m", 10.0, 1180.0)}
    # a repeated notice is not a new interruption ...
    assert interruption_step(s, failed, CFG, "v", 1120.0) is None
    # ... but what it owes is started again, by it or by the next step
    retry = owed_standbys_step(snap(1010.0, member("v"), standby("t")), failed, CFG)
    assert retry is not None and retry.start is not None and retry.start.instance_ids == ("t",)
    assert retry.state.pending_starts == {} and retry.state.doomed == failed.doomed
    assert retry.if_start_fails.pending_starts == failed.pending_starts
    assert [n.action for n in retry.notes] == ["start-standby"]


def test_nothing_owed_when_no_standby_was_to_start() -> None:
    res = interruption_step(snap(1000.0, member("v")), ControlState(), CFG, "v", 1120.0)
    assert res is not None and res.start is None
    assert res.if_start_fails == res.state and res.state.pending_starts == {}
    assert owed_standbys_step(snap(1000.0), res.state, CFG) is None


def test_an_owed_start_is_given_up_once_replacements_could_serve() -> None:
    owed = ControlState(pending_starts={"v": PendingStart("m", 10.0, 1180.0)})
    late = owed_standbys_step(snap(1180.0, standby("t")), owed, CFG)
    assert late is not None and late.start is None
    assert late.state.pending_starts == {} and late.if_start_fails.pending_starts == {}
    assert [n.action for n in late.notes] == ["start-standby-abandoned"]


def test_a_retry_with_no_stopped_standby_left_settles_the_debt() -> None:
    owed = ControlState(pending_starts={"v": PendingStart("m", 10.0, 1180.0)})
    res = owed_standbys_step(snap(1010.0, standby("t", state="running")), owed, CFG)
    assert res is not None and res.start is None and res.state.pending_starts == {}
    assert "no stopped standby left" in res.notes[-1].reason


def test_a_retry_passes_the_spend_rails_and_leaves_other_models_debts() -> None:
    owed = ControlState(
        pending_starts={
            "v": PendingStart("m", 20.0, 1180.0),
            "w": PendingStart("other", 10.0, 1180.0),
        }
    )
    s = snap(1010.0, standby("t1"), standby("t2"))
    res = owed_standbys_step(s, owed, CFG)
    assert res is not None and res.start is not None and len(res.start.instance_ids) == 2
    assert set(res.state.pending_starts) == {"w"}
    broke = replace(CFG, limits=SpendLimits(per_model=0.1))
    capped = owed_standbys_step(s, owed, broke)
    assert capped is not None and capped.start is not None
    assert len(capped.start.instance_ids) == 1
    assert "spend-rail" in [n.action for n in capped.notes]


def test_forget_gone_drops_what_no_listed_instance_or_configured_model_needs() -> None:
    state = ControlState(
        models={"m": ModelControl(explored_at=1.0), "gone": ModelControl(explored_at=2.0)},
        doomed={"v": 1120.0, "w": 1120.0},
        pending_starts={"w": PendingStart("m", 10.0, 1180.0), "x": PendingStart("gone", 1, 1)},
        orphans={"o": 5.0, "p": 5.0},
    )
    kept = forget_gone(state, {"v", "o"}, {"m"})
    assert set(kept.models) == {"m"} and kept.doomed == {"v": 1120.0}
    assert set(kept.pending_starts) == {"w"}  # owed even though the victim is gone
    assert kept.orphans == {"o": 5.0}
    assert forget_gone(state, {"v", "w", "o", "p"}) == state
