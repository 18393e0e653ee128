"""The store against a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from mark.errors import StoreError
from mark.state import (
    ApiKeyRecord,
    ArrivalWindow,
    Decision,
    InstanceRecord,
    LatencyRollup,
    LedgerEntry,
    PlanRecord,
    ProfileRecord,
    migrate,
    open_store,
)
from mark.state.store import make_engine

TABLES = {
    "instances",
    "instance_events",
    "arrivals",
    "latency_rollups",
    "plans",
    "decisions",
    "ledger",
    "profiles",
    "api_keys",
    "alembic_version",
}


async def test_migration_from_empty_creates_every_table(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert await migrate.current_revision(engine) is None
        await migrate.upgrade(engine)
        assert await migrate.current_revision(engine) == migrate.head_revision()
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert names >= TABLES
        await migrate.downgrade(engine, "base")
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert names & (TABLES - {"alembic_version"}) == set()
    finally:
        await engine.dispose()


async def test_unmigrated_database_is_refused_with_advice(db_url: str) -> None:
    with pytest.raises(StoreError, match="mark db upgrade"):
        await open_store(db_url)


async def test_unreachable_database_is_a_store_error() -> None:
    url = "postgresql+asyncpg://postgres@127.0.0.1:1/none"
    with pytest.raises(StoreError, match="cannot"):
        await open_store(url, upgrade=True)


def _instance(iid: str, state: str, at: float, **kw: object) -> InstanceRecord:
    base: dict[str, object] = dict(
        instance_id=iid,
        model="digits",
        instance_type="c5.large",
        market="spot",
        role="serving",
        state=state,
        price_per_hour=0.0286,
        launched_at=100.0,
        updated_at=at,
    )
    base.update(kw)
    return InstanceRecord(**base)  # type: ignore[arg-type]


async def test_instance_state_transitions_are_kept_with_timestamps(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        await store.upsert_instance(_instance("i-1", "pending", 100.0), reason="planner")
        await store.set_instance_state("i-1", "running", 160.0, address="127.0.0.1:9001")
        await store.set_instance_state("i-1", "running", 170.0)  # not a transition
        await store.upsert_instance(_instance("i-2", "stopped", 120.0, role="standby"))
        await store.set_instance_state("i-1", "terminated", 400.0, reason="cool-down")

        events = await store.instance_events("i-1")
        assert [(e.state, e.at) for e in events] == [
            ("pending", 100.0),
            ("running", 160.0),
            ("terminated", 400.0),
        ]
        assert events[0].reason == "planner" and events[-1].reason == "cool-down"
        (i1,) = await store.instances(states=["terminated"])
        assert i1.address == "127.0.0.1:9001" and i1.updated_at == 400.0
        assert [i.instance_id for i in await store.instances(model="digits")] == ["i-1", "i-2"]
        with pytest.raises(StoreError, match="unknown instance"):
            await store.set_instance_state("i-404", "running", 1.0)
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["sql", "memory"])
async def test_a_transition_written_late_is_not_stamped_before_the_one_it_follows(
    db_url: str, kind: str
) -> None:
    """The agent prober records "ready" at 250.74; the control step that decided at
    250.71 to stop the standby writes its stop just after. The stop is what happened
    last: the report must not read a run reopened by "ready" after it."""
    from mark.report.aggregate import instance_runs
    from mark.sim.memstore import MemoryStore

    store = await open_store(db_url, upgrade=True) if kind == "sql" else MemoryStore()
    try:
        await store.upsert_instance(_instance("i-1", "pending", 246.5, role="standby"))
        await store.set_instance_state("i-1", "ready", 250.74, only_from=("pending",))
        await store.upsert_instance(_instance("i-1", "stopped", 250.71, role="standby"))
        await store.set_instance_state("i-1", "ready", 250.9, only_from=("pending",))  # refused
        events = await store.instance_events("i-1")
        assert [(e.state, e.at) for e in events] == [
            ("pending", 246.5),
            ("ready", 250.74),
            ("stopped", 250.74),
        ]
        (rec,) = await store.instances()
        assert rec.state == "stopped" and rec.updated_at == 250.74
        runs = instance_runs(rec, events)
        assert [(r.start, r.end) for r in runs] == [(rec.launched_at, 250.74)]
    finally:
        await store.close()


async def test_arrivals_and_latency_rollups_round_trip(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        windows = [ArrivalWindow("digits", 60.0 + 5 * k, 5.0, 10 * k) for k in range(12)]
        await store.add_arrivals(windows)
        await store.add_arrivals([ArrivalWindow("digits", 60.0, 5.0, 7)])  # re-recorded
        got = await store.arrivals("digits", 60.0, 90.0)
        assert [w.count for w in got] == [7, 10, 20, 30, 40, 50]
        assert got[2].rate == pytest.approx(4.0)
        assert await store.arrivals("other", 0.0, 1e9) == []
        with pytest.raises(StoreError):
            await store.add_arrivals([ArrivalWindow("digits", 0.0, 0.0, 1)])

        r = LatencyRollup("digits", 60.0, 100, 12.0, 40.0, 95.0, 97, 3, spilled=5, errors=1)
        await store.add_latency_rollup(r)
        await store.add_latency_rollup(LatencyRollup("digits", 60.0, 120, 12, 41, 96, 118, 2))
        (back,) = await store.latency_rollups("digits", 0.0, 1e9)
        assert (back.requests, back.slo_hits, back.slo_misses) == (120, 118, 2)
    finally:
        await store.close()


async def test_plans_keep_their_decisions_and_reasons(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        launch = Decision("digits", 60.0, "launch", "cheapest per request", "c5.large", "spot", 2)
        plan = PlanRecord(
            model="digits",
            at=60.0,
            planner="greedy",
            forecast=[10.0, 12.5, 9.0],
            horizon_cost=0.0143,
            explanation={"items": [{"offering": "c5.large/spot", "span": [0, 2]}]},
            decisions=[launch],
        )
        pid = await store.record_plan(plan)
        await store.record_plan(PlanRecord("digits", 120.0, "greedy", [1.0], 0.001))
        await store.record_decision(Decision("digits", 130.0, "backup", "SLO 0.91 < 0.98"))
        newest, older = await store.plans("digits", limit=5)
        assert newest.at == 120.0 and newest.decisions == []
        assert older.id == pid and list(older.forecast) == [10.0, 12.5, 9.0]
        assert older.decisions == [launch]
        assert older.explanation["items"][0]["offering"] == "c5.large/spot"
        actions = [d.action for d in await store.decisions(0.0, 1e9)]
        assert actions == ["launch", "backup"]
    finally:
        await store.close()


async def test_ledger_filters_by_time_and_model(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        entries = [
            LedgerEntry(
                "ec2",
                "digits",
                0.0,
                30.0,
                "on-demand",
                0.085,
                0.0014,
                "i-1",
                "c5.large",
                30.0,
                60.0,
            ),
            LedgerEntry(
                "lambda",
                "digits",
                50.0,
                51.0,
                "lambda",
                1.6667e-5,
                0.00002,
                requests=3,
                gb_seconds=0.75,
            ),
            LedgerEntry(
                "ec2",
                "other",
                100.0,
                200.0,
                "spot",
                0.0286,
                0.0008,
                "i-2",
                "c5.large",
                100.0,
                100.0,
            ),
        ]
        await store.add_charges(entries)
        assert await store.ledger() == entries
        assert await store.ledger(since=40.0, until=150.0) == entries[1:]
        assert await store.ledger(model="digits") == entries[:2]
    finally:
        await store.close()


def test_sql_store_satisfies_the_store_port() -> None:
    """Every method the port declares exists on the implementation."""
    from mark.ports import Store
    from mark.state import SqlStore

    members = [m for m in vars(Store) if not m.startswith("_")]
    assert members and all(callable(getattr(SqlStore, m, None)) for m in members)


async def test_profiles_per_model_type_and_source_newest_replaces(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        old = ProfileRecord("digits", "c5.large", "measured", ((1, 0.004), (8, 0.012)), 10.0, "cpu")
        await store.put_profile(old)
        await store.put_profile(ProfileRecord("digits", "c5.large", "shipped", ((1, 0.005),), 5.0))
        new = ProfileRecord("digits", "c5.large", "measured", ((1, 0.003), (8, 0.010)), 20.0, "cpu")
        await store.put_profile(new)
        await store.put_profile(ProfileRecord("other", "c5.large", "measured", ((1, 1.0),), 1.0))
        got = await store.profiles("digits")
        assert [(p.source, p.batch_latency_s, p.measured_at) for p in got] == [
            ("measured", ((1, 0.003), (8, 0.010)), 20.0),
            ("shipped", ((1, 0.005),), 5.0),
        ]
        assert got[0].device == "cpu" and got[1].device is None
    finally:
        await store.close()


async def test_api_keys_round_trip_revoke_and_only_their_hash_is_stored(db_url: str) -> None:
    from sqlalchemy import text

    store = await open_store(db_url, upgrade=True)
    try:
        a = ApiKeyRecord("a1b2c3", "client", ("inference",), "ab" * 32, 10.0)
        b = ApiKeyRecord(
            "d4e5f6", "ops", ("metrics", "admin"), "cd" * 32, 20.0, rate_rps=2.5, max_concurrency=4
        )
        await store.add_api_key(b)
        await store.add_api_key(a)
        assert await store.api_keys() == [a, b]  # oldest first
        with pytest.raises(StoreError, match="already in use"):
            await store.add_api_key(a)
        revoked = await store.revoke_api_key("a1b2c3", 30.0)
        assert revoked.revoked_at == 30.0 and not revoked.active
        again = await store.revoke_api_key("a1b2c3", 40.0)  # the first revocation stands
        assert again.revoked_at == 30.0
        assert await store.api_keys(active_only=True) == [b]
        assert [k.id for k in await store.api_keys()] == ["a1b2c3", "d4e5f6"]
        with pytest.raises(StoreError, match="unknown API key id 'nope'"):
            await store.revoke_api_key("nope", 1.0)
        async with store.engine.connect() as conn:
            cols = (await conn.execute(text("SELECT * FROM api_keys"))).keys()
        assert set(cols) == {
            "id",
            "name",
            "scopes",
            "hash",
            "created_at",
            "revoked_at",
            "rate_rps",
            "max_concurrency",
        }
    finally:
        await store.close()


async def test_the_api_keys_migration_goes_up_from_0002_and_back(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine, "0002")
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert "profiles" in names and "api_keys" not in names
        await migrate.upgrade(engine, "0003")
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert "api_keys" in names
        await migrate.downgrade(engine, "0002")
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert "api_keys" not in names and "profiles" in names
    finally:
        await engine.dispose()


def test_the_memory_store_satisfies_the_store_port() -> None:
    from mark.ports import Store
    from mark.sim.memstore import MemoryStore

    members = [m for m in vars(Store) if not m.startswith("_")]
    assert all(callable(getattr(MemoryStore, m, None)) for m in members)


async def test_the_memory_store_keeps_api_keys_as_the_sql_store_does() -> None:
    from mark.sim.memstore import MemoryStore

    store = MemoryStore()
    a = ApiKeyRecord("a", "x", ("inference",), "00" * 32, 1.0)
    await store.add_api_key(a)
    with pytest.raises(StoreError):
        await store.add_api_key(a)
    assert (await store.revoke_api_key("a", 2.0)).revoked_at == 2.0
    assert (await store.revoke_api_key("a", 3.0)).revoked_at == 2.0
    assert await store.api_keys(active_only=True) == [] and len(await store.api_keys()) == 1
    with pytest.raises(StoreError):
        await store.revoke_api_key("b", 1.0)


async def test_rollups_keep_http_requests_apart_from_rows_across_migration_0005(
    db_url: str,
) -> None:
    """A minute written before 0005 reads back with ``http_requests`` unknown (None, not
    a false 0); one written after keeps its request count beside its rows; 0005 goes
    back down on both backends."""
    from sqlalchemy import text

    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine, "0004")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO latency_rollups (model, minute_start, requests, p50_ms, p95_ms,"
                    " p99_ms, slo_hits, slo_misses, spilled, errors)"
                    " VALUES ('digits', 0.0, 2055, 1, 2, 3, 2055, 0, 0, 0)"
                )
            )
        await migrate.upgrade(engine)  # through 0005 to the head the store checks for
        store = await open_store(db_url)
        try:
            new = LatencyRollup("digits", 60.0, 2055, 1, 2, 3, 2055, 0, http_requests=10)
            await store.add_latency_rollup(new)
            old, back = await store.latency_rollups("digits", 0.0, 1e9)
            assert (old.requests, old.http_requests) == (2055, None)
            assert (back.requests, back.http_requests) == (2055, 10)
        finally:
            await store.close()
        await migrate.downgrade(engine, "0004")
        async with engine.connect() as conn:
            cols = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("latency_rollups")}
            )
        assert "http_requests" not in cols and "requests" in cols
    finally:
        await engine.dispose()
