"""Readiness and health: an instance is capacity once its agent is ready, and is
replaced when it never gets there or stops answering.

The shell tracks, per instance, when its agent first reported ready (model
loaded, profile measured, one inference passed) and since when it has failed
its liveness probe or vanished (a dead process, a hung model). This step turns
those facts into terminations with reasons: an instance not ready by its boot
deadline is terminated and its offering avoided for a while (the type or the
zone may be what fails); one that was ready and has failed for
``unhealthy_after_s`` is terminated. The plan that follows replaces them. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from provisioner.control_state import Change, ControlState, Member, Note, Snapshot
from provisioner.spot import record_interruption
from provisioner.warm_pool import serving_from


@dataclass(frozen=True)
class HealthFact:
    """What the shell saw of one instance's agent."""

    ready_since: float | None = None
    """When the agent first reported ready; None if it never has."""
    failing_since: float | None = None
    """Since when it has failed its probe or been gone, after having been ready."""


@dataclass(frozen=True)
class HealthConfig:
    boot_deadline_s: float
    """Launch to ready at the latest; later, the instance is replaced."""
    unhealthy_after_s: float
    """Failing this long (probe timeouts, a dead agent) and it is replaced."""
    avoid_s: float = 300.0
    """How long an offering whose instance never got ready is not bought."""


def health_step(
    snap: Snapshot,
    state: ControlState,
    facts: Mapping[str, HealthFact],
    cfg: HealthConfig,
    observed_since: float,
) -> tuple[Change | None, list[Note], ControlState]:
    """Instances of ``snap.model`` to terminate now for health, with a note each.

    ``observed_since``: when the shell began watching agents; a boot deadline runs
    from launch or from then, whichever is later (a restarted daemon has not seen
    the agents of the fleet it adopts yet).
    """
    doomed: list[str] = []
    notes: list[Note] = []
    for m in snap.mine():
        # Standbys are stopped and started, so their launch time says nothing of a boot;
        # one whose agent fails is simply not a backend, and the plan does not count it.
        if not m.live or m.role == "standby":
            continue
        fact = facts.get(m.instance_id, HealthFact())
        why = _verdict(m, serving_from(m, state.warm), fact, snap.now, cfg, observed_since)
        if why is None:
            continue
        doomed.append(m.instance_id)
        notes.append(Note("replace-unhealthy", why, m.instance_type, m.market, 1, m.instance_id))
        if fact.ready_since is None:
            state = replace(
                state, avoid=record_interruption(state.avoid, m.key, snap.now, cfg.avoid_s)
            )
    if not doomed:
        return None, notes, state
    change = Change("terminate", snap.model, tuple(doomed), "unhealthy: replaced")
    return change, notes, state


def _verdict(
    m: Member,
    began: float,
    fact: HealthFact,
    now: float,
    cfg: HealthConfig,
    observed_since: float,
) -> str | None:
    """``began``: its launch, or its start out of the warm pool."""
    if fact.ready_since is None:
        deadline = max(began, observed_since) + cfg.boot_deadline_s
        if now >= deadline:
            return (
                f"not ready {now - began:.0f} s after launch or start (boot deadline "
                f"{cfg.boot_deadline_s:g} s); {m.instance_type}/{m.market} avoided for "
                f"{cfg.avoid_s:g} s"
            )
        return None
    if fact.failing_since is not None and now - fact.failing_since >= cfg.unhealthy_after_s:
        return (
            f"failing its liveness probe (or gone) for {now - fact.failing_since:.0f} s "
            f"(limit {cfg.unhealthy_after_s:g} s)"
        )
    return None


def with_readiness(snap: Snapshot, facts: Mapping[str, HealthFact]) -> Snapshot:
    """The snapshot with each live instance's state as its agent says: ``ready`` once it
    reported ready and is not failing; otherwise as the cloud says (still booting)."""
    fleet = []
    for m in snap.fleet:
        fact = facts.get(m.instance_id)
        if m.live and fact is not None and fact.ready_since is not None:
            state = "ready" if fact.failing_since is None else "failing"
            m = replace(m, state=state)
        fleet.append(m)
    return replace(snap, fleet=tuple(fleet))
