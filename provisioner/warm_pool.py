"""The warm pool: retired on-demand instances are stopped, not terminated, and started
again, not launched anew, when a plan wants their type.

A launch serves only after its boot (minutes on EC2: the image, the runtime, the model).
A stopped instance keeps its volume, and with it everything the boot installed, so a start
serves in seconds (EC2 Auto Scaling's warm pools rest on the same fact). What it costs is
its volume while stopped (EBS bills a stopped instance's storage, never its compute).

The rules, all pure:

* **stop or terminate** (``keeps_warm``): a retired on-demand serving or backup instance is
  stopped when a start is faster than a launch; spot instances are terminated (a one-time
  spot request cannot be stopped);
* **how long a stopped instance is kept** (``hold_s``): while the volume has cost less
  than what one start is expected to save over a launch, for the boot seconds a start
  spares: the instance's price and, where spill answers within RT_max, the spill its
  capacity would take (on Inception-v3 about 1.3× a c5.large's price and 4× a
  p2.xlarge's) at the share of recent starts that met a load outrunning the fleet (a
  start planned ahead spares no spill; ``counted``). Past that it is terminated.
  Keeping it longer could cost more than launching anew; ending it sooner could throw
  away a start that would have paid. Waiting exactly the break-even time never costs
  more than twice the better choice in hindsight (the ski-rental rule, as the cool-down);
* **start before launch** (``warm_step``): a launch the plan wants starts its type's
  stopped instances first, newest stopped first. While the load outruns the fleet, it is
  carried by stopped instances the cheapest per request first: its own type's one for
  one, another type's where they carry at least as much, as the plan rates them, for no
  more an hour (``substitute``: a fleet no dearer and no smaller, serving a start after
  the decision rather than a boot; a surge met with c5.large launches while a p2.xlarge
  waits stopped), or for more an hour where they are no dearer per request and all
  they carry beyond the launches is load already waiting beyond the fleet and the
  step's launches (their extra capacity is used at once). Only the rest is launched.
  A backup takes only its own type;
* **cool-down** (``cooldown_s``): an instance that will be stopped costs one start, not one
  boot, to have back, so it is retired once it has gone a start's time unwanted (the
  billing minimum still holds it for its first 60 s);
* **when a started one serves** (``ready_at``): its start time plus the start, which the
  planner counts as it counts a booting launch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from provisioner.control_state import (
    SERVING_ROLES,
    Launch,
    Member,
    Note,
    WarmPoolConfig,
    WarmState,
)
from provisioner.greedy import OptionKey


def keeps_warm(m: Member, boot_s: float, cfg: WarmPoolConfig | None) -> bool:
    """Whether ``m``, once the plan retires it, is stopped into the pool."""
    return (
        cfg is not None
        and m.market == "on-demand"
        and m.role in SERVING_ROLES
        and hold_s(m, boot_s, cfg) > 0.0
    )


def hold_s(m: Member, boot_s: float, cfg: WarmPoolConfig, outrun_share: float = 0.0) -> float:
    """How long a stopped instance is kept: until its volume has cost what one start is
    expected to save over a launch, for each of the ``boot_s − start_s`` seconds it
    spares: the instance's price, and where spill answers in time, the spill its capacity
    would otherwise take (``WarmPoolConfig.spill_per_hour``) times the share of starts
    that met a load outrunning the fleet (``WarmState.outrun_share``: a start planned
    ahead spares no spill); 0 where a start is no faster, unbounded where the volume is
    free."""
    spill = cfg.spill_per_hour.get(m.key, 0.0) * min(max(outrun_share, 0.0), 1.0)
    per_hour = m.price_per_hour + spill
    saved = per_hour * max(0.0, boot_s - cfg.start_s) / 3600.0
    if saved <= 0.0:
        return 0.0
    if cfg.ebs_per_hour <= 0.0:
        return math.inf
    return 3600.0 * saved / cfg.ebs_per_hour


def cooldown_s(cfg: WarmPoolConfig) -> float:
    """The cool-down of an instance that will be stopped: one start (the ski-rental rule,
    with a start as the price of having it back), unless one is configured."""
    return cfg.start_s if cfg.cooldown_s is None else cfg.cooldown_s


def ready_at(m: Member, boot_s: float, warm: WarmState, cfg: WarmPoolConfig | None) -> float:
    """When ``m`` serves: its start plus the start time if started out of the pool, else its
    launch plus the boot."""
    started = warm.started_at.get(m.instance_id)
    if started is None or cfg is None:
        return m.launched_at + boot_s
    return started + cfg.start_s


def serving_from(m: Member, warm: WarmState) -> float:
    """When ``m``'s current run began: its start out of the pool, else its launch (EC2
    reports a restarted instance's ``LaunchTime`` as its last start; moto does not)."""
    return max(m.launched_at, warm.started_at.get(m.instance_id, -math.inf))


