"""Bounded exploration: measure an offering type no profile rates, one instance at a time.

In the aws world a type with no measured or shipped profile is not planned
(``provisioner.profile_choice``), so mark would never learn how fast it is.
When the user allows it (``planner.explore_unprofiled``), a control step
launches ONE instance of the cheapest such type in role ``explore``: its agent
times the model on that type's device at start and reports the profile with
its readiness; the shell stores it as ``measured`` and re-rates the model's
offerings, so the type becomes plannable. The exploring instance only measures:
it serves no requests and is not counted by the planner, and it is retired as
soon as its agent is ready or its type is rated (the planner then buys the type
if it pays). One never ready is ended by the health rules at its boot deadline
(``provisioner.health_step``), which avoids its offering for a while.

Bounds: at most ``max_concurrent`` exploring instances in the cluster at once,
at least ``interval_s`` between two explorations of a model, never a type whose
accelerator the model cannot use, never an avoided offering, never past the
fleet bound or the spend rails. Pure: no I/O, no clock, no await.
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
    max_concurrent: int = 0
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


def explore_step(
    snap: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    explore: ExploreConfig,
    candidates: Sequence[Candidate],
    profiled: Collection[str],
    has_neuron_artifact: bool,
) -> ExploreStep:
    """Retire exploring instances of ``snap.model`` that measured their type; launch one
    for the cheapest unprofiled candidate when the bounds allow.

    ``profiled``: the types some profile rates for this model now (measured, shipped
    or emulated). ``snap`` holds the fleet after this step's launches and retirements,
    with each instance's state as its agent says (``ready`` once it reported).
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
    if explore.max_concurrent <= 0:
        return ExploreStep(None, retire, tuple(notes), state)
    control = state.of(snap.model)
    in_cluster = sum(
        1 for m in snap.fleet if m.live and m.role == EXPLORE_ROLE and m.instance_id not in gone
    )
    mine_live = sum(1 for m in snap.mine() if m.live and m.instance_id not in gone)
    # The fleet remembers the last exploration too, for a restarted controller.
    last = max([control.explored_at, *(m.launched_at for m in exploring)])
    if (
        in_cluster >= explore.max_concurrent
        or now < last + explore.interval_s
        or (cfg.guard.max_fleet is not None and mine_live + 1 > cfg.guard.max_fleet)
    ):
        return ExploreStep(None, retire, tuple(notes), state)
    pick = _cheapest_unprofiled(
        snap, state, candidates, profiled, has_neuron_artifact, {m.instance_type for m in exploring}
    )
    if pick is None:
        return ExploreStep(None, retire, tuple(notes), state)
    key = (pick.instance_type, pick.market)
    allowed, hits = price_within_rails(
        [(key, 1, pick.price_per_hour)], snap.spend(gone=gone), cfg.limits
    )
    notes += hits
    if allowed.get(key, 0) < 1:
        return ExploreStep(None, retire, tuple(notes), state)
    why = (
        f"no profile rates {pick.instance_type} for {snap.model}: one instance measures it "
        f"(${pick.price_per_hour:.4f}/h; {in_cluster + 1} of at most {explore.max_concurrent} "
        f"exploring; the next exploration not before {explore.interval_s:g} s)"
    )
    launch = Launch(snap.model, pick.instance_type, pick.market, 1, EXPLORE_ROLE, why)
    state = state.with_model(snap.model, replace(control, explored_at=now))
    return ExploreStep(launch, retire, tuple(notes), state)


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
