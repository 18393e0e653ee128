"""The rules wrapped around any planner's raw decision, in one place.

A planner says what it wants now (instances to keep, offerings to launch). The
guards turn that into what to do, whatever planner produced it (Ray Serve
applies bounds and delays the same way around any autoscaling policy):

* launches go out at once (capacity is needed τ from now, not later);
* an unwanted instance of an offering the plan wants to launch is reused
  instead, so a plan that flips between equal offerings causes no churn;
* an instance is retired only once it has gone ``cooldown_s`` without being
  wanted (§4.3 "destroy after a cool-down"), and never before its
  ``billing_minimum_s`` (EC2 bills at least 60 s) has been used;
* the fleet never exceeds ``max_fleet``: launches beyond it are dropped and
  counted, instances cooling down still count;
* with a ``hold`` reason (the SLO is being missed) nothing is retired and the
  unwanted instances count as wanted now: their cool-down starts once the
  SLO is met again, since the plan that found them surplus is the one that
  just fell short.

Pure: the state (when each instance was last wanted) goes in and comes out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.greedy import OptionKey, Plan


@dataclass(frozen=True)
class GuardConfig:
    cooldown_s: float = 300.0
    billing_minimum_s: float = 60.0
    max_fleet: int | None = None


@dataclass(frozen=True)
class FleetInstance:
    instance_id: str
    key: OptionKey
    launched_at: float
    """When its current run began (a launch, or a start out of the warm pool)."""
    cooldown_s: float | None = None
    """Its own cool-down (one that will be stopped, not terminated:
    ``provisioner.warm_pool.cooldown_s``); None: the config's."""


@dataclass(frozen=True)
class RawDecision:
    """What a planner wants now, before the guards."""

    keep: frozenset[str]
    launch: tuple[tuple[OptionKey, int], ...]

    @classmethod
    def from_plan(cls, plan: Plan) -> RawDecision:
        return cls(frozenset(plan.kept()), tuple(plan.launches().items()))


@dataclass(frozen=True)
class GuardState:
    last_wanted: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    launch: tuple[tuple[OptionKey, int], ...]
    retire: tuple[str, ...]
    held: tuple[tuple[str, str], ...]
    """(instance id, why it is not retired yet) for unwanted instances kept."""
    reused: tuple[str, ...]
    dropped: tuple[tuple[OptionKey, int], ...] = ()
    """(offering, count) the plan wanted launched that the fleet bound left out."""

    @property
    def dropped_launches(self) -> int:
        return sum(n for _, n in self.dropped)


def within_fleet_bound(
    wanted: Iterable[tuple[OptionKey, int]], bound: int | None, fleet_size: int
) -> tuple[list[tuple[OptionKey, int]], list[tuple[OptionKey, int]]]:
    """The launches that fit under ``bound`` beside a fleet of ``fleet_size`` (first come
    first served, in ``wanted``'s order), and what it leaves out, per offering; None: no
    bound. The plan's launches and the SLO monitor's backups both pass through it."""
    room = None if bound is None else max(0, bound - fleet_size)
    launch: list[tuple[OptionKey, int]] = []
    dropped: list[tuple[OptionKey, int]] = []
    for key, count in wanted:
        allowed = count if room is None else min(count, room)
        if allowed < count:
            dropped.append((key, count - allowed))
        if room is not None:
            room -= allowed
        if allowed > 0:
            launch.append((key, allowed))
    return launch, dropped


def apply_guards(
    raw: RawDecision,
    fleet: Sequence[FleetInstance],
    state: GuardState,
    now: float,
    config: GuardConfig,
    hold: str | None = None,
) -> tuple[Decision, GuardState]:
    wanted_launch = dict(raw.launch)
    last = {
        i.instance_id: now
        if i.instance_id in raw.keep
        else state.last_wanted.get(i.instance_id, i.launched_at)
        for i in fleet
    }

    # Reuse the most recently wanted unwanted instances before launching new ones.
    reused: list[str] = []
    unwanted = sorted(
        (i for i in fleet if i.instance_id not in raw.keep),
        key=lambda i: -last[i.instance_id],
    )
    for inst in unwanted:
        if wanted_launch.get(inst.key, 0) > 0:
            wanted_launch[inst.key] -= 1
            reused.append(inst.instance_id)
            last[inst.instance_id] = now

    retire: list[str] = []
    held: list[tuple[str, str]] = []
    for inst in unwanted:
        iid = inst.instance_id
        if iid in reused:
            continue
        cool = config.cooldown_s if inst.cooldown_s is None else inst.cooldown_s
        cool_until = last[iid] + cool
        billed_until = inst.launched_at + config.billing_minimum_s
        if hold is not None:
            held.append((iid, hold))
            last[iid] = now
        elif now < billed_until:
            held.append((iid, f"billing minimum until t={billed_until:g}"))
        elif now < cool_until:
            held.append((iid, f"cool-down until t={cool_until:g}"))
        else:
            retire.append(iid)

    launch, dropped = within_fleet_bound(
        wanted_launch.items(), config.max_fleet, len(fleet) - len(retire)
    )

    gone = set(retire)
    new_state = GuardState({iid: t for iid, t in last.items() if iid not in gone})
    return Decision(
        tuple(launch), tuple(retire), tuple(held), tuple(reused), tuple(dropped)
    ), new_state
