"""A termination drains the request path first, and undoes it when the cloud refuses."""

from __future__ import annotations

from collections.abc import Sequence

from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.control.reconcile import Reconciler
from mark.errors import CloudError
from mark.ports import LaunchRequest
from mark.sim.fleet import SimFleet


class _Refusing(SimFleet):
    async def terminate(self, instance_ids: Sequence[str]) -> None:
        raise CloudError("UnauthorizedOperation: not today")


class _Told:
    def __init__(self) -> None:
        self.events: list[tuple[str, list[str]]] = []

    async def retire(self, instance_ids: Sequence[str]) -> None:
        self.events.append(("retire", sorted(instance_ids)))

    async def keep(self, instance_ids: Sequence[str]) -> None:
        self.events.append(("keep", sorted(instance_ids)))


async def _one(fleet: SimFleet) -> str:
    (got,) = await fleet.launch(LaunchRequest("m", "c5.large", Market.ON_DEMAND, 1))
    return got.instance_id


async def test_a_refused_termination_serves_the_instance_again() -> None:
    fleet = _Refusing(load_catalog(), ManualClock(0.0).now)
    iid = await _one(fleet)
    told = _Told()
    error = await Reconciler(fleet, 60.0, draining=told).terminate([iid])
    assert error is not None and "not today" in error
    assert told.events == [("retire", [iid]), ("keep", [iid])]


async def test_a_termination_is_drained_once_and_not_undone() -> None:
    fleet = SimFleet(load_catalog(), ManualClock(0.0).now)
    iid = await _one(fleet)
    told = _Told()
    assert await Reconciler(fleet, 60.0, draining=told).terminate([iid]) is None
    assert told.events == [("retire", [iid])]
