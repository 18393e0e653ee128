"""Draining through the store (issue #49 item 3): the leader marks an instance retiring
before it ends it, every frontend's agent sync withholds new batches from what is marked,
and the leader waits until the other live frontends have read the mark, at most one sync
plus a grace. On real SQLite and PostgreSQL; the leader's clock is manual (its waits
advance it), the other frontend's agents are real HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bouncer.latency import BatchLatency
from bouncer.wire import (
    BATCH_PATH,
    NDJSON_TYPE,
    batch_size,
    decode_batch,
    encode_outputs,
    encode_verdict,
)
from mark.agent_sync import AGENT_STATES_FROM, read_marks
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.control.reconcile import Reconciler
from mark.control.recorder import Recorder
from mark.control.retiring import POLL_S, RETIRING, StoreRetiring, drain_wait, marks
from mark.control.vanished import VANISHED_AFTER_S, end_vanished
from mark.errors import CloudError
from mark.ports import LaunchRequest
from mark.serve.dispatcher import Backend, Dispatcher, Dispatchers
from mark.sim.fleet import SimFleet
from mark.state import FrontendRecord, InstanceRecord, SqlStore, open_store
from mark.state.frontend_store import LIVE_S

T0 = 1_700_000_000.0
SYNC_S = 1.0


# -- the decision ----------------------------------------------------------------------


def test_the_leader_goes_once_every_other_frontend_read_the_mark() -> None:
    assert drain_wait(100.0, [], 100.0, 2.0) == 0.0  # no other frontend: at once
    assert drain_wait(100.0, [100.0, 100.7], 100.8, 2.0) == 0.0  # both read it since
    assert drain_wait(100.0, [100.7, 99.9], 100.8, 2.0) == pytest.approx(1.2)  # one has not


def test_a_frontend_that_never_synced_or_an_unread_store_waits_out_the_bound() -> None:
    assert drain_wait(100.0, [None], 101.0, 2.0) == pytest.approx(1.0)
    assert drain_wait(100.0, None, 101.5, 2.0) == pytest.approx(0.5)
    assert drain_wait(100.0, [None], 102.0, 2.0) == 0.0
    assert drain_wait(100.0, None, 150.0, 2.0) == 0.0


def test_marks_split_what_a_sync_reads() -> None:
    recs = [_rec("i-1", RETIRING), _rec("i-2", "ready"), _rec("i-3", "draining")]
    assert marks(recs) == (frozenset({"i-1"}), frozenset({"i-2", "i-3"}))


# -- the world: another frontend's agents, the leader's clock ---------------------------


class _Agent:
    """An agent on loopback admitting every batch; it answers once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.got = asyncio.Event()
        self.batches = 0
        self.server: TestServer | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post(BATCH_PATH, self._batch)
        self.server = TestServer(app)
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")

    async def _batch(self, request: web.Request) -> web.StreamResponse:
        rows, _ = decode_batch(await request.read())
        n = batch_size(rows)
        self.batches += 1
        resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE})
        await resp.prepare(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 0.01))
        self.got.set()
        await asyncio.wait_for(self.release.wait(), 30)
        await resp.write(encode_outputs([[7.0]] * n))
        await resp.write_eof()
        return resp


class _Frontend:
    """Frontend "b": one model's dispatcher over two agents, its agent sync's read of the
    marks and its beat."""

    def __init__(self, store: SqlStore, clock: ManualClock, session: aiohttp.ClientSession) -> None:
        self.store, self.clock = store, clock
        self.dispatcher = Dispatcher("m", 1.0, "float32", time.time, session, None)
        self.agents: dict[str, _Agent] = {}
        self.urls: dict[str, str] = {}

    async def start(self, ids: Sequence[str]) -> None:
        for iid in ids:
            self.agents[iid] = _Agent()
            self.urls[iid] = await self.agents[iid].start()
        self.dispatcher.start()

    def serve(self, ids: Sequence[str]) -> None:
        lat = BatchLatency.from_mapping({1: 0.002, 8: 0.004})
        self.dispatcher.set_backends([Backend(i, "c5.large", self.urls[i], lat) for i in ids])

    async def sync(self) -> None:
        """Its agent sync's read of the marks, then its beat."""
        read = await read_marks(self.store, [self.dispatcher], self.clock.now)
        await self.beat(read)

    async def beat(self, synced_at: float | None) -> None:
        now = self.clock.now()
        await self.store.beat(FrontendRecord("b", "http://b", T0 - 60, now, synced_at))

    async def served_by(self, seed: int) -> str:
        rows = np.random.default_rng(seed).random((1, 2), dtype=np.float32)
        (out,) = await self.dispatcher.submit(rows)
        assert out.ok, out.error
        return out.served_by

    async def close(self) -> None:
        await self.dispatcher.close()
        for a in self.agents.values():
            a.release.set()
            if a.server is not None:
                await a.server.close()


