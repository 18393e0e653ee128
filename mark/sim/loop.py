"""Virtual time in the simulated world: from event to event, serving in between.

The loop advances the world's clock to the next event — a policy step every
``step_s``, an SLO check every ``slo_check_s``, the start of the measured
window, an instance becoming ready, a spot interruption or reclaim — and
between events the engine serves every request that arrives. At each event it
calls the driver's hooks (``PolicyEvents``), then puts the engine on exactly
the instances that are running.

Spot interruptions are the world's doing, not the policy's: planned ones take
a fraction of the running spot fleet at set times, random ones hit each spot
instance at its type's rate (``SimWorld.interrupt_rate``: the Spot Instance
Advisor's, or ``interrupt_rate_per_hour``); AWS takes an interrupted instance
back at the notice's action time.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mark.catalog import Market
from mark.ports import InstanceState, InterruptionNotice, NoticeKind
from mark.sim.world import SimWorld

OnStep = Callable[[float], Awaitable[None]]
OnSlo = Callable[[float, NDArray[np.float64], NDArray[np.int8]], Awaitable[None]]
"""now, and the latencies and where (``engine.INSTANCE``, ``LAMBDA``…) of the requests
dispatched since the last call."""
OnInterruption = Callable[[InterruptionNotice], Awaitable[None]]

PROGRESS_EVERY_S = 600.0  # of simulated time


@dataclass(frozen=True)
class PolicyEvents:
    """What a policy driver does at the world's events."""

    step_s: float
    on_step: OnStep
    on_slo: OnSlo | None = None
    on_interruption: OnInterruption | None = None


def interruption_rng(seed: int, t0: float) -> np.random.Generator:
    """The spot market's draws for one run: the seed and the window's start, so two
    windows of one seed meet independent interruptions, not one stream replayed."""
    return np.random.default_rng([seed + 1, int(t0)])


class SpotInterruptions:
    """The spot market's interruptions in one run and the reclaims that follow them."""

    def __init__(self, world: SimWorld, on_interruption: OnInterruption | None) -> None:
        self._world = world
        self._on_interruption = on_interruption
        self._rng = interruption_rng(world.cfg.seed, world.t0)
        self._reclaims: dict[str, float] = {}  # instance → when AWS takes it back
        planned = world.cfg.interruptions
        self._planned = sorted(world.t0 + dt for dt, _ in planned)
        self._fractions = {world.t0 + dt: f for dt, f in planned}

    def next_event(self) -> float | None:
        """The next reclaim or planned interruption, if any."""
        times = list(self._reclaims.values()) + self._planned[:1]
        return min(times) if times else None

    async def reclaim_due(self, t: float) -> None:
        for iid, at in list(self._reclaims.items()):
            if at <= t:
                del self._reclaims[iid]
                await self._world.fleet.terminate([iid])  # AWS takes the instance back

    async def planned_due(self, t: float) -> None:
        if self._planned and t >= self._planned[0]:
            at = self._planned.pop(0)
            await self._interrupt_fraction(self._fractions[at])

    async def random(self, step_s: float) -> None:
        """Each running spot instance is interrupted within ``step_s`` at its type's rate
        (``SimWorld.interrupt_rate``)."""
        for inst in await self._world.fleet.list():
            if (
                inst.market is not Market.SPOT
                or inst.state is not InstanceState.RUNNING
                or inst.instance_id in self._reclaims
            ):
                continue
            rate = self._world.interrupt_rate(inst.instance_type)
            if rate > 0 and self._rng.random() < 1.0 - math.exp(-rate * step_s / 3600.0):
                await self._interrupt(inst.instance_id)

    async def _interrupt_fraction(self, fraction: float) -> None:
        spot = [
            i
            for i in await self._world.fleet.list()
            if i.market is Market.SPOT
            and i.state is InstanceState.RUNNING
            and i.instance_id not in self._reclaims
        ]
        k = round(fraction * len(spot))
        chosen: list[int] = (
            [int(x) for x in self._rng.choice(len(spot), size=k, replace=False)] if k else []
        )
        for j in sorted(chosen):
            await self._interrupt(spot[j].instance_id)

    async def _interrupt(self, iid: str) -> None:
        world = self._world
        notice = world.fleet.interrupt(iid, NoticeKind.INTERRUPTION)
        at = notice.action_at if notice.action_at is not None else world.clock.t + 120
        self._reclaims[iid] = at
        world.interruptions += 1
        if self._on_interruption is not None:
            await self._on_interruption(notice)


async def run_loop(world: SimWorld, events: PolicyEvents) -> None:
    """Run the world from ``t_begin`` to ``t_end``, calling the policy at its events."""
    cfg, engine = world.cfg, world.engine
    spot = SpotInterruptions(world, events.on_interruption)
    t = world.clock.t = world.t_begin
    next_step = t
    next_slo = t + cfg.slo_check_s
    slo_from = 0
    measured = False
    span = world.t_end - world.t_begin
    last_progress = t
    while t < world.t_end:
        candidates = [next_step, world.t_end]
        if events.on_slo is not None:
            candidates.append(next_slo)
        if not measured:
            candidates.append(world.t0)
        for at in (world.fleet.next_ready_after(t), spot.next_event()):
            if at is not None:
                candidates.append(at)
        t_next = max(t, min(candidates))
        engine.serve_until(t_next)
        t = world.clock.t = t_next
        if not measured and t >= world.t0:
            measured = True
            world.start_measuring()
        await spot.reclaim_due(t)
        if events.on_slo is not None and t >= next_slo:
            lat = engine.latencies_since(slo_from)
            where = engine.where[slo_from : engine.i]
            slo_from = engine.i
            await events.on_slo(t, lat, where)
            next_slo = t + cfg.slo_check_s
        await spot.planned_due(t)
        if t >= next_step:
            await world.sync()
            await spot.random(events.step_s)
            await events.on_step(t)
            await world.record_fleet(t)
            next_step = t + events.step_s
        await world.sync()
        if world.progress is not None and t - last_progress >= PROGRESS_EVERY_S:
            world.progress((t - world.t_begin) / span)
            last_progress = t
    engine.serve_until(world.t_end)
    world.fleet.close_runs(world.t_end)
    if world.progress is not None:
        world.progress(1.0)
