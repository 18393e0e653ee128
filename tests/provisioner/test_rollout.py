"""Rolling a model's version: the new one's instances ready first, then the old ones go;
a new version whose instance never gets ready turns the roll back."""

from __future__ import annotations

from provisioner.control_state import Member
from provisioner.rollout import Rollout, rollout_step

BOOT_DEADLINE, SETTLE = 60.0, 10.0


def _m(iid: str, version: str | None, state: str = "ready", at: float = 0.0) -> Member:
    return Member(iid, "m", "c5.large", "on-demand", "serving", state, at, 0.085, "c", version)


ROLL = Rollout("3", "2", since=100.0)


def test_old_instances_serve_until_every_new_one_is_ready_then_go() -> None:
    fleet = [_m("old-1", "2"), _m("old-2", "2"), _m("new-1", "3", "running", at=105.0)]
    waiting = rollout_step("m", ROLL, fleet, 120.0, BOOT_DEADLINE, SETTLE)
    assert waiting.outdated == {"old-1", "old-2"} and waiting.retire == ()
    assert waiting.roll is not None and not waiting.notes
    assert (waiting.roll.target, waiting.roll.launched) == ("3", frozenset({"new-1"}))
    ready = [*fleet[:2], _m("new-1", "3", at=105.0)]
    step = rollout_step("m", waiting.roll, ready, 130.0, BOOT_DEADLINE, SETTLE)
    assert step.retire == ("old-1", "old-2") and step.roll is not None
    assert step.roll.ready == {"new-1"}
    assert [n.action for n in step.notes] == ["rollout"]
    done = rollout_step("m", ROLL, [ready[2]], 140.0, BOOT_DEADLINE, SETTLE)
    assert done.roll is None and [n.action for n in done.notes] == ["rollout-done"]


def test_nothing_goes_before_the_plan_had_a_step_to_buy_the_new_version() -> None:
    fleet = [_m("old-1", "2")]  # no new instance yet: the plan has not run since the roll
    early = rollout_step("m", ROLL, fleet, 105.0, BOOT_DEADLINE, SETTLE)
    assert early.retire == () and early.outdated == {"old-1"}
    # The plan bought none (no load): after a step, the old ones go all the same.
    later = rollout_step("m", ROLL, fleet, 111.0, BOOT_DEADLINE, SETTLE)
    assert later.retire == ("old-1",)


def test_a_new_instance_not_ready_by_the_boot_deadline_turns_the_roll_back() -> None:
    fleet = [_m("old-1", "2"), _m("new-1", "3", "running", at=100.0)]
    step = rollout_step("m", ROLL, fleet, 160.0, BOOT_DEADLINE, SETTLE)
    old = frozenset({"old-1"})
    assert step.rolled_back and step.roll == Rollout("2", None, 160.0, old, old)
    assert step.outdated == {"new-1"} and step.retire == ()  # the old version serves on
    assert [n.action for n in step.notes] == ["rollback"] and "back to version 2" in (
        step.notes[0].reason
    )
    # A step later the failed version's instance goes; nothing turns back a second time.
    assert step.roll is not None
    after = rollout_step("m", step.roll, fleet, 172.0, BOOT_DEADLINE, SETTLE)
    assert after.retire == ("new-1",) and not after.rolled_back


def test_a_new_instance_gone_without_ever_being_ready_turns_the_roll_back() -> None:
    """The health rule ended it at the boot deadline before the roll saw it late: with no
    new instance left, the old ones must not be ended as if the plan had bought none."""
    booting = [_m("old-1", "2"), _m("new-1", "3", "running", at=100.0)]
    seen = rollout_step("m", ROLL, booting, 150.0, BOOT_DEADLINE, SETTLE)
    assert seen.roll is not None and seen.retire == ()
    step = rollout_step("m", seen.roll, booting[:1], 161.0, BOOT_DEADLINE, SETTLE)
    assert (
        step.rolled_back and step.retire == () and "new-1 never got ready" in (step.notes[0].reason)
    )


def test_untagged_instances_other_models_and_standbys_are_left_alone() -> None:
    other = Member("x-1", "other", "c5.large", "on-demand", "serving", "ready", 0.0, 0.1, "c", "1")
    standby = Member("s-1", "m", "t3.large", "on-demand", "standby", "stopped", 0.0, 0.1, "c", "2")
    fleet = [_m("untagged", None), other, standby, _m("new-1", "3")]
    step = rollout_step("m", ROLL, fleet, 200.0, BOOT_DEADLINE, SETTLE)
    assert step.roll is None and step.outdated == frozenset() and step.retire == ()
