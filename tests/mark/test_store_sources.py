"""Telemetry from several frontends sharing one database (a real SQLite file and a real
PostgreSQL database): each writes its own rows, reads sum them, and two processes
writing the same new window at once both land."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from mark.report.collect import read_store
from mark.serve.telemetry import Telemetry
from mark.state import ArrivalWindow, LatencyRollup, SqlStore, migrate, open_store
from mark.state.store import make_engine


def _rollup(minute: float, source: str, **kw: object) -> LatencyRollup:
    base: dict[str, object] = dict(
        model="digits",
        minute_start=minute,
        requests=100,
        p50_ms=10.0,
        p95_ms=40.0,
        p99_ms=90.0,
        slo_hits=97,
        slo_misses=3,
        spilled=2,
        errors=1,
        http_requests=10,
        source=source,
    )
    base.update(kw)
    return LatencyRollup(**base)  # type: ignore[arg-type]


async def test_reads_sum_the_frontends_windows_and_minutes(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        await store.add_arrivals(
            [ArrivalWindow("digits", 60.0 + 5 * k, 5.0, k, "a") for k in range(4)]
        )
        await store.add_arrivals(
            [ArrivalWindow("digits", 65.0 + 5 * k, 5.0, 10, "b") for k in range(4)]
        )
        await store.add_arrivals([ArrivalWindow("other", 65.0, 5.0, 1000, "b")])
        got = await store.arrivals("digits", 60.0, 80.0)
        assert [(w.window_start, w.count) for w in got] == [(60, 0), (65, 11), (70, 12), (75, 13)]
        assert {w.source for w in got} == {""} and {w.window_s for w in got} == {5.0}

        await store.add_latency_rollup(_rollup(60.0, "a"))
        await store.add_latency_rollup(
            _rollup(
                60.0,
                "b",
                requests=50,
                p50_ms=30.0,
                p95_ms=35.0,
                p99_ms=200.0,
                slo_hits=40,
                slo_misses=10,
                spilled=0,
                errors=4,
                http_requests=None,
            )
        )
        await store.add_latency_rollup(_rollup(120.0, "b", http_requests=None))
        first, second = await store.latency_rollups("digits", 0.0, 1e9)
        assert first == LatencyRollup(
            "digits", 60.0, 150, 30.0, 40.0, 200.0, 137, 13, 2, 5, http_requests=10
        )
        assert second.http_requests is None  # no frontend counted them
        assert (second.requests, second.p99_ms, second.source) == (100, 90.0, "")
    finally:
        await store.close()


async def test_a_frontend_rewriting_its_window_replaces_only_its_own_count(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        await store.add_arrivals([ArrivalWindow("digits", 60.0, 5.0, 7, "a")])
        await store.add_arrivals([ArrivalWindow("digits", 60.0, 5.0, 5, "b")])
        await store.add_arrivals([ArrivalWindow("digits", 60.0, 5.0, 9, "a")])  # re-recorded
        (w,) = await store.arrivals("digits", 0.0, 1e9)
        assert w.count == 9 + 5
        # Twice in one batch: the last one stands.
        await store.add_arrivals(
            [ArrivalWindow("digits", 60.0, 5.0, 1, "b"), ArrivalWindow("digits", 60.0, 5.0, 2, "b")]
        )
        (w,) = await store.arrivals("digits", 0.0, 1e9)
        assert w.count == 9 + 2

        await store.add_latency_rollup(_rollup(60.0, "a"))
        await store.add_latency_rollup(_rollup(60.0, "b"))
        await store.add_latency_rollup(_rollup(60.0, "a", requests=1, p99_ms=500.0))
        (r,) = await store.latency_rollups("digits", 0.0, 1e9)
        assert (r.requests, r.p99_ms) == (101, 500.0)
    finally:
        await store.close()


async def test_frontends_telemetry_drained_into_one_store_reads_as_the_clusters(
    db_url: str,
) -> None:
    """Each frontend's ``Telemetry`` stamps its id on what it drains; the store's readers
    (the planner's history, the report) see the two frontends' load together."""
    fronts = [Telemetry("digits", 100.0, started_at=0.0, source=f"fe-{i}") for i in range(2)]
    for i, tel in enumerate(fronts):
        for t in range(60):
            tel.arrival(float(t), n=i + 1)
            tel.outcome(float(t), 0.010 * (i + 1), ok=True, spilled=False)
    store = await open_store(db_url, upgrade=True)
    try:
        for tel in fronts:
            windows, rollups = tel.drain(60.0)
            assert {w.source for w in windows} == {r.source for r in rollups} == {tel.source}
            await store.add_arrivals(windows)
            for r in rollups:
                await store.add_latency_rollup(r)
        got = await store.arrivals("digits", 0.0, 60.0)
        assert len(got) == 12 and {w.count for w in got} == {5 * 1 + 5 * 2}
        (minute,) = await store.latency_rollups("digits", 0.0, 60.0)
        assert (minute.requests, minute.http_requests, minute.slo_hits) == (120, 120, 120)
        assert minute.p50_ms == pytest.approx(20.0)  # the slower frontend's
        data = await read_store(store, since=0.0, until=60.0, arrival_models=["digits"])
        assert sum(w.count for w in data.arrivals["digits"]) == 60 * 3
    finally:
        await store.close()


async def _two_stores(db_url: str) -> tuple[SqlStore, SqlStore]:
    first = await open_store(db_url, upgrade=True)
    return first, await open_store(db_url)  # an engine of its own, as another process


async def test_two_processes_writing_the_same_new_window_both_land(db_url: str) -> None:
    """The same frontend id in two processes (or a flush retried beside a fresh one) writes
    the same new keys at once: no integrity error, one row per key."""
    one, two = await _two_stores(db_url)
    try:
        for round_ in range(5):
            start = 1000.0 * round_
            windows = [ArrivalWindow("digits", start + 5 * k, 5.0, 3, "fe") for k in range(50)]
            await asyncio.gather(
                one.add_arrivals(windows),
                two.add_arrivals(windows),
                one.add_latency_rollup(_rollup(start, "fe")),
                two.add_latency_rollup(_rollup(start, "fe")),
            )
        got = await one.arrivals("digits", 0.0, 1e9)
        assert len(got) == 5 * 50 and {w.count for w in got} == {3}
        rollups = await two.latency_rollups("digits", 0.0, 1e9)
        assert [r.requests for r in rollups] == [100] * 5
    finally:
        await one.close()
        await two.close()


async def test_two_frontends_writing_at_once_are_summed(db_url: str) -> None:
    one, two = await _two_stores(db_url)
    try:
        await asyncio.gather(
            one.add_arrivals([ArrivalWindow("digits", 5.0 * k, 5.0, 4, "a") for k in range(50)]),
            two.add_arrivals([ArrivalWindow("digits", 5.0 * k, 5.0, 4, "b") for k in range(50)]),
        )
        got = await one.arrivals("digits", 0.0, 1e9)
        assert len(got) == 50 and {w.count for w in got} == {8}
    finally:
        await one.close()
        await two.close()


async def _unique_keys(engine_url: str, table: str) -> list[list[str]]:
    engine = make_engine(engine_url)
    try:
        async with engine.connect() as conn:
            found = await conn.run_sync(lambda c: inspect(c).get_unique_constraints(table))
    finally:
        await engine.dispose()
    return [list(u["column_names"]) for u in found]


async def test_migration_0006_keeps_the_rows_before_it_and_goes_back_down(db_url: str) -> None:
    """Rows written at 0005 read back as one unnamed frontend's, beside which a named one
    writes its own; going down to 0005 merges the frontends' rows of each window into one
    (summed, the quantiles the largest), as the old key has room for, on both backends."""
    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine, "0005")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO arrivals (model, window_start, window_s, count)"
                    " VALUES ('digits', 60.0, 5.0, 7), ('digits', 65.0, 5.0, 8)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO latency_rollups (model, minute_start, requests, p50_ms, p95_ms,"
                    " p99_ms, slo_hits, slo_misses, spilled, errors, http_requests)"
                    " VALUES ('digits', 60.0, 100, 10, 40, 90, 97, 3, 2, 1, NULL)"
                )
            )
        await migrate.upgrade(engine)  # through 0006 to the head
        assert await migrate.current_revision(engine) == migrate.head_revision()
        assert await _unique_keys(db_url, "arrivals") == [["model", "window_start", "source"]]
        assert await _unique_keys(db_url, "latency_rollups") == [
            ["model", "minute_start", "source"]
        ]

        store = await open_store(db_url)
        try:
            old = await store.arrivals("digits", 0.0, 1e9)
            assert [(w.window_start, w.count) for w in old] == [(60.0, 7), (65.0, 8)]
            await store.add_arrivals([ArrivalWindow("digits", 60.0, 5.0, 5, "fe-1")])
            await store.add_arrivals([ArrivalWindow("digits", 60.0, 5.0, 6)])  # "" re-written
            await store.add_latency_rollup(_rollup(60.0, "fe-1", p99_ms=120.0, http_requests=4))
            assert [w.count for w in await store.arrivals("digits", 0.0, 1e9)] == [11, 8]
            (r,) = await store.latency_rollups("digits", 0.0, 1e9)
            assert (r.requests, r.p99_ms, r.http_requests) == (200, 120.0, 4)
        finally:
            await store.close()

        await migrate.downgrade(engine, "0005")
        async with engine.connect() as conn:
            arrivals = (
                await conn.execute(
                    text("SELECT window_start, count FROM arrivals ORDER BY window_start")
                )
            ).all()
            rollups = (
                await conn.execute(
                    text("SELECT requests, p99_ms, slo_hits, http_requests FROM latency_rollups")
                )
            ).all()
            cols = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("arrivals")}
            )
        assert [tuple(a) for a in arrivals] == [(60.0, 11), (65.0, 8)]
        assert [tuple(r) for r in rollups] == [(200, 120.0, 194, 4)]
        assert "source" not in cols
        assert await _unique_keys(db_url, "arrivals") == [["model", "window_start"]]
        with pytest.raises(IntegrityError):  # the old key holds again
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO arrivals (model, window_start, window_s, count)"
                        " VALUES ('digits', 60.0, 5.0, 1)"
                    )
                )
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_frontends_starting_together_on_a_new_database_all_open_it(pg_url: str) -> None:
    """N frontends of a new stack migrate the same empty database at once: one does,
    the others wait for its lock and find it done; none fails."""
    stores = await asyncio.gather(*(open_store(pg_url, upgrade=True) for _ in range(3)))
    try:
        for store in stores:
            await store.add_arrivals([ArrivalWindow("m", 0.0, 5.0, 1, "fe")])
        assert [w.count for w in await stores[0].arrivals("m", 0.0, 1.0)] == [1]
    finally:
        for store in stores:
            await store.close()
