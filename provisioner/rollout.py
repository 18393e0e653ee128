"""Rolling a model to a new version while it serves, and back if the version fails.

A roll is no extra machinery beside the plan: while a model rolls to version v, its
serving instances of another version are *outdated*. They keep serving, but the plan
is made without them, so it buys the capacity the forecast needs in version v (every
launch is tagged v); once every instance of v that was bought is ready (its agent
loaded v and answers), and the plan has had a step to buy them, the outdated ones are
drained and ended (``Dispatcher.retire``, then terminate): no request is lost to the
roll, and for a moment both versions serve. An instance of v that is not ready by the
boot deadline (the health rule's) means the version fails on this hardware: the roll
turns back to the version it came from, which is still serving, and v's instances are
the outdated ones. Once no outdated instance is left, the roll is over.

Pure: a roll's state in, what to keep out of the plan and what to end out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from provisioner.control_state import Member, Note

SERVES = frozenset({"serving", "backup"})
"""The roles whose instances serve a version (standbys start as whatever they were)."""


@dataclass(frozen=True)
class Rollout:
    """A model rolling to ``target`` since ``since``; ``previous`` is the version to turn
    back to if ``target`` fails (None: none, e.g. a roll adopted at a restart)."""

    target: str
    previous: str | None
    since: float
    launched: frozenset[str] = frozenset()
    """The target version's instances seen so far."""
    ready: frozenset[str] = frozenset()
    """Those of them seen ready."""


@dataclass(frozen=True)
class RolloutStep:
    roll: Rollout | None
    """The roll still under way (turned back, if it was); None: it is over."""
    outdated: frozenset[str]
    """Instances of another version: they serve, and the plan is made without them."""
    retire: tuple[str, ...]
    """Outdated instances to drain and end now."""
    rolled_back: bool
    notes: tuple[Note, ...]


def _serving(fleet: Sequence[Member], model: str) -> list[Member]:
    return [m for m in fleet if m.model == model and m.role in SERVES and m.live]


def rollout_step(
    model: str,
    roll: Rollout,
    fleet: Sequence[Member],
    now: float,
    boot_deadline_s: float,
    settle_s: float,
) -> RolloutStep:
    """One step of ``roll``. ``fleet`` states say ``ready`` where the agent does
    (``health_step.with_readiness``); ``settle_s`` (a control step) is how long a roll
    waits before ending outdated instances, so the plan has bought the new ones."""
    serving = _serving(fleet, model)
    fresh = [m for m in serving if m.version == roll.target]
    here = {m.instance_id for m in fresh}
    # Not ready by the boot deadline, or gone without ever being ready (the health rule
    # ended it at that deadline): the version does not come up on this hardware.
    late = [
        m.instance_id
        for m in fresh
        if m.state != "ready" and now - m.launched_at >= boot_deadline_s
    ]
    lost = sorted(roll.launched - roll.ready - here)
    if (late or lost) and roll.previous is not None:
        failed = (late + lost)[0]
        why = (
            f"version {roll.target}: its instance {failed} never got ready within "
            f"{boot_deadline_s:g} s of its launch; back to version {roll.previous}"
        )
        back = rollout_step(
            model, Rollout(roll.previous, None, now), fleet, now, boot_deadline_s, settle_s
        )
        note = Note("rollback", why, count=len(late) + len(lost))
        return replace(back, rolled_back=True, notes=(note, *back.notes))
    roll = replace(
        roll,
        launched=roll.launched | here,
        ready=roll.ready | {m.instance_id for m in fresh if m.state == "ready"},
    )
    outdated = [m for m in serving if m.version is not None and m.version != roll.target]
    if not outdated:
        done = Note("rollout-done", f"every serving instance runs version {roll.target}")
        return RolloutStep(None, frozenset(), (), False, (done,))
    ids = frozenset(m.instance_id for m in outdated)
    waiting = [m for m in fresh if m.state != "ready"]
    if waiting or now - roll.since < settle_s:
        return RolloutStep(roll, ids, (), False, ())
    versions = sorted({m.version or "" for m in outdated})
    why = (
        f"version {roll.target}: its {len(fresh)} instance(s) ready; the {len(outdated)} of "
        f"version {', '.join(versions)} drain and end"
    )
    note = Note("rollout", why, count=len(outdated))
    retire = tuple(sorted(m.instance_id for m in outdated))
    return RolloutStep(roll, ids, retire, False, (note,))