class _Clock(ManualClock):
    """The leader's clock: each sleep advances it, then lets the other frontend act."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.meanwhile: list[Callable[[], Awaitable[None]]] = []

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        if self.meanwhile:
            await self.meanwhile.pop(0)()


class _Fleet(SimFleet):
    """Notes each instance's stored state when it is terminated; refuses if told to."""

    def __init__(self, clock: ManualClock, store: SqlStore, refuse: bool = False) -> None:
        super().__init__(load_catalog(), clock.now)
        self.store, self.refuse = store, refuse
        self.states_at_terminate: dict[str, str] = {}

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        recs = {r.instance_id: r.state for r in await self.store.instances()}
        self.states_at_terminate.update((i, recs[i]) for i in instance_ids)
        if self.refuse:
            raise CloudError("UnauthorizedOperation: not today")
        await super().terminate(instance_ids)


def _rec(iid: str, state: str, launched_at: float = T0) -> InstanceRecord:
    return InstanceRecord(iid, "m", "c5.large", "on-demand", "serving", state, 0.1, launched_at, T0)


@asynccontextmanager
async def _cluster(
    db_url: str, *, refuse: bool = False
) -> AsyncIterator[tuple[SqlStore, _Clock, _Fleet, list[str], _Frontend]]:
    """Two ready instances in the leader's fleet and the store, and frontend "b" serving
    them, its last sync before now."""
    store = await open_store(db_url, upgrade=True)
    clock = _Clock(T0)
    fleet = _Fleet(clock, store, refuse)
    got = await fleet.launch(LaunchRequest("m", "c5.large", Market.ON_DEMAND, 2))
    ids = [i.instance_id for i in got]
    for iid in ids:
        await store.upsert_instance(_rec(iid, "ready"))
    async with aiohttp.ClientSession() as session:
        b = _Frontend(store, clock, session)
        try:
            await b.start(ids)
            b.serve(ids)
            await b.beat(T0 - 1)
            yield store, clock, fleet, ids, b
        finally:
            await b.close()
            await store.close()


def _leader(store: SqlStore, clock: ManualClock, own: Sequence[Dispatcher] = ()) -> Dispatchers:
    """Frontend "a", the leader: its own dispatchers, the others told through the store."""
    return Dispatchers(list(own), StoreRetiring(store, clock, SYNC_S, me="a"))


# -- the leader and another frontend ---------------------------------------------------


async def test_the_leader_marks_first_and_ends_once_the_other_frontend_read_it(
    db_url: str,
) -> None:
    """The instance is ``retiring`` in the store when it is terminated; frontend b's sync
    sends it no new batch while the batch already on it finishes; the leader's wait ends
    at b's first beat past the mark, before the bound."""
    async with _cluster(db_url) as (store, clock, fleet, (i1, i2), b):
        b.serve([i1])
        b.agents[i1].release.clear()
        first = asyncio.create_task(b.served_by(0))
        await b.agents[i1].got.wait()  # a batch in flight on i1
        b.serve([i1, i2])
        after: list[str] = []

        async def b_syncs() -> None:
            await b.sync()
            after.extend([await b.served_by(k) for k in range(1, 6)])
            b.agents[i1].release.set()
            assert await first == i1  # the batch in flight was not cut off

        clock.meanwhile.append(b_syncs)
        reconciler = Reconciler(fleet, 60.0, draining=_leader(store, clock))
        assert await reconciler.terminate([i1]) is None
        assert fleet.states_at_terminate == {i1: RETIRING}
        assert clock.now() - T0 == POLL_S < SYNC_S + 1.0  # b's beat, not the bound
        assert after == [i2] * 5 and b.agents[i1].batches == 1
        # An agent's report never takes the mark away.
        await store.set_instance_state(i1, "ready", clock.now(), only_from=AGENT_STATES_FROM)
        assert [r.state for r in await store.instances(states=[RETIRING])] == [RETIRING]


