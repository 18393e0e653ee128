"""The store through a database outage: bounded waits, bookkeeping buffered in order and
written when the database answers again, the buffer's bound. Against a private PostgreSQL
this test stops and starts, and a real SQLite file another connection locks."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.errors import StoreError
from mark.sim.fleet import SimFleet
from mark.state import (
    ArrivalWindow,
    Decision,
    LedgerEntry,
    Outbox,
    PlanRecord,
    SqlStore,
    StoreUnreachable,
    open_store,
)
from mark.state.outbox import unreachable
from tests.private_pg import PrivatePostgres, available, private_postgres

T0 = 1_700_000_000.0
pg_needed = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture
def pg() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        yield server


@pytest.fixture
async def pg_store(pg: PrivatePostgres) -> AsyncIterator[SqlStore]:
    store = await open_store(
        pg.url, upgrade=True, connect_timeout_s=2, statement_timeout_s=2, outbox=Outbox(retry_s=0)
    )
    try:
        yield store
    finally:
        await store.close()


def _windows(start: float, n: int) -> list[ArrivalWindow]:
    return [ArrivalWindow("m", start + 5.0 * k, 5.0, k + 1) for k in range(n)]


def _charge(start: float) -> LedgerEntry:
    return LedgerEntry("lambda", "m", start, start + 1, "lambda", 1e-5, 0.01, requests=3)


@pg_needed
async def test_writes_during_an_outage_are_kept_and_written_in_order_after(
    pg: PrivatePostgres, pg_store: SqlStore
) -> None:
    store = pg_store
    await store.add_arrivals(_windows(0.0, 2))
    await asyncio.to_thread(pg.stop)
    with pytest.raises(StoreUnreachable):
        await store.ping()
    # None of these raise: the daemon's telemetry flush and recorder go on.
    await store.add_arrivals(_windows(10.0, 3))
    await store.record_decision(Decision("m", 20.0, "store-unavailable", "out"))
    plan_id = await store.record_plan(
        PlanRecord("m", 21.0, "greedy", [1.0], 0.1, decisions=[Decision("m", 21.0, "keep", "k")])
    )
    await store.add_charges([_charge(22.0)])
    # Re-recording a window replaces its count: written in order, the later one wins.
    await store.add_arrivals([ArrivalWindow("m", 10.0, 5.0, 99)])
    assert plan_id == 0  # buffered: no id yet
    outbox = store.outbox
    assert outbox is not None and not outbox.available and outbox.outages == 1
    assert outbox.buffered_rows == 3 + 1 + 2 + 1 + 1
    assert "mark_store_available 0" in outbox.prometheus()
    with pytest.raises(Exception) as info:  # reads still go to the database
        await store.arrivals("m", 0.0, 100.0)
    assert unreachable(info.value)

    await asyncio.to_thread(pg.start)
    await store.ping()  # the store answers: what was kept is written first
    assert outbox.available and outbox.buffered_rows == 0 and not outbox.dropped
    got = {w.window_start: w.count for w in await store.arrivals("m", 0.0, 100.0)}
    assert got == {0.0: 1, 5.0: 2, 10.0: 99, 15.0: 2, 20.0: 3}
    assert [d.action for d in await store.decisions(0.0, 100.0)] == ["store-unavailable", "keep"]
    assert [p.at for p in await store.plans("m")] == [21.0]
    assert [e.start for e in await store.ledger()] == [22.0]
    assert "mark_store_available 1" in outbox.prometheus()


@pg_needed
async def test_a_full_buffer_drops_the_oldest_and_counts_them(
    pg: PrivatePostgres, pg_store: SqlStore
) -> None:
    store = pg_store
    assert store.outbox is not None
    store.outbox.max_rows = 4
    await asyncio.to_thread(pg.stop)
    await store.add_arrivals(_windows(0.0, 3))  # dropped once the charges come
    await store.add_charges([_charge(1.0)])
    await store.add_arrivals(_windows(100.0, 3))
    assert store.outbox.dropped == {"arrivals": 3}
    assert store.outbox.buffered_rows == 4
    assert 'mark_store_dropped_rows_total{kind="arrivals"} 3' in store.outbox.prometheus()
    await asyncio.to_thread(pg.start)
    assert await store.retry_pending() == 4
    assert [w.window_start for w in await store.arrivals("m", 0.0, 1000.0)] == [100, 105, 110]
    assert len(await store.ledger()) == 1


@pg_needed
async def test_a_buffered_write_the_store_refuses_is_dropped_not_retried_forever(
    pg: PrivatePostgres, pg_store: SqlStore
) -> None:
    store = pg_store
    assert store.outbox is not None
    await asyncio.to_thread(pg.stop)
    await store.set_instance_state("i-unknown", "ready", 1.0)  # no such instance
    await store.add_arrivals(_windows(0.0, 1))
    await asyncio.to_thread(pg.start)
    assert await store.retry_pending() == 1
    assert store.outbox.rejected == {"instances": 1} and store.outbox.buffered_rows == 0
    assert len(await store.arrivals("m", 0.0, 10.0)) == 1


@pg_needed
async def test_without_an_outbox_an_outage_raises_as_before(pg: PrivatePostgres) -> None:
    store = await open_store(pg.url, upgrade=True, connect_timeout_s=2, statement_timeout_s=2)
    try:
        await asyncio.to_thread(pg.stop)
        with pytest.raises(Exception) as info:
            await store.add_arrivals(_windows(0.0, 1))
        assert unreachable(info.value)
    finally:
        await store.close()


@pg_needed
async def test_a_statement_is_cut_at_the_statement_timeout(pg: PrivatePostgres) -> None:
    store = await open_store(pg.url, upgrade=True, statement_timeout_s=0.5)
    try:
        began = time.monotonic()
        with pytest.raises(DBAPIError, match="statement timeout") as info:
            async with store.engine.connect() as conn:
                await conn.execute(text("SELECT pg_sleep(30)"))
        assert unreachable(info.value)  # a write it cuts is kept for later
        assert time.monotonic() - began < 20  # far below the 30 s it asked for
    finally:
        await store.close()


async def test_connecting_to_a_server_that_never_answers_is_cut_at_the_connect_timeout() -> None:
    # A listener that accepts and never speaks: the database host is there but hung.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/none"
    began = time.monotonic()
    try:
        with pytest.raises(StoreUnreachable, match="cannot reach"):
            await open_store(url, connect_timeout_s=0.5)
    finally:
        server.close()
    assert time.monotonic() - began < 20  # bounded, not the OS's TCP patience


async def test_a_locked_sqlite_file_buffers_writes_until_the_lock_goes(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/mark.db"
    await (await open_store(url, upgrade=True)).close()
    store = await open_store(url, statement_timeout_s=0.2, outbox=Outbox(retry_s=0))
    other = sqlite3.connect(tmp_path / "mark.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another writer holds the file
        await store.add_arrivals(_windows(0.0, 2))  # waits out the busy timeout, then kept
        assert store.outbox is not None and store.outbox.buffered_rows == 2
        other.execute("COMMIT")
        assert await store.retry_pending() == 2
        assert len(await store.arrivals("m", 0.0, 100.0)) == 2
    finally:
        other.close()
        await store.close()


async def test_sqlite_errors_that_are_not_an_outage_still_raise(tmp_path: Path) -> None:
    store = await open_store(
        f"sqlite+aiosqlite:///{tmp_path}/mark.db", upgrade=True, outbox=Outbox(retry_s=0)
    )
    try:
        with pytest.raises(StoreError, match="unknown instance"):
            await store.set_instance_state("i-none", "ready", 1.0)
        assert store.outbox is not None and store.outbox.buffered_rows == 0
    finally:
        await store.close()


@pg_needed
async def test_the_controller_holds_the_fleet_while_the_store_is_out_and_then_plans(
    pg: PrivatePostgres, pg_store: SqlStore, tmp_path: Path
) -> None:
    settings = load_settings(
        overrides={"data_dir": str(tmp_path / "data"), "offerings": {"types": ["c5.large"]}}
    )
    model = settings.models[0].name
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(
        settings.models[0], load_catalog(), ["c5.large"], [Market.ON_DEMAND], lat, 60.0
    )
    rate = 3 * options[0].capacity_rps  # a load that needs instances
    await pg_store.add_arrivals(
        [ArrivalWindow(model, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
    )
    clock = ManualClock(T0)
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 60.0)
    ctl = Controller(settings, fleet, pg_store, {model: options}, holder="h", cluster="c")
    await asyncio.to_thread(pg.stop)
    assert await ctl.step(clock.now()) == []  # no plan on a history it cannot read
    assert await ctl.check_slo(clock.now(), {model: [math.inf] * 200}) == []  # no backups
    assert await fleet.list() == []
    await asyncio.to_thread(pg.start)
    clock.advance(60)
    (res,) = await ctl.step(clock.now())
    assert res.launched and res.plan_id
    actions = [d.action for d in await pg_store.decisions(T0 - 1, T0 + 3600)]
    assert actions[:2] == ["store-unavailable", "store-back"], actions
