"""The orphan sweep and the retirement hold, by table: pure steps, plain values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provisioner.control_state import ControlState, Member, Note
from provisioner.greedy import PlannerOption
from provisioner.orphan_step import (
    BEYOND_POOL,
    ORPHAN_KINDS,
    REMOVED_MODEL,
    OrphanConfig,
    StandbyPool,
    orphan_step,
)
from provisioner.step import retirements

SPOT = PlannerOption("c5.large", "spot", 0.03, 10.0, latency_s=0.01)
CLUSTER = "prod"
POOLS = {"m": StandbyPool((SPOT,), standby_capacity_rps=10.0, loss_fraction=0.25)}
CFG = OrphanConfig(CLUSTER, POOLS, grace_s=600.0)


def inst(iid: str, model: str = "m", **kw: object) -> Member:
    m = Member(iid, model, "c5.large", "on-demand", "serving", "running", 0.0, 0.085, CLUSTER)
    return replace(m, **kw)  # type: ignore[arg-type]


def standby(iid: str, state: str = "stopped", at: float = 0.0) -> Member:
    return inst(iid, role="standby", state=state, instance_type="t3.large", launched_at=at)


def spot(iid: str) -> Member:
    return inst(iid, market="spot")


def ids(step_changes: object) -> set[str]:
    return {i for c in step_changes for i in c.instance_ids}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("member", "kind"),
    [
        (inst("a"), None),  # serving, configured: the plan's
        (inst("a", role="backup"), None),  # the SLO monitor's
        (inst("a", role="explore"), None),  # exploration retires it once measured
        (inst("a", role="profiling"), None),  # `mark profile --type` ends it
        (inst("a", model="gone"), REMOVED_MODEL),
        (inst("a", model="gone", role="standby", state="stopped"), REMOVED_MODEL),
        (inst("a", model=""), REMOVED_MODEL),  # no model on its tags
        (inst("a", model="gone", state="shutting-down"), None),  # already going
        (inst("a", model="gone", owner=None), None),  # untagged: never ours to judge
        (inst("a", model="gone", owner="other"), None),  # another cluster's
        (standby("a"), BEYOND_POOL),  # no spot at risk: the pool wants none
        (standby("a", state="running"), None),  # carries load after a notice
    ],
)
def test_what_is_claimed_and_what_is_an_orphan(member: Member, kind: str | None) -> None:
    res = orphan_step((member,), 1000.0, ControlState(), CFG)
    assert [o.kind for o in res.orphans] == ([kind] if kind else [])


def test_a_removed_models_instance_is_reported_then_terminated_after_the_grace() -> None:
    fleet = (inst("keep"), inst("old1", model="gone"), inst("old2", model="gone"))
    first = orphan_step(fleet, 1000.0, ControlState(), CFG)
    assert first.terminate == ()
    assert first.state.orphans == {"old1": 1000.0, "old2": 1000.0}
    assert [(m, n.action, n.instance_id) for m, n in first.notes] == [
        ("gone", "orphan", "old1"),
        ("gone", "orphan", "old2"),
    ]
    assert "terminated at t=1600" in first.notes[0][1].reason
    early = orphan_step(fleet, 1599.0, first.state, CFG)
    assert early.terminate == () and early.state.orphans == first.state.orphans
    due = orphan_step(fleet, 1600.0, early.state, CFG)
    (change,) = due.terminate
    assert change.model == "gone" and change.instance_ids == ("old1", "old2")
    assert {n.action for _, n in due.notes} == {"retire-orphan"}


def test_the_grace_counts_from_the_first_sighting_and_restarts_when_claimed_again() -> None:
    fleet = (inst("x", model="gone"),)
    seen = orphan_step(fleet, 1000.0, ControlState(), CFG).state
    # the model is configured again: claimed, its clock dropped
    back = orphan_step(fleet, 1300.0, seen, replace(CFG, models={**POOLS, "gone": StandbyPool()}))
    assert back.orphans == () and back.state.orphans == {}
    again = orphan_step(fleet, 1700.0, back.state, CFG)
    assert again.terminate == () and again.state.orphans == {"x": 1700.0}


def test_kinds_not_allowed_are_only_reported() -> None:
    fleet = (inst("x", model="gone"), standby("s"))
    state = ControlState(orphans={"x": 0.0, "s": 0.0})
    default = orphan_step(fleet, 1000.0, state, CFG)  # removed models only, by default
    assert ids(default.terminate) == {"x"}
    kept = next(n for _, n in default.notes if n.instance_id == "s")
    assert kept.action == "orphan" and "does not include beyond-pool" in kept.reason
    every = orphan_step(fleet, 1000.0, state, replace(CFG, terminate=ORPHAN_KINDS))
    assert ids(every.terminate) == {"x", "s"}
    none = orphan_step(fleet, 1000.0, state, replace(CFG, terminate=()))
    assert none.terminate == () and len(none.orphans) == 2


def test_an_instance_without_the_clusters_tag_is_never_terminated() -> None:
    fleet = (
        inst("untagged", model="gone", owner=None),
        inst("foreign", model="gone", owner="other"),
        standby("untagged-standby"),
    )
    fleet = (*fleet[:2], replace(fleet[2], owner=None))
    everything = replace(CFG, grace_s=0.0, terminate=ORPHAN_KINDS)
    state = ControlState(orphans={m.instance_id: 0.0 for m in fleet})
    res = orphan_step(fleet, 10_000.0, state, everything)
    assert res.orphans == () and res.terminate == () and res.state.orphans == {}
    nobody = orphan_step(fleet, 10_000.0, state, replace(everything, cluster=None))
    assert nobody.orphans == ()


def test_standbys_within_the_pool_are_claimed_the_stopped_surplus_is_not() -> None:
    # 3 spot instances of one offering, 30 r/s, all of it could go: a pool of 3 standbys
    serving = (spot("s1"), spot("s2"), spot("s3"))
    pool = tuple(standby(f"t{k}", at=float(k)) for k in range(5))
    res = orphan_step((*serving, *pool), 1000.0, ControlState(), CFG)
    # the newest stopped ones are the surplus
    assert {o.member.instance_id for o in res.orphans} == {"t4", "t3"}
    assert all(o.kind == BEYOND_POOL and "pool of 3" in o.why for o in res.orphans)
    # a doomed spot instance no longer counts as capacity at risk: the pool shrinks
    doomed = ControlState(doomed={"s3": 1100.0})
    fewer = orphan_step((*serving, *pool), 1000.0, doomed, CFG)
    assert {o.member.instance_id for o in fewer.orphans} == {"t4", "t3", "t2"}
    # running standbys count in the pool (as the pool step counts them) but are never
    # the surplus: they carry load, and the pool step stops them
    running = tuple(replace(m, state="running") for m in pool[:4])
    busy = orphan_step((*serving, *running, pool[4]), 1000.0, ControlState(), CFG)
    assert {o.member.instance_id for o in busy.orphans} == {"t4"}
    assert orphan_step((*serving, *running), 1000.0, ControlState(), CFG).orphans == ()


def test_terminations_are_one_change_per_model() -> None:
    fleet = (inst("a", model="x"), inst("b", model="y"), inst("c", model="x"))
    state = ControlState(orphans={"a": 0.0, "b": 0.0, "c": 0.0})
    res = orphan_step(fleet, 1000.0, state, CFG)
    assert [(c.model, c.instance_ids) for c in res.terminate] == [
        ("x", ("a", "c")),
        ("y", ("b",)),
    ]


# -- the retirement hold ----------------------------------------------------------


@pytest.mark.parametrize(
    ("retire", "failed", "kept", "held"),
    [
        (("a", "b"), 0, ("a", "b"), None),  # every launch went out: retire
        ((), 2, (), None),  # nothing to retire: nothing to say
        (("a",), 1, (), "1 launch(es) failed"),  # capacity or any other error alike
        (("a", "b"), 3, (), "2 retirement(s) wait"),
    ],
)
def test_retirements_wait_when_any_launch_of_the_step_failed(
    retire: tuple[str, ...], failed: int, kept: tuple[str, ...], held: str | None
) -> None:
    got, note = retirements(retire, failed)
    assert got == kept
    if held is None:
        assert note is None
    else:
        assert isinstance(note, Note) and note.action == "retire-held" and held in note.reason