async def test_the_wait_ends_at_the_bound_when_a_live_frontend_stops_syncing(
    db_url: str,
) -> None:
    """b beat recently but syncs no more: the leader waits one sync plus the grace (its
    dispatchers' longest), then ends the instance. A frontend gone longer than ``LIVE_S``
    holds nothing."""
    async with _cluster(db_url) as (store, clock, fleet, (i1, i2), b):
        own = Dispatcher("m", 3.0, "float32", time.time, b.dispatcher.session, None)
        reconciler = Reconciler(fleet, 60.0, draining=_leader(store, clock, [own]))
        assert await reconciler.terminate([i1]) is None
        assert clock.now() - T0 == pytest.approx(SYNC_S + 3.0)
        assert own.retiring == {i1}
        clock.advance(LIVE_S + 1)  # b is dead now
        began = clock.now()
        assert await reconciler.terminate([i2]) is None
        assert clock.now() == began
        assert fleet.states_at_terminate == {i1: RETIRING, i2: RETIRING}


async def test_a_refused_termination_clears_the_mark_and_b_sends_to_it_again(
    db_url: str,
) -> None:
    async with _cluster(db_url, refuse=True) as (store, clock, fleet, (i1, i2), b):
        await store.set_instance_state(i1, "draining", T0)  # its agent missed a probe
        clock.meanwhile.append(b.sync)
        b.serve([i1])
        own = Dispatcher("m", 1.0, "float32", time.time, b.dispatcher.session, None)
        reconciler = Reconciler(fleet, 60.0, draining=_leader(store, clock, [own]))
        error = await reconciler.terminate([i1])
        assert error is not None and "not today" in error
        assert fleet.states_at_terminate == {i1: RETIRING}
        assert b.dispatcher.retiring == {i1}  # b read the mark while the leader waited
        # Back to the state it had, on the leader and, at b's next sync, on b.
        assert {r.instance_id: r.state for r in await store.instances()} == {
            i1: "draining",
            i2: "ready",
        }
        events = [e.state for e in await store.instance_events(i1)]
        assert events[-2:] == [RETIRING, "draining"]
        assert own.retiring == set()
        await b.sync()
        assert b.dispatcher.retiring == set()
        assert await b.served_by(1) == i1


async def test_a_sync_that_cannot_read_the_store_keeps_the_marks_it_read(db_url: str) -> None:
    async with _cluster(db_url) as (store, clock, _, (i1, i2), b):
        await store.set_instance_state(i1, RETIRING, T0)
        await b.sync()
        assert b.dispatcher.retiring == {i1}

        class _Down:
            async def instances(self, **_: Any) -> list[InstanceRecord]:
                raise OSError("connection refused")

        assert await read_marks(_Down(), [b.dispatcher], clock.now) is None  # type: ignore[arg-type]
        assert b.dispatcher.retiring == {i1}
        assert await b.served_by(1) == i2


async def test_a_retiring_record_the_cloud_no_longer_lists_is_ended(db_url: str) -> None:
    """The leader died between its mark and its terminate: the next controller's sweep of
    records the cloud no longer lists ends it, as any live record."""
    store = await open_store(db_url, upgrade=True)
    try:
        await store.upsert_instance(_rec("i-gone", RETIRING, launched_at=T0 - 3600))
        now = T0 + VANISHED_AFTER_S
        gone = await end_vanished(store, Recorder(store, load_catalog()), [], now)
        assert gone == ["i-gone"]
        assert [r.state for r in await store.instances()] == ["terminated"]
        assert [e.instance_id for e in await store.ledger()] == ["i-gone"]  # its run billed
    finally:
        await store.close()