@dataclass(frozen=True)
class WarmStep:
    """What the pool makes of a step's launches and retirements."""

    start: tuple[str, ...]
    """Stopped instances to start instead of launching."""
    launches: tuple[Launch, ...]
    """The launches still wanted once the starts are counted."""
    stop: tuple[str, ...]
    """Retired instances to stop into the pool."""
    terminate: tuple[str, ...]
    """Retired instances that are not kept, and stopped ones held past ``hold_s``."""
    notes: tuple[Note, ...]
    state: WarmState
    """The next state, once the starts and stops are carried out."""
    replaced: tuple[Launch, ...] = ()
    """The launches ``start`` stands in for: what to launch if the cloud refuses the
    starts (another type's start may stand in for a dozen launches of the plan's type)."""


def pooled(mine: Sequence[Member]) -> list[Member]:
    """The model's stopped serving instances: the pool."""
    return [
        m
        for m in mine
        if m.role in SERVING_ROLES and m.market == "on-demand" and m.state == "stopped"
    ]


def warm_step(
    mine: Sequence[Member],
    now: float,
    launches: Sequence[Launch],
    retire: Sequence[str],
    boot_s: float,
    cfg: WarmPoolConfig | None,
    warm: WarmState,
    rated: Mapping[OptionKey, Rating] | None = None,
    outrun: bool = False,
    spare_rps: float = 0.0,
) -> WarmStep:
    """Starts for launches, stops for retirements, and the pool's expired instances ended.

    ``mine`` is the model's instances as listed now; ``launches`` and ``retire`` what the
    plan, the guards and the rails decided; ``rated`` each offering's price and capacity
    as the plan counts them; ``outrun`` whether the load has outrun the fleet now. Only
    then may another type carry a launch (``substitute``: a start's speed is worth its
    granularity only while load spills; ``spare_rps`` what the load runs above the fleet
    and the launches); otherwise, or without ``rated``, a launch takes only stopped
    instances of its own type. Without a pool (``cfg`` None) everything
    retired is terminated, and what an earlier configuration left stopped is ended.
    """
    by_id = {m.instance_id: m for m in mine}
    pool = pooled(mine)
    stopped_at = {
        m.instance_id: warm.stopped_at.get(m.instance_id, now) for m in pool
    }  # one stopped outside the pool's knowledge (a restart lost it) is counted from now
    started_at = {
        i: t
        for i, t in warm.started_at.items()
        if i in by_id and by_id[i].live and now < t + boot_s
    }
    notes: list[Note] = []
    expired = (
        [m.instance_id for m in pool]
        if cfg is None
        else _expired(pool, stopped_at, now, boot_s, cfg, warm.outrun_share())
    )
    notes += [
        Note(
            "warm-expired",
            "stopped past the break-even of its volume against the boot a start spares: terminated",
            by_id[i].instance_type,
            by_id[i].market,
            instance_id=i,
        )
        for i in expired
    ]
    available = _available(pool, stopped_at, set(expired))
    start, out, taken = _take(available, launches, (rated or {}) if outrun else {}, spare_rps)
    notes += taken
    replaced = _replaced(launches, out)
    stop = tuple(i for i in retire if i in by_id and keeps_warm(by_id[i], boot_s, cfg))
    terminate = (*(i for i in retire if i not in stop), *expired)
    for i in start:
        started_at[i] = now
    kept = {i: t for i, t in stopped_at.items() if i not in expired and i not in start}
    kept.update({i: now for i in stop})
    return WarmStep(
        tuple(start),
        tuple(out),
        stop,
        tuple(terminate),
        tuple(notes),
        counted(WarmState(kept, started_at, warm.starts, warm.outrun_starts), len(start), outrun),
        replaced,
    )


