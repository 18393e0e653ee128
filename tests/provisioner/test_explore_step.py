"""Exploring unprofiled offering types, by table: on by default (one at a time), off at 0,
bounded by the concurrency limit, the interval (waived while nothing rated serves the model),
the fleet bound, the spend rails and the accelerator."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from provisioner.control_state import ControlState, Member, ModelControl, Snapshot, StepConfig
from provisioner.explore_step import Candidate, ExploreConfig, explore_step
from provisioner.greedy import PlannerOption
from provisioner.guards import GuardConfig
from provisioner.spend_rails import SpendLimits
from provisioner.spot import InterruptionMemory

NOW = 10_000.0
C5 = PlannerOption("c5.large", "on-demand", 0.085, 10.0, latency_s=0.01)  # rated
CANDIDATES = (
    Candidate("c5.large", "on-demand", "cpu", 0.085),
    Candidate("m5.large", "on-demand", "cpu", 0.096),
    Candidate("g4dn.xlarge", "on-demand", "gpu", 0.526),
    Candidate("inf1.xlarge", "on-demand", "inferentia", 0.228),
)
PROFILED = frozenset({"c5.large"})
CFG = StepConfig(step_s=60.0, tau_steps=1, boot_s=60.0, guard=GuardConfig(max_fleet=10))
ON = ExploreConfig(max_concurrent=1, interval_s=600.0)
OFF = ExploreConfig(max_concurrent=0)


def member(iid: str, itype: str, role: str = "serving", **kw: object) -> Member:
    price = next(c.price_per_hour for c in CANDIDATES if c.instance_type == itype)
    m = Member(iid, "m", itype, "on-demand", role, "running", NOW - 30.0, price)
    return replace(m, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    explore: ExploreConfig = ON
    fleet: tuple[Member, ...] = ()
    state: ControlState = field(default_factory=ControlState)
    limits: SpendLimits = field(default_factory=SpendLimits)
    candidates: tuple[Candidate, ...] = CANDIDATES
    profiled: frozenset[str] = PROFILED
    neuron: bool = False
    launch: str | None = None
    """The type launched to explore, if any."""
    retire: tuple[str, ...] = ()
    note: str | None = None
    """An action among the notes."""
    unplannable: bool = False


CASES = [
    Case("on by default, one at a time", explore=ExploreConfig(), launch="m5.large"),
    Case("0: off, nothing", explore=OFF),
    Case("on: the cheapest unprofiled type the model can use", launch="m5.large", note=None),
    Case(
        "every type profiled: nothing",
        profiled=frozenset({"c5.large", "m5.large", "g4dn.xlarge", "inf1.xlarge"}),
    ),
    Case(
        "already exploring at the limit (any model's instance counts)",
        fleet=(member("x", "g4dn.xlarge", "explore", model="other"),),
    ),
    Case(
        "below a limit of 2, the next type (not the one being explored)",
        explore=ExploreConfig(max_concurrent=2, interval_s=600.0),
        fleet=(member("x", "m5.large", "explore", launched_at=NOW - 900.0),),
        launch="g4dn.xlarge",
    ),
    Case(
        "within the interval since the last exploration: nothing",
        state=ControlState({"m": ModelControl(explored_at=NOW - 100.0)}),
    ),
    Case(
        "within the interval, but nothing rated serves the model: explored at once",
        state=ControlState({"m": ModelControl(explored_at=NOW - 100.0)}),
        unplannable=True,
        launch="m5.large",
    ),
    Case(
        "nothing rated serves the model, but an offering failed lately: the interval holds",
        state=ControlState(
            {"m": ModelControl(explored_at=NOW - 100.0)},
            avoid=InterruptionMemory({("m5.large", "on-demand"): NOW + 60.0}),
        ),
        unplannable=True,
    ),
    Case(
        "nothing rated serves the model, yet the limit still holds",
        fleet=(member("x", "g4dn.xlarge", "explore", model="other"),),
        unplannable=True,
    ),
    Case(
        "the interval is read from the fleet too (a restarted controller)",
        explore=ExploreConfig(max_concurrent=2, interval_s=600.0),
        fleet=(member("x", "m5.large", "explore", launched_at=NOW - 100.0),),
    ),
    Case(
        "above the model's spend rail: nothing, and the rail is a decision",
        fleet=(member("a", "c5.large"),),
        limits=SpendLimits(per_model=0.15),
        note="explore-held",
    ),
    Case(
        "above the cluster's spend rail: nothing",
        fleet=(member("a", "c5.large", model="other"),),
        limits=SpendLimits(cluster=0.1),
        note="spend-rail",
    ),
    Case(
        "within the rails: launched",
        fleet=(member("a", "c5.large"),),
        limits=SpendLimits(per_model=0.2, cluster=0.2),
        launch="m5.large",
    ),
    Case(
        "an accelerator the model cannot use is never explored",
        candidates=(CANDIDATES[0], CANDIDATES[3]),
    ),
    Case(
        "Inferentia once the model has a Neuron artifact",
        candidates=(CANDIDATES[0], CANDIDATES[3]),
        neuron=True,
        launch="inf1.xlarge",
    ),
    Case(
        "an avoided offering is skipped",
        state=ControlState(
            avoid=InterruptionMemory({("m5.large", "on-demand"): NOW + 60.0}),
        ),
        launch="g4dn.xlarge",
    ),
    Case(
        "the fleet bound holds, and says so",
        fleet=tuple(member(f"s{k}", "c5.large") for k in range(10)),
        note="explore-held",
    ),
    Case(
        "an exploring instance whose agent is ready is retired (and frees the limit)",
        fleet=(member("x", "m5.large", "explore", state="ready", launched_at=NOW - 900.0),),
        profiled=PROFILED | {"m5.large"},
        retire=("x",),
        launch="g4dn.xlarge",
        note="explore-done",
    ),
    Case(
        "retired once its type is rated, even with exploration off",
        explore=OFF,
        fleet=(member("x", "m5.large", "explore"),),
        profiled=PROFILED | {"m5.large"},
        retire=("x",),
    ),
    Case(
        "a booting exploring instance is kept",
        explore=OFF,
        fleet=(member("x", "m5.large", "explore"),),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_explore_step(case: Case) -> None:
    snap = Snapshot("m", NOW, (), 0.0, (C5,), case.fleet)
    cfg = replace(CFG, limits=case.limits)
    step = explore_step(
        snap,
        case.state,
        cfg,
        case.explore,
        case.candidates,
        case.profiled,
        case.neuron,
        unplannable=case.unplannable,
    )
    assert (step.launch.instance_type if step.launch else None) == case.launch
    assert (step.retire.instance_ids if step.retire else ()) == case.retire
    if case.note is not None:
        assert case.note in [n.action for n in step.notes]
    if step.launch is not None:
        assert (step.launch.role, step.launch.count, step.launch.model) == ("explore", 1, "m")
        assert "no profile rates" in step.launch.reason
        assert step.state.of("m").explored_at == NOW
    else:
        assert step.state.of("m").explored_at == case.state.of("m").explored_at


def test_one_launch_per_step_and_then_the_limit_holds() -> None:
    """The launch is one instance; the next step, with it in the fleet, launches nothing."""
    snap = Snapshot("m", NOW, (), 0.0, (C5,), ())
    first = explore_step(snap, ControlState(), CFG, ON, CANDIDATES, PROFILED, False)
    assert first.launch is not None and first.launch.count == 1
    booted = member("x", first.launch.instance_type, "explore", launched_at=NOW)
    later = replace(snap, now=NOW + 60.0, fleet=(booted,))
    again = explore_step(later, first.state, CFG, ON, CANDIDATES, PROFILED, False)
    assert again.launch is None and again.retire is None


def test_awaiting_lists_each_usable_unrated_type_once_and_what_is_explored() -> None:
    """What `mark plan --explain` and `mark status` show: cheapest first, one row per type
    (markets merged), never a type the model cannot use, the launched one as explored."""
    both = (*CANDIDATES, Candidate("m5.large", "spot", "cpu", 0.03))
    snap = Snapshot("m", NOW, (), 0.0, (C5,), ())
    step = explore_step(snap, ControlState(), CFG, ON, both, PROFILED, False)
    assert step.launch is not None and step.launch.market == "spot"
    assert step.awaiting == (("m5.large", True), ("g4dn.xlarge", False))
    held = explore_step(
        snap,
        ControlState(),
        replace(CFG, limits=SpendLimits(per_model=0.01)),
        ON,
        both,
        PROFILED,
        False,
    )
    assert held.launch is None and held.awaiting == (("m5.large", False), ("g4dn.xlarge", False))
    (why,) = [n for n in held.notes if n.action == "explore-held"]
    assert "spend rails" in why.reason and "mark profile --type m5.large" in why.reason
    nothing = explore_step(
        snap, ControlState(), CFG, OFF, both, {*PROFILED, "m5.large", "g4dn.xlarge"}, False
    )
    assert nothing.awaiting == ()
