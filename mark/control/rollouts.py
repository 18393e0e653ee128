"""Versions rolling, carried out: ``provisioner.rollout``'s step for each model that rolls,
its drains and terminations, and the turn back to the version rolled from.

The controller asks ``step`` before a model's health and plan steps and plans with the
fleet it returns (without the outdated instances, which still serve). A roll that turns
back calls ``on_version`` with the version rolled from, so the daemon serves it again
(the spill function's model, the version new instances are tagged with, metadata).
A daemon restarted in the middle of a roll finds instances of another version than the
configured one and rolls them out the same way (with nothing to turn back to).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from mark.config import ModelSpec
from mark.control.reconcile import LIVE, Reconciler
from mark.control.recorder import Recorder
from mark.control.snapshot import snapshot
from mark.control.step_runner import terminate
from mark.ports import InstanceInfo
from provisioner.health_step import HealthFact, with_readiness
from provisioner.rollout import SERVES, Rollout, rollout_step


def _outdated(model: str, version: str, fleet: Sequence[InstanceInfo]) -> bool:
    return any(
        i.model == model
        and i.role.value in SERVES
        and i.state in LIVE
        and i.version is not None
        and i.version != version
        for i in fleet
    )


@dataclass
class Rollouts:
    """Every model's roll under way, and the spec each rolled from (to turn back to)."""

    under_way: dict[str, Rollout] = field(default_factory=dict)
    rolled_from: dict[str, ModelSpec] = field(default_factory=dict)
    on_version: Callable[[ModelSpec], None] | None = None
    """Told the spec to serve again when a roll turns back."""

    def start(self, old: ModelSpec, new: ModelSpec, now: float) -> None:
        """``new``'s version serves from now on; ``old``'s instances go once it is ready."""
        self.rolled_from[new.name] = old
        self.under_way[new.name] = Rollout(new.version, old.version, now)

    async def step(
        self,
        spec: ModelSpec,
        now: float,
        fleet: Sequence[InstanceInfo],
        facts: Mapping[str, HealthFact] | None,
        price: Callable[[str, str], float],
        boot_deadline_s: float,
        settle_s: float,
        recorder: Recorder,
        reconciler: Reconciler,
    ) -> tuple[list[InstanceInfo], ModelSpec]:
        """The fleet to plan ``spec`` with (its outdated instances left out), and the spec
        to plan (the one rolled from, if the roll turned back)."""
        name = spec.name
        roll = self.under_way.get(name)
        if roll is None:
            if not _outdated(name, spec.version, fleet):
                return list(fleet), spec
            roll = Rollout(spec.version, None, now)  # adopted: found at a restart
        snap = snapshot(name, now, fleet, price, ())
        if facts is not None:
            snap = with_readiness(snap, facts)
        step = rollout_step(name, roll, snap.fleet, now, boot_deadline_s, settle_s)
        notes = list(step.notes)
        if step.rolled_back:
            back = self.rolled_from.pop(name, None)
            if back is not None:
                spec = back
                reconciler.versions[name] = back.version
                if self.on_version is not None:
                    self.on_version(back)
        if step.retire:
            notes += await terminate(name, step.retire, fleet, now, recorder, reconciler)
        if step.roll is None:
            self.under_way.pop(name, None)
            self.rolled_from.pop(name, None)
        else:
            self.under_way[name] = step.roll
        await recorder.record(name, now, notes)
        left_out = step.outdated | set(step.retire)
        return [i for i in fleet if i.instance_id not in left_out], spec
