"""A simulated EC2 fleet behind the ``Fleet`` port, on any clock.

Instances are pending for their type's boot delay, then running; stop/start
and terminate take effect at once; spot interruptions are injected with
``interrupt`` and delivered through ``interruptions()`` like the aws world's
notices. Used by the simulator and by tests of the control loop.
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
class SimFleet:
    catalog: Catalog
    clock: Callable[[], float]
    boot_delay_s: Callable[[str], float] = lambda _t: 60.0
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)  # limit per offering
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
            )
            self._instances[iid] = inst
            self._ready_at[iid] = now + self.boot_delay_s(request.instance_type)
            out.append(inst)
        self._refresh()
        return [self._instances[i.instance_id] for i in out]

    def _owned(self, ids: Sequence[str]) -> None:
        for iid in ids:
            if iid not in self._instances:
                raise NotOwned(f"{iid} is not an instance of this fleet")

    def _set(self, ids: Sequence[str], state: InstanceState) -> None:
        self._owned(ids)
        for iid in ids:
            self._instances[iid] = replace(self._instances[iid], state=state)

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        self._set(instance_ids, InstanceState.TERMINATED)

    async def stop(self, instance_ids: Sequence[str]) -> None:
        self._set(instance_ids, InstanceState.STOPPED)

    async def start(self, instance_ids: Sequence[str]) -> None:
        self._owned(instance_ids)
        now = self.clock()
        for iid in instance_ids:
            inst = self._instances[iid]
            self._instances[iid] = replace(inst, state=InstanceState.PENDING, launched_at=now)
            self._ready_at[iid] = now + self.boot_delay_s(inst.instance_type) / 4
        self._refresh()

    async def list(self) -> list[InstanceInfo]:
        self._refresh()
        return [i for i in self._instances.values() if i.state is not InstanceState.TERMINATED]

    def interrupt(self, instance_id: str, kind: NoticeKind = NoticeKind.INTERRUPTION) -> None:
        """Inject a spot interruption notice (reclaimed ``SPOT_NOTICE_S`` later)."""
        self._owned([instance_id])
        if self._instances[instance_id].market is not Market.SPOT:
            raise ValueError(f"{instance_id} is not a spot instance")
        now = self.clock()
        self._notices.put_nowait(InterruptionNotice(instance_id, kind, now, now + SPOT_NOTICE_S))

    async def interruptions(self) -> AsyncIterator[InterruptionNotice]:
        while True:
            yield await self._notices.get()

    async def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        return {t: self.catalog.spot[t] for t in instance_types if t in self.catalog.spot}
