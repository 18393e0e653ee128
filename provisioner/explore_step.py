"""Bounded exploration: measure an offering type no profile rates, one instance at a time.

In the aws world a type with no measured or shipped profile is not planned
(``provisioner.profile_choice``), so without this a new model would get no
instance at all, every request going to Lambda. By default
(``planner.explore_unprofiled``) a control step launches ONE instance of the
cheapest such type in role ``explore``: its agent times the model on that
type's device at start and reports the profile with its readiness; the shell
stores it as ``measured`` and re-rates the model's offerings, so the next step
plans the type. The exploring instance only measures: it serves no requests
and is not counted by the planner, and it is retired as soon as its agent is
ready or its type is rated. One never ready is ended by the health rules at its
boot deadline (``provisioner.health_step``), which avoids its offering for a while.

Bounds: at most ``max_concurrent`` exploring instances in the cluster at once,
at least ``interval_s`` between two explorations of a model (waived while the
model has nothing it can be planned on, all of it on Lambda until one type is
measured, unless an offering failed lately), never a type whose accelerator the
model cannot use, never an avoided offering, never past the fleet bound or the
spend rails (a held exploration is a decision, ``explore-held``). Pure: no I/O,
no clock, no await.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from provisioner.accelerators import usable
from provisioner.control_state import Change, ControlState, Launch, Note, Snapshot, StepConfig
from provisioner.step import price_within_rails

EXPLORE_ROLE = "explore"


@dataclass(frozen=True)
class ExploreConfig:
    max_concurrent: int = 1
    """Exploring instances in the whole cluster at once; 0: exploration is off."""
    interval_s: float = 3600.0
    """At least this long between two explorations of one model."""


@dataclass(frozen=True)
class Candidate:
    """A configured offering, as exploration weighs it."""

    instance_type: str
    market: str
    accelerator: str  # the catalog's name: cpu, gpu, inferentia, trainium
    price_per_hour: float


@dataclass(frozen=True)
class ExploreStep:
    launch: Launch | None
    retire: Change | None
    notes: tuple[Note, ...]
    state: ControlState
    awaiting: tuple[tuple[str, bool], ...] = ()
    """The types the model can use that no profile rates, cheapest first, each with
    whether an instance explores it now (``mark plan --explain``, ``mark status``)."""


def explore_step(
    snap: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    explore: ExploreConfig,
    candidates: Sequence[Candidate],
    profiled: Collection[str],
    has_neuron_artifact: bool,
    *,
    unplannable: bool = False,
) -> ExploreStep:
    """Retire exploring instances of ``snap.model`` that measured their type; launch one
    for the cheapest unprofiled candidate when the bounds allow.

    ``profiled``: the types some profile rates for this model now (measured, shipped
    or emulated). ``snap`` holds the fleet after this step's launches and retirements,
    with each instance's state as its agent says (``ready`` once it reported).
    ``unplannable``: no rated offering can serve the model (all of it spills), so the
    interval does not hold it back unless an offering is avoided; the other bounds do.
    """
    now = snap.now
    exploring = [m for m in snap.mine() if m.live and m.role == EXPLORE_ROLE]
    done = [m for m in exploring if m.state == "ready" or m.instance_type in profiled]
    notes = [
        Note(
            "explore-done",
            f"{m.instance_type} measured (its agent reported its profile): the exploring "
            "instance is retired; the planner now rates the type from it",
            m.instance_type,
            m.market,
            1,
            m.instance_id,
        )
        for m in done
    ]
    gone = frozenset(m.instance_id for m in done)
    retire = (
        Change("terminate", snap.model, tuple(sorted(gone)), "explored: measured") if gone else None
    )
    still = {m.instance_type for m in exploring if m.instance_id not in gone}
    awaiting = _awaiting(candidates, profiled, has_neuron_artifact, still)
    held = ExploreStep(None, retire, tuple(notes), state, awaiting)
    if explore.max_concurrent <= 0:
        return held
    control = state.of(snap.model)
    in_cluster = sum(
        1 for m in snap.fleet if m.live and m.role == EXPLORE_ROLE and m.instance_id not in gone
    )
    mine_live = sum(1 for m in snap.mine() if m.live and m.instance_id not in gone)
    # The fleet remembers the last exploration too, for a restarted controller.
    last = max([control.explored_at, *(m.launched_at for m in exploring)])
    # The interval is waived for a model nothing serves, unless an offering it could
    # explore is avoided now (one failed lately): a model that never gets ready then
    # costs one exploring instance's boot deadline an interval, not a fleet's time.
    hurry = unplannable and not _any_avoided(snap, state, candidates)
    if in_cluster >= explore.max_concurrent or (not hurry and now < last + explore.interval_s):
        return held
    pick = _cheapest_unprofiled(
        snap, state, candidates, profiled, has_neuron_artifact, {m.instance_type for m in exploring}
    )
    if pick is None:
        return held
    if cfg.guard.max_fleet is not None and mine_live + 1 > cfg.guard.max_fleet:
        notes.append(
            _held(pick, f"the model's fleet is at offerings.max_instances ({cfg.guard.max_fleet})")
        )
        return replace(held, notes=tuple(notes))
    key = (pick.instance_type, pick.market)
    allowed, hits = price_within_rails(
        [(key, 1, pick.price_per_hour)], snap.spend(gone=gone), cfg.limits
    )
    notes += hits
    if allowed.get(key, 0) < 1:
        notes.append(_held(pick, "one more instance would pass the spend rails (budget.*)"))
        return replace(held, notes=tuple(notes))
    wait = "none: nothing rated serves the model" if hurry else f"{explore.interval_s:g} s"
    why = (
        f"no profile rates {pick.instance_type} for {snap.model}: one instance measures it "
        f"(${pick.price_per_hour:.4f}/h; {in_cluster + 1} of at most {explore.max_concurrent} "
        f"exploring; interval to the next exploration: {wait})"
    )
    launch = Launch(snap.model, pick.instance_type, pick.market, 1, EXPLORE_ROLE, why)
    state = state.with_model(snap.model, replace(control, explored_at=now))
    awaiting = _awaiting(candidates, profiled, has_neuron_artifact, {*still, pick.instance_type})
    return ExploreStep(launch, retire, tuple(notes), state, awaiting)


def _any_avoided(snap: Snapshot, state: ControlState, candidates: Sequence[Candidate]) -> bool:
    """Whether an offering among ``candidates`` is avoided now (out of capacity, an
    instance that never got ready, a spot reclaim)."""
    return any(
        state.avoid.avoid_until.get((c.instance_type, c.market), float("-inf")) > snap.now
        for c in candidates
    )


def _held(pick: Candidate, why: str) -> Note:
    """Why an exploration the other bounds allowed is not launched, and what to do."""
    return Note(
        "explore-held",
        f"no profile rates {pick.instance_type}, but it is not explored: {why} "
        f"(${pick.price_per_hour:.4f}/h); raise the bound, or measure it with "
        f"`mark profile --type {pick.instance_type}`",
        pick.instance_type,
        pick.market,
    )


def _awaiting(
    candidates: Sequence[Candidate],
    profiled: Collection[str],
    has_neuron_artifact: bool,
    exploring: Collection[str],
) -> tuple[tuple[str, bool], ...]:
    """Each type (once, at its cheapest offering) the model could be planned on once a
    profile rates it, with whether it is being explored."""
    out: dict[str, bool] = {}
    for c in sorted(candidates, key=lambda c: (c.price_per_hour, c.instance_type)):
        if c.instance_type not in profiled and usable(c.accelerator, has_neuron_artifact)[0]:
            out.setdefault(c.instance_type, c.instance_type in exploring)
    return tuple(out.items())


def _cheapest_unprofiled(
    snap: Snapshot,
    state: ControlState,
    candidates: Sequence[Candidate],
    profiled: Collection[str],
    has_neuron_artifact: bool,
    being_explored: Collection[str],
) -> Candidate | None:
    """The cheapest offering of a type no profile rates, that the model can use, that is
    not avoided now and not already being explored."""
    fit = [
        c
        for c in candidates
        if c.instance_type not in profiled
        and c.instance_type not in being_explored
        and usable(c.accelerator, has_neuron_artifact)[0]
        and state.avoid.avoid_until.get((c.instance_type, c.market), float("-inf")) <= snap.now
    ]
    return min(fit, key=lambda c: (c.price_per_hour, c.instance_type, c.market), default=None)
