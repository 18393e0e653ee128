"""A simulated EC2 fleet behind the ``Fleet`` port, on any clock.

Instances are pending for their type's boot delay, then running; stop/start
and terminate take effect at once; spot interruptions are injected with
``interrupt`` and delivered through ``interruptions()`` like the aws world's
notices. Used by the simulator and by tests of the control loop.

What EC2 would bill is recorded as it happens: ``runs`` (the instance, per
second) and ``stopped`` (only the EBS volume, while the instance is stopped).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from mark.catalog import Catalog, Market
from mark.errors import InsufficientCapacity, NotOwned
from mark.ports import (
    InstanceInfo,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
)

SPOT_NOTICE_S = 120.0


@dataclass
class Run:
    """One billed period of an instance: from launch or start to stop or terminate."""

    instance_id: str
    model: str
    instance_type: str
    market: str
    role: str
    start: float
    end: float | None = None


@dataclass
class Stopped:
    """One period an instance was stopped, from stop to start or terminate: EC2 bills
    its EBS volume then, though not the instance."""

    instance_id: str
    instance_type: str
    role: str
    start: float
    end: float | None = None


@dataclass
class SimFleet:
    catalog: Catalog
    clock: Callable[[], float]
    boot_delay_s: Callable[[str], float] = lambda _t: 60.0
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)  # limit per offering
    start_delay_s: Callable[[str], float] | None = None  # stopped → serving; default boot/4
    runs: list[Run] = field(default_factory=list)  # billed running periods, in start order
    stopped: list[Stopped] = field(default_factory=list)  # stopped periods, in stop order
    _open: dict[str, Run] = field(default_factory=dict)
    _open_stopped: dict[str, Stopped] = field(default_factory=dict)
    _instances: dict[str, InstanceInfo] = field(default_factory=dict)
    _ready_at: dict[str, float] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _notices: asyncio.Queue[InterruptionNotice] = field(default_factory=asyncio.Queue)

    def _refresh(self) -> None:
        now = self.clock()
        for iid, inst in self._instances.items():
            if inst.state is InstanceState.PENDING and now >= self._ready_at[iid]:
                self._instances[iid] = replace(inst, state=InstanceState.RUNNING)

    async def launch(self, request: LaunchRequest) -> list[InstanceInfo]:
        self.catalog.offering(request.instance_type, request.market)  # unknown → error
        key = (request.instance_type, request.market.value)
        if key in self.capacity:
            live = sum(
                1
                for i in self._instances.values()
                if (i.instance_type, i.market.value) == key
                and i.state is not InstanceState.TERMINATED
            )
            if live + request.count > self.capacity[key]:
                raise InsufficientCapacity(f"no capacity for {request.count} more {key}")
        now = self.clock()
        out = []
        for _ in range(request.count):
            iid = f"i-sim{next(self._ids):012d}"
            inst = InstanceInfo(
                iid,
                request.model,
                request.instance_type,
                request.market,
                InstanceState.PENDING,
                request.role,
                now,
                address=f"sim://{iid}",
                version=request.version,
            )
            self._instances[iid] = inst
            self._ready_at[iid] = now + self.boot_delay_s(request.instance_type)
            self._begin(inst, now)
            out.append(inst)
        self._refresh()
        return [self._instances[i.instance_id] for i in out]

    def _owned(self, ids: Sequence[str]) -> None:
        for iid in ids:
            if iid not in self._instances:
                raise NotOwned(f"{iid} is not an instance of this fleet")

    def _begin(self, inst: InstanceInfo, now: float) -> None:
        run = Run(
            inst.instance_id,
            inst.model,
            inst.instance_type,
            inst.market.value,
            inst.role.value,
            now,
        )
        self.runs.append(run)
        self._open[inst.instance_id] = run

    def _end(self, iid: str, now: float) -> None:
        """End the instance's open run or stopped period, whichever it has."""
        run = self._open.pop(iid, None)
        if run is not None:
            run.end = now
        period = self._open_stopped.pop(iid, None)
        if period is not None:
            period.end = now

    def _set(self, ids: Sequence[str], state: InstanceState) -> None:
        self._owned(ids)
        now = self.clock()
        for iid in ids:
            self._instances[iid] = replace(self._instances[iid], state=state)
            self._end(iid, now)

    def ready_at(self, instance_id: str) -> float:
        """When a launched or started instance begins serving."""
        return self._ready_at[instance_id]

    def next_ready_after(self, now: float) -> float | None:
        """The next moment a pending instance becomes ready (None if none is pending)."""
        times = [
            self._ready_at[iid]
            for iid, i in self._instances.items()
            if i.state is InstanceState.PENDING and self._ready_at[iid] > now
        ]
        return min(times, default=None)

    def close_runs(self, now: float) -> None:
        """End every open run and stopped period at ``now`` (the end of a simulation)."""
        for iid in [*self._open, *self._open_stopped]:
            self._end(iid, now)

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        self._set(instance_ids, InstanceState.TERMINATED)

    async def stop(self, instance_ids: Sequence[str]) -> None:
        self._owned(instance_ids)
        now = self.clock()
        for iid in instance_ids:
            if iid in self._open_stopped:
                continue  # already stopped: its period goes on
            inst = replace(self._instances[iid], state=InstanceState.STOPPED)
            self._instances[iid] = inst
            self._end(iid, now)
            period = Stopped(iid, inst.instance_type, inst.role.value, now)
            self.stopped.append(period)
            self._open_stopped[iid] = period

    async def start(self, instance_ids: Sequence[str]) -> None:
        self._owned(instance_ids)
        now = self.clock()
        for iid in instance_ids:
            inst = self._instances[iid]
            if inst.state is not InstanceState.STOPPED:
                continue  # starting a running instance is a no-op on EC2 too
            self._end(iid, now)  # the stopped period
            self._instances[iid] = replace(inst, state=InstanceState.PENDING, launched_at=now)
            delay = (
                self.start_delay_s(inst.instance_type)
                if self.start_delay_s is not None
                else self.boot_delay_s(inst.instance_type) / 4
            )
            self._ready_at[iid] = now + delay
            self._begin(self._instances[iid], now)
        self._refresh()

    async def list(self) -> list[InstanceInfo]:
        self._refresh()
        return [i for i in self._instances.values() if i.state is not InstanceState.TERMINATED]

    def interrupt(
        self, instance_id: str, kind: NoticeKind = NoticeKind.INTERRUPTION
    ) -> InterruptionNotice:
        """Inject a spot interruption notice (reclaimed ``SPOT_NOTICE_S`` later); it is
        delivered through ``interruptions()`` and returned."""
        self._owned([instance_id])
        if self._instances[instance_id].market is not Market.SPOT:
            raise ValueError(f"{instance_id} is not a spot instance")
        now = self.clock()
        notice = InterruptionNotice(instance_id, kind, now, now + SPOT_NOTICE_S)
        self._notices.put_nowait(notice)
        return notice

    async def interruptions(self) -> AsyncIterator[InterruptionNotice]:
        while True:
            yield await self._notices.get()

    async def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        return {t: self.catalog.spot[t] for t in instance_types if t in self.catalog.spot}
