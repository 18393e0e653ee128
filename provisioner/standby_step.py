"""The standby steps (paper §4.5): size the stopped pool, start it on a spot notice,
stop it once replacements serve.

A spot fleet can lose capacity with two minutes' notice; stopped burstable
standbys start in seconds and carry that load until replacements boot. The
pool is sized to the spot capacity at risk (``provisioner.spot``), but never larger
than its volumes are worth (``provisioner.standby_value``: where spill answers in
time, only the spill a standby could save pays for it; stopped standbys beyond that
are terminated); a notice
starts the fewest standbys that cover what is lost and avoids the offering for
a while; started standbys stop once ready replacements cover the load again,
never before the interrupted instance is gone and replacements could have
booted. A start the cloud refuses is owed: the next notice or step tries again
(``owed_standbys_step``) until replacements could have booted. Every launch or
start passes the spend rails. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from provisioner.control_state import (
    SERVING_ROLES,
    Change,
    ControlState,
    Launch,
    Member,
    Note,
    PendingStart,
    Snapshot,
    StepConfig,
)
from provisioner.greedy import PlannerOption
from provisioner.pooling import capacity_in_pool
from provisioner.rise_headroom import planning_options, pools
from provisioner.spot import (
    SpotHolding,
    Standby,
    on_interruption_notice,
    standbys_to_start,
    standbys_to_stop,
)
from provisioner.standby_value import standbys_wanted, standbys_worth
from provisioner.step import price_within_rails


def member_capacity(option: PlannerOption, pool: int, pooled: bool) -> float:
    """What one instance carries in a serving pool of ``pool``, as the planner counts it
    (``pooled``: ``rise_headroom.pools``; ``option`` as ``planning_options`` rates it)."""
    return capacity_in_pool(option, pool) if pooled else option.capacity_rps


@dataclass(frozen=True)
class StandbyPoolStep:
    """What the pool step changes: standbys to launch, to stop, to terminate."""

    launch: Launch | None = None
    stop: Change | None = None
    """Started standbys ready replacements no longer need."""
    end: Change | None = None
    """Stopped standbys beyond what they are worth (``provisioner.standby_value``)."""
    notes: tuple[Note, ...] = ()


def standby_pool_step(
    snap: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    serving: Sequence[Member],
    load_now: float,
) -> StandbyPoolStep:
    """Top the stopped pool up to the spot capacity at risk, no further than the standbys
    are worth; terminate stopped standbys beyond their worth; stop started standbys that
    ready replacements no longer need.

    ``serving`` is the model's serving fleet after this step's launches; ``load_now``
    the forecast rate of the coming step.
    """
    cap = cfg.standby_capacity_rps
    if cap <= 0 or cfg.standby_type is None:
        return StandbyPoolStep()
    by_key = {o.key: o for o in snap.options}
    rated = {o.key: o for o in planning_options(snap, cfg)}
    standbys = [m for m in snap.mine() if m.role == "standby" and m.state != "terminated"]
    holdings: dict[tuple[str, str], int] = {}
    for m in serving:
        if m.market == "spot":
            holdings[m.key] = holdings.get(m.key, 0) + 1
    spot = [SpotHolding(k, n, by_key[k].capacity_rps) for k, n in holdings.items() if k in by_key]
    spill = state.of(snap.model).spill
    want = standbys_wanted(spot, cap, cfg.standby_loss_fraction, cfg.standby_value, spill)
    notes: list[Note] = []
    launch = None
    end = _beyond_worth(standbys, snap.model, standbys_worth(spot, cfg.standby_value, spill))
    if len(standbys) < want:
        # A new standby runs until it has booted and is stopped: it is spend meanwhile.
        known = {m.instance_id for m in snap.fleet}
        extended = replace(
            snap, fleet=(*snap.fleet, *(m for m in serving if m.instance_id not in known))
        )
        key = (cfg.standby_type, "on-demand")
        allowed, notes = price_within_rails(
            [(key, want - len(standbys), cfg.standby_price)], extended.spend(), cfg.limits
        )
        if allowed.get(key, 0) > 0:
            launch = Launch(
                snap.model,
                cfg.standby_type,
                "on-demand",
                allowed[key],
                "standby",
                f"pool of {want} covers the spot capacity at risk",
            )
    # Freshly launched standbys are stopped once they have booted (EC2 cannot launch
    # straight into "stopped"); started ones are stopped once replacements serve.
    booted = [
        m
        for m in serving
        if m.state in ("running", "ready")
        and snap.now >= m.launched_at + cfg.boot_s  # booted and serving, not just "running"
        and m.key in by_key
    ]
    pooled = pools(snap, cfg)
    ready = sum(member_capacity(rated[m.key], len(booted), pooled) for m in booted)
    need = max(0.0, load_now - ready)
    active = [Standby(m.instance_id, cap) for m in standbys if m.state in ("running", "ready")]
    held = snap.now < state.of(snap.model).hold_standbys_until
    to_stop = standbys_to_stop(active, need) if active and not held else ()
    stop = (
        Change("stop", snap.model, tuple(to_stop), f"replacements cover all but {need:.1f} r/s")
        if to_stop
        else None
    )
    return StandbyPoolStep(launch, stop, end, tuple(notes))


def _beyond_worth(standbys: Sequence[Member], model: str, worth: float) -> Change | None:
    """The stopped standbys beyond ``worth`` (newest first): each costs its volume and
    saves less. Running ones carry load after a notice; the stop above decides them."""
    stopped = sorted(
        (m for m in standbys if m.state == "stopped"),
        key=lambda m: (-m.launched_at, m.instance_id),
    )
    extra = len(standbys) - worth
    if extra <= 0 or not stopped:
        return None
    ids = tuple(m.instance_id for m in stopped[: int(min(extra, len(stopped)))])
    why = (
        f"a pool of {int(worth)} is all the spill the standbys could save pays for "
        "(spill answers within RT_max)"
    )
    return Change("terminate", model, ids, why)


@dataclass(frozen=True)
class InterruptionStep:
    """What a spot notice changes at once."""

    victim: Member
    reclaim_at: float
    start: Change | None
    notes: tuple[Note, ...]
    state: ControlState
    """The next state once the standbys have started (or when none are to start)."""
    if_start_fails: ControlState
    """The next state if the cloud refuses the start: the notice is remembered all the
    same (the victim doomed, its offering avoided, standbys held) and the start is owed
    (``ControlState.pending_starts``), so the next notice or step tries again."""


def interruption_step(
    snap: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    instance_id: str,
    action_at: float | None,
) -> InterruptionStep | None:
    """A spot instance of ``snap.model`` will be reclaimed: start standbys, avoid its
    offering, plan without it. None for an instance not in the fleet or already doomed
    (a standby start it still owes is ``owed_standbys_step``'s)."""
    victim = next((m for m in snap.fleet if m.instance_id == instance_id), None)
    if victim is None or instance_id in state.doomed:
        return None
    now = snap.now
    reclaim_at = action_at if action_at is not None else now + 120.0
    opt = next((o for o in planning_options(snap, cfg) if o.key == victim.key), None)
    serving = sum(1 for m in snap.mine() if m.live and m.role in SERVING_ROLES)
    lost = member_capacity(opt, serving, pools(snap, cfg)) if opt is not None else 0.0
    response = on_interruption_notice(
        victim.key, lost, _stopped_standbys(snap, cfg), state.avoid, now
    )
    start, notes = _within_rails(snap, cfg, response.start)
    control = state.of(snap.model)
    # Standbys carry the lost capacity until the instance is gone and replacements,
    # launched now, have booted; only then may the load decide to stop them.
    hold = max(control.hold_standbys_until, reclaim_at + cfg.boot_s)
    state = replace(
        state.with_model(snap.model, replace(control, hold_standbys_until=hold)),
        avoid=response.memory,
        doomed={**state.doomed, instance_id: reclaim_at},
        interruptions=state.interruptions.noticed(),
    )
    why = (
        f"spot interruption of {instance_id} ({victim.instance_type}) at t={reclaim_at:g}: "
        f"{lost:.1f} r/s lost, {len(start)} standby(s) started, "
        f"{response.uncovered_rps:.1f} r/s left to Lambda until replacements serve"
    )
    notes.append(Note("start-standby", why, instance_id=instance_id, count=len(start)))
    change = Change("start", snap.model, tuple(start), "standby started") if start else None
    owed = replace(
        state,
        pending_starts={
            **state.pending_starts,
            instance_id: PendingStart(snap.model, lost, reclaim_at + cfg.boot_s),
        },
    )
    return InterruptionStep(
        victim, reclaim_at, change, tuple(notes), state, owed if change is not None else state
    )


@dataclass(frozen=True)
class StandbyRetry:
    """Standby starts owed by earlier notices, tried again."""

    start: Change | None
    notes: tuple[Note, ...]
    state: ControlState
    """The next state once the standbys have started (or when none are to start)."""
    if_start_fails: ControlState
    """The next state if the cloud refuses again: still owed, until replacements serve."""


def owed_standbys_step(snap: Snapshot, state: ControlState, cfg: StepConfig) -> StandbyRetry | None:
    """Start the standbys earlier notices of ``snap.model`` wanted and the cloud refused.

    What is owed covers the capacity those interrupted instances served; it is given up
    once replacements could have booted (the notice's reclaim time + boot time), or
    when no stopped standby is left to start. None when nothing is owed.
    """
    owed = {i: p for i, p in state.pending_starts.items() if p.model == snap.model}
    if not owed:
        return None
    now = snap.now
    over = {i for i, p in owed.items() if now >= p.until}
    notes = [
        Note(
            "start-standby-abandoned",
            f"standbys for the interrupted {iid} never started; replacements could have "
            f"booted by t={owed[iid].until:g}",
            instance_id=iid,
        )
        for iid in sorted(over)
    ]
    kept = {i: p for i, p in state.pending_starts.items() if i not in over}
    if_fails = replace(state, pending_starts=kept)
    due = {i: p for i, p in owed.items() if i not in over}
    settled = replace(state, pending_starts={i: p for i, p in kept.items() if i not in due})
    if not due:
        return StandbyRetry(None, tuple(notes), settled, settled)
    lost = sum(p.lost_rps for p in due.values())
    start, rail = _within_rails(
        snap, cfg, standbys_to_start(lost, _stopped_standbys(snap, cfg)).start
    )
    notes += rail
    victims = ", ".join(sorted(due))
    notes.append(
        Note(
            "start-standby",
            f"retry for the interrupted {victims}: {lost:.1f} r/s lost, "
            f"{len(start)} standby(s) started"
            + ("" if start else " (no stopped standby left, or the spend rails allow none)"),
            count=len(start),
        )
    )
    if not start:
        return StandbyRetry(None, tuple(notes), settled, settled)
    change = Change("start", snap.model, tuple(start), "standby started (retry)")
    return StandbyRetry(change, tuple(notes), settled, if_fails)


def _stopped_standbys(snap: Snapshot, cfg: StepConfig) -> list[Standby]:
    return [
        Standby(m.instance_id, cfg.standby_capacity_rps)
        for m in snap.mine()
        if m.role == "standby" and m.state == "stopped"
    ]


def _within_rails(
    snap: Snapshot, cfg: StepConfig, wanted: Sequence[str]
) -> tuple[list[str], list[Note]]:
    """The standbys of ``wanted`` the spend rails allow starting, and the rail hits."""
    start = list(wanted)
    if not start:
        return [], []
    first = next(m for m in snap.fleet if m.instance_id == start[0])
    key = (first.instance_type, "on-demand")
    allowed, notes = price_within_rails(
        [(key, len(start), first.price_per_hour)], snap.spend(), cfg.limits
    )
    return start[: allowed.get(key, 0)], notes
