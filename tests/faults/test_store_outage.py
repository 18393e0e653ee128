"""PostgreSQL stopped for 60 s under load (``tests/faults/harness.py``).

The daemon's store is a private PostgreSQL server (``tests/private_pg.py``) that the
fault stops (fast shutdown: every connection cut) and starts again 60 s later. Besides
what every scenario holds (nothing lost, answered twice or orphaned), it checks that
the request path did not notice (no explicit error: the key cache kept the last good
set, served on instances throughout), that every arrival the telemetry counted reached
the store and nothing was dropped from the buffer, that the control loop held the fleet
(recorded ``store-unavailable``, launched nothing) and planned again once the store
answered (``store-back``, a plan after it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from mark.cloud.local.world import LocalWorld
from mark.daemon import start, stop
from mark.demo import ensure_demo_model
from mark.demo.loadgen import endpoint, fetch_model_input
from mark.serve.auth import FIRST_KEY_SCOPES, KEY_FILE, issue, write_key_file
from mark.state import Outbox, open_store
from tests.faults.harness import (
    MODEL,
    Fault,
    Live,
    moto_instances,
    orphans,
    run_scenario,
    scenario_settings,
)
from tests.private_pg import PrivatePostgres, available, private_postgres

pytestmark = pytest.mark.slow

OUTAGE_S = 60.0


@pytest.fixture
def pg() -> Iterator[PrivatePostgres]:
    reason = available()
    if reason is not None:
        pytest.skip(f"no private PostgreSQL for the outage scenario: {reason}")
    with private_postgres() as server:
        yield server


def stop_postgres(pg: PrivatePostgres, seconds: float, seen: dict[str, object]) -> Fault:
    """Stop the server for ``seconds``, start it again, and wait until the control loop has
    written what it buffered and planned again. ``seen`` gets the wall-clock times and the
    daemon's outbox."""

    async def fault(live: Live) -> str:
        outbox = live.run.store.outbox
        assert outbox is not None
        seen["outbox"] = outbox
        seen["down_at"] = time.time()
        await asyncio.to_thread(pg.stop)
        at = live.strike()
        await asyncio.sleep(seconds)
        buffered = outbox.buffered_rows
        await asyncio.to_thread(pg.start)
        seen["up_at"] = up = time.time()
        back = live.elapsed()

        async def planning_again() -> bool:
            if not outbox.available or outbox.buffered_rows:
                return False
            plans = await live.run.store.plans(MODEL, limit=1)
            return bool(plans) and plans[0].at > up

        await live.until("no plan after the store came back", 30, planning_again)
        return (
            f"PostgreSQL stopped at {at:.0f} s, started at {back:.0f} s "
            f"({buffered} rows buffered); planning again at {live.elapsed():.0f} s"
        )

    return fault


async def test_postgres_stopped_for_60_s_under_load(data_dir: Path, pg: PrivatePostgres) -> None:
    seen: dict[str, object] = {}
    settings = scenario_settings(data_dir, {"database_url": pg.url})
    t = await run_scenario(
        "PostgreSQL stopped 60 s",
        settings,
        "0:6,110:6",
        seed=6,
        fault_at_s=20,
        fault=stop_postgres(pg, OUTAGE_S, seen),
    )
    down, up = float(str(seen["down_at"])), float(str(seen["up_at"]))
    outbox = seen["outbox"]
    assert isinstance(outbox, Outbox)
    # Serving never waited on the store: no request refused, none without its key.
    assert t.errors == t.declined, t.reasons  # only the miss budget's declines
    assert t.on_ec2 > 0
    # Bookkeeping buffered, none dropped, all written: every arrival reached the store.
    assert outbox.outages >= 1 and not outbox.dropped and not outbox.rejected
    assert outbox.buffered_rows == 0
    store = await open_store(settings.db_url)
    try:
        arrivals = await store.arrivals(MODEL, 0.0, 1e12)
    finally:
        await store.close()
    assert sum(w.count for w in arrivals) == t.sent
    assert any(down < w.window_start < up for w in arrivals)
    # The control loop held the fleet during the outage and planned again after it.
    held = t.actions("store-unavailable")
    assert held and all(down <= d.at <= up for d in held), t.decisions
    assert t.actions("store-back"), t.decisions
    launched = [d for d in t.decisions if d.action == "launch" and down < d.at < up]
    assert not launched, launched


async def test_a_daemon_started_while_postgres_is_down_serves(
    data_dir: Path, pg: PrivatePostgres
) -> None:
    # A fresh database, never migrated, down before the daemon starts; the key the local
    # world saved at an earlier start is in the data dir.
    await asyncio.to_thread(pg.stop)
    _, token = issue("mark up", FIRST_KEY_SCOPES, time.time())
    write_key_file(data_dir / KEY_FILE, token)
    settings = scenario_settings(data_dir, {"database_url": pg.url})
    ensure_demo_model(settings.data_dir)
    run = await start(settings)
    try:
        assert run.controller is None  # no planning on a store it cannot read
        world = run.world
        assert isinstance(world, LocalWorld)
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            inp = await fetch_model_input(http, run.url, MODEL)
            row = inp.random_row(np.random.default_rng(7)).reshape(-1).tolist()
            one = {"name": inp.name, "shape": [1, *inp.shape], "datatype": inp.datatype}
            body = {"inputs": [{**one, "data": row}]}
            target = endpoint(run.url, MODEL, "v2")
            for _ in range(5):  # served (on Lambda: no instance yet) with the saved key
                async with http.post(target, json=body) as r:
                    assert r.status == 200, await r.text()
            async with http.post(target, json=body, headers={"Authorization": "Bearer x"}) as r:
                assert r.status == 401
            async with http.get(f"{run.url}/metrics") as r:
                assert "mark_store_available 0" in await r.text()

            await asyncio.to_thread(pg.start)
            deadline = time.monotonic() + 60
            while run.controller is None:  # migrated, buffered rows written, planning
                assert time.monotonic() < deadline, "no control loop after the store came back"
                await asyncio.sleep(0.5)
            async with http.get(f"{run.url}/metrics") as r:
                assert "mark_store_available 1" in await r.text()
        keys = await run.store.api_keys(active_only=True)
        assert [k.id for k in keys] == [token.split("_")[1]]  # the saved key, now recorded
    finally:
        await stop(run)
    store = await open_store(settings.db_url)
    try:
        arrivals = await store.arrivals(MODEL, 0.0, 1e12)
        recorded = {r.instance_id: r.state for r in await store.instances()}
    finally:
        await store.close()
    assert sum(w.count for w in arrivals) == 5  # counted while the store was down
    left = orphans(moto_instances(world.region, world.cluster), recorded, [])
    assert not left, left
