"""The health step by table: boot deadline, failing limit, readiness in the snapshot."""

from __future__ import annotations

import pytest

from provisioner.control_state import ControlState, Member, Snapshot
from provisioner.health_step import HealthConfig, HealthFact, health_step, with_readiness

CFG = HealthConfig(boot_deadline_s=100.0, unhealthy_after_s=20.0, avoid_s=300.0)


def snap(now: float, *members: Member) -> Snapshot:
    return Snapshot("m", now, (), 0.0, (), members)


def inst(iid: str, launched_at: float = 0.0, state: str = "running") -> Member:
    return Member(iid, "m", "c5.large", "on-demand", "serving", state, launched_at, 0.085)


@pytest.mark.parametrize(
    ("fact", "now", "since", "replaced", "avoided"),
    [
        (HealthFact(), 99.0, 0.0, False, False),  # booting, within the deadline
        (HealthFact(), 100.0, 0.0, True, True),  # never ready by the deadline: avoid its type
        (HealthFact(), 150.0, 100.0, False, False),  # the watch began late (a restart)
        (HealthFact(10.0), 500.0, 0.0, False, False),  # ready, serving
        (HealthFact(10.0, 490.0), 500.0, 0.0, False, False),  # failing, under the limit
        (HealthFact(10.0, 480.0), 500.0, 0.0, True, False),  # failing 20 s: replaced
    ],
)
def test_health_verdicts(
    fact: HealthFact, now: float, since: float, replaced: bool, avoided: bool
) -> None:
    change, notes, state = health_step(
        snap(now, inst("a")), ControlState(), {"a": fact}, CFG, since
    )
    assert (change is not None) is replaced
    assert [n.action for n in notes] == (["replace-unhealthy"] if replaced else [])
    assert (("c5.large", "on-demand") in state.avoid.avoid_until) is avoided


def test_stopped_standbys_and_other_models_are_left_alone() -> None:
    standby = Member("s", "m", "t3.large", "on-demand", "standby", "stopped", 0.0)
    started = Member("t", "m", "t3.large", "on-demand", "standby", "running", 0.0)
    other = Member("o", "x", "c5.large", "on-demand", "serving", "running", 0.0)
    facts = {"t": HealthFact(5.0, 10.0)}  # failing since it was stopped, now started again
    change, _, _ = health_step(
        snap(1000.0, standby, started, other), ControlState(), facts, CFG, 0.0
    )
    assert change is None


def test_readiness_comes_from_the_agent_and_failing_is_not_capacity() -> None:
    s = snap(10.0, inst("a"), inst("b"), inst("c"))
    facts = {"a": HealthFact(5.0), "b": HealthFact(5.0, 8.0)}
    ready = with_readiness(s, facts)
    assert [m.state for m in ready.fleet] == ["ready", "failing", "running"]
    assert all(m.live for m in ready.fleet)  # all still billed
