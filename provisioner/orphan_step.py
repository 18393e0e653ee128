"""The orphan sweep: which of the cluster's instances nothing claims, and which to end.

Everything mark launches carries the cluster's ownership tag, and a step only ever
looks at its own model's instances, so an instance no step claims would run (and
bill) for ever: the instances of a model taken out of the configuration, stopped
standbys beyond what a model's pool now needs. Every control step the shell lists
the cluster's instances and asks ``orphan_step`` which are claimed:

* an instance of a configured model in role ``serving``, ``backup``, ``explore`` or
  ``profiling`` is claimed (the plan, the SLO monitor, exploration and
  ``mark profile --type`` each end their own);
* a standby of a configured model is claimed while it is running (it carries load
  after a spot notice, and the pool step stops it) and while the stopped pool is no
  larger than the spot capacity at risk needs and its worth allows
  (``standbys_wanted``, as the pool step sizes it); the stopped ones beyond that are
  orphans of kind ``beyond-pool``;
* an instance of a model no longer configured is an orphan of kind ``removed-model``.

Every orphan is reported every step (a decision ``orphan``), with how long it has
been one; it is terminated (``retire-orphan``) only when its kind is one the
configuration allows (``control.terminate_orphans``; by default removed models'
instances only) and it has been an orphan for the grace period
(``control.orphan_grace_s``), so a model removed by mistake and put back within it
loses nothing. An instance without this cluster's ownership tag is never judged,
let alone terminated: the fleet lists only tagged ones, and this step checks it
again. Pure: no I/O, no clock, no await.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from provisioner.control_state import (
    SERVING_ROLES,
    Change,
    ControlState,
    Member,
    Note,
)
from provisioner.greedy import PlannerOption
from provisioner.spot import SpotHolding
from provisioner.standby_value import StandbyValue, standbys_wanted

REMOVED_MODEL = "removed-model"
BEYOND_POOL = "beyond-pool"
ORPHAN_KINDS = (REMOVED_MODEL, BEYOND_POOL)

_GONE_STATES = frozenset({"shutting-down", "terminated"})


@dataclass(frozen=True)
class StandbyPool:
    """How a configured model sizes its stopped standby pool (as ``standby_pool_step``)."""

    options: tuple[PlannerOption, ...] = ()
    standby_capacity_rps: float = 0.0
    """One standby's capacity; 0: the model keeps no pool."""
    loss_fraction: float = 0.25
    value: StandbyValue | None = None
    """What prices a standby against the spill it saves (``provisioner.standby_value``)."""


@dataclass(frozen=True)
class OrphanConfig:
    cluster: str | None
    """The cluster's ownership tag value; None: nothing can be proven ours, nothing is swept."""
    models: Mapping[str, StandbyPool] = field(default_factory=dict)
    """Every configured model, with its standby pool rule."""
    grace_s: float = 600.0
    """How long an instance is an orphan before it may be terminated."""
    terminate: Collection[str] = (REMOVED_MODEL,)
    """The orphan kinds that are terminated after the grace; the others are only reported."""


@dataclass(frozen=True)
class Orphan:
    member: Member
    kind: str
    why: str
    since: float


@dataclass(frozen=True)
class OrphanStep:
    orphans: tuple[Orphan, ...]
    """Every orphan found, oldest instance first."""
    terminate: tuple[Change, ...]
    """One terminate per model (the ledger bills each to its own model)."""
    notes: tuple[tuple[str, Note], ...]
    """(model, note): each orphan reported, or its termination."""
    state: ControlState