def _replaced(wanted: Sequence[Launch], left: Sequence[Launch]) -> tuple[Launch, ...]:
    """What of ``wanted`` the starts carry: each launch less what is still launched."""
    still = {(a.key, a.role): a.count for a in left}
    out = []
    for a in wanted:
        n = a.count - still.pop((a.key, a.role), 0)
        if n > 0:
            out.append(replace(a, count=n))
    return tuple(out)


START_MEMORY = 50.0
"""Instance starts after which a past one weighs 1/e in ``WarmState.outrun_share``."""


def counted(warm: WarmState, started: int, outrun: bool) -> WarmState:
    """``warm`` with ``started`` more starts folded in: all of them met an outrun load,
    or none did."""
    if started <= 0:
        return warm
    keep = (1.0 - 1.0 / START_MEMORY) ** started
    return replace(
        warm,
        starts=warm.starts * keep + started,
        outrun_starts=warm.outrun_starts * keep + (started if outrun else 0),
    )


def backup_starts(
    mine: Sequence[Member],
    now: float,
    launch: Launch,
    boot_s: float,
    cfg: WarmPoolConfig | None,
    warm: WarmState,
) -> tuple[tuple[str, ...], Launch | None, tuple[Note, ...], WarmState]:
    """The SLO monitor's backups started out of the pool where it holds their type: the
    ids to start, the launch still wanted (None: none), notes, and the next state. The
    pool's expiries are the planning step's, not this one's."""
    pool = pooled(mine)
    if cfg is None or not pool:
        return (), launch, (), warm
    stopped_at = {m.instance_id: warm.stopped_at.get(m.instance_id, now) for m in pool}
    expired = _expired(pool, stopped_at, now, boot_s, cfg, warm.outrun_share())
    start, out, notes = _take(_available(pool, stopped_at, set(expired)), [launch], {})
    state = counted(  # backups come on a miss streak: the load has outrun the fleet
        replace(
            warm,
            stopped_at={i: t for i, t in warm.stopped_at.items() if i not in start},
            started_at={**warm.started_at, **dict.fromkeys(start, now)},
        ),
        len(start),
        outrun=True,
    )
    return tuple(start), (out[0] if out else None), tuple(notes), state


def _expired(
    pool: Sequence[Member],
    stopped_at: Mapping[str, float],
    now: float,
    boot_s: float,
    cfg: WarmPoolConfig,
    outrun_share: float,
) -> list[str]:
    """The pool's instances stopped for their hold or longer (``hold_s``)."""
    return [
        m.instance_id
        for m in pool
        if now - stopped_at[m.instance_id] >= hold_s(m, boot_s, cfg, outrun_share)
    ]


def _available(
    pool: Sequence[Member], stopped_at: Mapping[str, float], expired: Collection[str]
) -> dict[tuple[str, str], list[str]]:
    """The pool per offering, newest stopped first (its volume has cost least)."""
    out: dict[tuple[str, str], list[str]] = {}
    for m in sorted(pool, key=lambda m: (-stopped_at[m.instance_id], m.instance_id)):
        if m.instance_id not in expired:
            out.setdefault(m.key, []).append(m.instance_id)
    return out


@dataclass(frozen=True)
class Rating:
    """An offering as the plan counts it: its price and what one instance carries."""

    price_per_hour: float
    capacity_rps: float


