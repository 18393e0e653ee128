"""The leader lease on a timer of its own (issue #49): renewed every third of its TTL
apart from the steps, so a long step cannot let it lapse; a follower takes it over
within the TTL and one renewal, adopting the state and planning at once; the holder id
is unique to the process. On real SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from mark.catalog import load_catalog
from mark.control import Controller
from mark.identity import frontend_id
from mark.sim.fleet import SimFleet
from mark.state import SqlStore, open_store
from tests.mark.test_control_durable import T0, _loaded, _setup


class TickClock:
    """A clock whose ``sleep`` returns only when the test ticks it, at the time it set:
    a timer loop then runs exactly one round per tick."""

    def __init__(self, start: float) -> None:
        self.t = start
        self._ticks: asyncio.Queue[None] = asyncio.Queue()
        self.sleeping = asyncio.Event()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        await self._ticks.get()
        self.sleeping.clear()

    async def tick(self, to: float) -> None:
        """Move to ``to``, let the sleeper run one round and wait until it sleeps again."""
        self.t = to
        self.sleeping.clear()
        await self._ticks.put(None)
        await self.sleeping.wait()


async def _started(ctl: Controller, clock: TickClock) -> asyncio.Task[None]:
    task = asyncio.create_task(ctl.hold_lease(clock))
    await clock.sleeping.wait()
    return task


async def test_a_follower_takes_the_lease_within_its_ttl_and_plans_at_once(
    db_url: str, tmp_path: Path
) -> None:
    settings, options = _setup(tmp_path)
    ttl = settings.control.lease_ttl_s
    assert ttl <= 15.0  # the default: a dead leader costs at most this long unplanned
    model = settings.models[0].name
    clock = TickClock(T0)
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 60.0)
    one = await _loaded(db_url, model, 2 * options[0].capacity_rps)
    two = await open_again(db_url)
    follower_task: asyncio.Task[None] | None = None
    try:
        leader = Controller(settings, fleet, one, {model: options}, holder="a", cluster="c")
        follower = Controller(settings, fleet, two, {model: options}, holder="b", cluster="c")
        await leader.adopt(clock.now())
        assert await follower.adopt(clock.now()) == []
        assert leader.leading(clock.now()) and not follower.leading(clock.now())
        follower_task = await _started(follower, clock)

        # The leader is alive: a renewal inside its TTL finds the lease held.
        await clock.tick(T0 + ttl / 3)
        assert not follower.leading(clock.now())
        assert await two.plans(model, limit=5) == []

        # The leader dies (renews nothing). One renewal after its TTL, the follower
        # leads, and has adopted the fleet and planned, without waiting for a step.
        await clock.tick(T0 + ttl + ttl / 3)
        assert follower.leading(clock.now())
        assert not leader.leading(clock.now())
        plans = await two.plans(model, limit=5)
        assert len(plans) == 1 and plans[0].at == clock.now()
        assert len(await fleet.list()) > 0  # it bought for the load
        assert await leader.step(clock.now()) == []  # the old leader plans nothing now
    finally:
        if follower_task is not None:
            follower_task.cancel()
        await one.close()
        await two.close()


async def test_the_lease_is_renewed_while_a_long_step_holds_the_controller(
    db_url: str, tmp_path: Path
) -> None:
    settings, options = _setup(tmp_path)
    ttl = settings.control.lease_ttl_s
    model = settings.models[0].name
    clock = TickClock(T0)
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 60.0)
    one = await _loaded(db_url, model, 2 * options[0].capacity_rps)
    two = await open_again(db_url)
    task: asyncio.Task[None] | None = None
    try:
        leader = Controller(settings, fleet, one, {model: options}, holder="a", cluster="c")
        other = Controller(settings, fleet, two, {model: options}, holder="b", cluster="c")
        await leader.adopt(clock.now())
        task = await _started(leader, clock)
        async with leader._lock:  # a step that takes far longer than the TTL
            for k in range(1, 10):
                await clock.tick(T0 + k * ttl / 3)
                assert await other.step(clock.now()) == []  # never lapses
        assert leader.leading(clock.now())
    finally:
        if task is not None:
            task.cancel()
        await one.close()
        await two.close()


async def open_again(url: str) -> SqlStore:
    """A second daemon's store: its own connections, the same database."""
    return await open_store(url)


def test_the_holder_id_is_unique_to_the_process() -> None:
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mark.identity import frontend_id; print(frontend_id())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert other and other != frontend_id()
    assert frontend_id() == frontend_id()  # and the same for the process's life