def orphan_step(
    fleet: Sequence[Member], now: float, state: ControlState, cfg: OrphanConfig
) -> OrphanStep:
    """Find the orphans among ``fleet`` (every instance the cluster lists, every model's)
    and say which to terminate now; the state keeps since when each has been one."""
    owned = [
        m
        for m in fleet
        if cfg.cluster is not None and m.owner == cfg.cluster and m.state not in _GONE_STATES
    ]
    found = [*_removed_models(owned, cfg), *_beyond_pools(owned, state, cfg)]
    found.sort(key=lambda o: (o[0].launched_at, o[0].instance_id))
    orphans: list[Orphan] = []
    notes: list[tuple[str, Note]] = []
    ending: dict[str, list[str]] = {}
    for m, kind, why in found:
        since = state.orphans.get(m.instance_id, now)
        orphans.append(Orphan(m, kind, why, since))
        ready_at = since + cfg.grace_s
        if kind in cfg.terminate and now >= ready_at:
            ending.setdefault(m.model, []).append(m.instance_id)
            verdict = f"{why}; an orphan since t={since:g}, terminated after the grace"
            notes.append((m.model, _note("retire-orphan", verdict, m)))
            continue
        if kind not in cfg.terminate:
            kept = f"kept: control.terminate_orphans does not include {kind}"
        else:
            kept = f"terminated at t={ready_at:g}, after the grace of {cfg.grace_s:g} s"
        notes.append((m.model, _note("orphan", f"{why}; an orphan since t={since:g}, {kept}", m)))
    terminate = tuple(
        Change("terminate", model, tuple(ids), "orphan: claimed by no model, pool or step")
        for model, ids in sorted(ending.items())
    )
    # Never an instance without this cluster's ownership tag, whatever the rules above say.
    by_id = {m.instance_id: m for m in fleet}
    assert all(
        cfg.cluster is not None and by_id[i].owner == cfg.cluster
        for c in terminate
        for i in c.instance_ids
    ), "the orphan sweep chose an instance this cluster does not own"
    next_state = replace(state, orphans={o.member.instance_id: o.since for o in orphans})
    return OrphanStep(tuple(orphans), terminate, tuple(notes), next_state)


def _note(action: str, why: str, m: Member) -> Note:
    return Note(action, why, m.instance_type, m.market, 1, m.instance_id)


def _removed_models(owned: Sequence[Member], cfg: OrphanConfig) -> list[tuple[Member, str, str]]:
    return [
        (
            m,
            REMOVED_MODEL,
            f"model {m.model!r} is not configured any more"
            if m.model
            else "no model is named on its tags",
        )
        for m in owned
        if m.model not in cfg.models
    ]


def _beyond_pools(
    owned: Sequence[Member], state: ControlState, cfg: OrphanConfig
) -> list[tuple[Member, str, str]]:
    out = []
    for model, pool in cfg.models.items():
        mine = [m for m in owned if m.model == model]
        standbys = [m for m in mine if m.role == "standby"]
        if not standbys:
            continue
        want = _pool_size(model, mine, state, pool)
        extra = len(standbys) - want
        # Only stopped ones: a running standby carries load, the pool step stops it.
        stopped = sorted(
            (m for m in standbys if m.state == "stopped"),
            key=lambda m: (-m.launched_at, m.instance_id),
        )
        for m in stopped[: max(0, extra)]:
            why = f"standby beyond the pool of {want} that {model!r} needs now"
            out.append((m, BEYOND_POOL, why))
    return out


def _pool_size(model: str, mine: Sequence[Member], state: ControlState, pool: StandbyPool) -> int:
    """The stopped standbys the spot capacity at risk needs, as the pool step counts it."""
    if pool.standby_capacity_rps <= 0:
        return 0
    by_key = {o.key: o for o in pool.options}
    holdings: dict[tuple[str, str], int] = {}
    for m in mine:
        if (
            m.live
            and m.market == "spot"
            and m.role in SERVING_ROLES
            and m.instance_id not in state.doomed
            and m.key in by_key
        ):
            holdings[m.key] = holdings.get(m.key, 0) + 1
    spot = [SpotHolding(k, n, by_key[k].capacity_rps) for k, n in holdings.items()]
    spill = state.of(model).spill
    return standbys_wanted(spot, pool.standby_capacity_rps, pool.loss_fraction, pool.value, spill)