def substitute(
    count: int, launched: Rating, stopped: Rating, available: int, spare_rps: float = 0.0
) -> tuple[int, int]:
    """How many stopped instances of another offering to start in place of how many of
    ``count`` launches: (starts, launches replaced), (0, 0) for none.

    First as many as each carry whole launches' worth (no more than ``available``), then
    one more for what is left if it carries it; each part only if it carries at least
    what it replaces and costs no more an hour. The last one may cost more an hour where
    it is no dearer per request and all it carries beyond what it replaces is load
    already waiting (``spare_rps``: what the load runs above the fleet and every launch
    of the step): then its extra capacity is used at once, at a lower price per request
    than the launches', and it serves a start after the decision rather than a boot."""
    a, b = launched, stopped
    if count <= 0 or available <= 0 or a.capacity_rps <= 0 or b.capacity_rps <= 0:
        return 0, 0
    starts = min(available, math.floor(count * a.capacity_rps / b.capacity_rps + 1e-9))
    replaced = min(count, math.floor(starts * b.capacity_rps / a.capacity_rps + 1e-9))
    if starts == 0 or starts * b.price_per_hour > replaced * a.price_per_hour:
        starts = replaced = 0
    rest = count - replaced
    if (
        rest > 0
        and starts < available
        and b.capacity_rps >= rest * a.capacity_rps - 1e-9
        and (
            b.price_per_hour <= rest * a.price_per_hour
            or (
                b.price_per_hour * a.capacity_rps <= a.price_per_hour * b.capacity_rps
                and b.capacity_rps - rest * a.capacity_rps <= spare_rps + 1e-9
            )
        )
    ):
        starts, replaced = starts + 1, count
    return starts, replaced


def _take(
    available: dict[tuple[str, str], list[str]],
    launches: Sequence[Launch],
    rated: Mapping[OptionKey, Rating],
    spare_rps: float = 0.0,
) -> tuple[list[str], list[Launch], list[Note]]:
    """Each serving launch carried by stopped instances first (taken out of
    ``available``, ``_carry``; ``spare_rps`` as ``substitute`` has it, shared by the
    launches): the ids to start, the launches left, a note per offering started. A
    standby or a measuring launch takes nothing."""
    start: list[str] = []
    out: list[Launch] = []
    notes: list[Note] = []
    spare = spare_rps
    for a in launches:
        left = a.count
        if a.role in SERVING_ROLES:
            ids, left, taken, spare = _carry(a, available, rated, spare)
            start += ids
            notes += taken
        if left > 0:
            out.append(replace(a, count=left))
    return start, out, notes


def _carry(
    a: Launch,
    available: dict[tuple[str, str], list[str]],
    rated: Mapping[OptionKey, Rating],
    spare: float,
) -> tuple[list[str], int, list[Note], float]:
    """The stopped instances that carry launch ``a``, the cheapest per request first:
    its own offering's one for one, others' where ``substitute`` allows with ``spare``
    r/s of load waiting (only its own where ``a`` is not rated). The ids to start, the
    launches left, a note per offering, and the waiting load its starts leave unused."""
    mine = rated.get(a.key)
    keys = [a.key]
    if mine is not None:
        keys = sorted(
            {a.key, *(k for k, ids in available.items() if ids and k in rated)},
            key=lambda k: (rated[k].price_per_hour / max(rated[k].capacity_rps, 1e-12), k),
        )
    left = a.count
    start: list[str] = []
    notes: list[Note] = []
    for k in keys:
        free = available.get(k, [])
        if k == a.key or mine is None:
            starts = replaced = min(left, len(free))
        else:
            starts, replaced = substitute(left, mine, rated[k], len(free), spare)
            spare -= max(0.0, starts * rated[k].capacity_rps - replaced * mine.capacity_rps)
        if starts == 0:
            continue
        available[k] = free[starts:]
        start += free[:starts]
        left -= replaced
        notes.append(_started_note(a, k, starts, replaced, mine, rated.get(k)))
        if left <= 0:
            break
    return start, left, notes, spare


def _started_note(
    a: Launch, k: OptionKey, starts: int, replaced: int, mine: Rating | None, theirs: Rating | None
) -> Note:
    """The ``warm-start`` decision: started instead of launched, or in place of launches."""
    if k == a.key or mine is None or theirs is None:
        why = f" ({a.reason})" if a.reason else ""
        text = f"{starts} stopped {a.instance_type} started instead of launched{why}"
    else:
        text = (
            f"{starts} stopped {k[0]} started in place of {replaced} {a.instance_type} "
            f"launches: at least their capacity ({starts} × {theirs.capacity_rps:.1f} "
            f"against {replaced} × {mine.capacity_rps:.1f} r/s), no dearer per request, "
            "serving after a start rather than a boot"
        )
    return Note("warm-start", text, k[0], k[1], starts)
