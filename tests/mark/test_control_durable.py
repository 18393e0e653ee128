"""The control state kept across a restart, and the leader lease, on real SQLite and
PostgreSQL: the JSON codec, the store's two tables (migration 0004), and two controllers
sharing one database of which only the lease holder acts."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import inspect

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.config import Settings, load_settings
from mark.control import Controller, build_options
from mark.control.durable import STATE_VERSION, Durable, decode_state, encode_state
from mark.ports import InstanceRole, InterruptionNotice, LaunchRequest, NoticeKind
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, ControlStateRecord, SqlStore, migrate, open_store
from mark.state.store import make_engine
from provisioner.control_state import ControlState, ModelControl, PendingStart, WarmState
from provisioner.greedy import PlannerOption
from provisioner.interruption_rate import InterruptionEvidence
from provisioner.slo_monitor import SloMonitorState
from provisioner.spill_evidence import SpillEvidence
from provisioner.spot import InterruptionMemory

T0 = 1_700_000_000.0

STATE = ControlState(
    models={
        "digits": ModelControl(
            last_wanted={"i-1": T0},
            slo=SloMonitorState((True, False), holdoff_until=T0 + 120),
            hold_standbys_until=T0 + 180,
        ),
        "other": ModelControl(
            explored_at=T0 - 5, spill=SpillEvidence(120.0, 90.5, 0.0023, 1200.0, 700.5)
        ),
    },
    avoid=InterruptionMemory({("c5.large", "spot"): T0 + 180}),
    doomed={"i-2": T0 + 120},
    pending_starts={"i-2": PendingStart("digits", 12.5, T0 + 180)},
    orphans={"i-9": T0 - 60},
    warm=WarmState({"i-5": T0 - 30}, {"i-6": T0 - 10}, starts=3.5, outrun_starts=1.25),
    interruptions=InterruptionEvidence(2.0, 340.5),
)


def test_the_state_round_trips_through_strict_json() -> None:
    data = encode_state(STATE)
    text = json.dumps(data, allow_nan=False)  # never-set times are null, not -Infinity
    back = decode_state(json.loads(text))
    # the SLO window of outcomes is not kept, its hold-off is
    slo = STATE.models["digits"].slo
    expected_models = {
        **STATE.models,
        "digits": ModelControl(
            STATE.models["digits"].last_wanted,
            SloMonitorState((), slo.holdoff_until),
            STATE.models["digits"].hold_standbys_until,
        ),
    }
    assert back.models == expected_models
    assert (back.avoid, back.doomed, back.pending_starts, back.orphans) == (
        STATE.avoid,
        STATE.doomed,
        STATE.pending_starts,
        STATE.orphans,
    )
    assert back.of("other").hold_standbys_until == -math.inf
    assert back.of("other").spill == SpillEvidence(120.0, 90.5, 0.0023, 1200.0, 700.5)
    # the warm pool's learned share and the spot notices are kept; when spot hours were
    # last counted is not (a restart counts from its first step)
    assert back.warm == STATE.warm and back.warm.outrun_share() == pytest.approx(1.25 / 3.5)
    assert back.interruptions == STATE.interruptions
    counting = replace(STATE, interruptions=InterruptionEvidence(2.0, 340.5, counted_at=T0))
    assert decode_state(encode_state(counting)).interruptions == InterruptionEvidence(2.0, 340.5)
    assert decode_state(encode_state(ControlState())) == ControlState()


def test_a_state_saved_before_the_warm_share_and_spot_notices_reads_with_none() -> None:
    data = encode_state(STATE)
    del data["warm"]["starts"], data["warm"]["outrun_starts"], data["interruptions"]
    back = decode_state(data)
    assert (back.warm.starts, back.warm.outrun_starts) == (0.0, 0.0)
    assert back.warm.stopped_at == STATE.warm.stopped_at
    assert back.interruptions == InterruptionEvidence()


def test_a_state_saved_before_the_long_view_of_spill_reads_without_it() -> None:
    data = encode_state(STATE)
    data["models"]["other"]["spill"] = data["models"]["other"]["spill"][:3]
    assert decode_state(data).of("other").spill == SpillEvidence(120.0, 90.5, 0.0023)


def test_a_state_saved_before_spill_evidence_reads_with_none() -> None:
    data = encode_state(STATE)
    for c in data["models"].values():
        del c["spill"]
    assert decode_state(data).of("other").spill == SpillEvidence()


async def test_the_control_state_and_lease_tables_come_with_migration_0004(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine, "0003")
        await migrate.upgrade(engine, "0004")
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert {"control_state", "control_lease", "api_keys"} <= names
        await migrate.downgrade(engine, "0003")
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert "control_state" not in names and "control_lease" not in names
        assert "api_keys" in names
    finally:
        await engine.dispose()


async def test_the_store_keeps_one_state_per_cluster(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        assert await store.control_state("prod") is None
        first = ControlStateRecord("prod", STATE_VERSION, encode_state(STATE), T0, "host:a")
        await store.save_control_state(first)
        await store.save_control_state(
            ControlStateRecord("other", STATE_VERSION, encode_state(ControlState()), T0, None)
        )
        assert await store.control_state("prod") == first
        newer = ControlStateRecord("prod", STATE_VERSION, encode_state(ControlState()), T0 + 1)
        await store.save_control_state(newer)
        assert await store.control_state("prod") == newer

        durable = Durable(store, "prod", "host:a", None)
        assert await durable.restore() == ControlState()
        await store.save_control_state(ControlStateRecord("prod", 99, {"future": 1}, T0 + 2))
        assert await durable.restore() is None  # another layout: started afresh, not a crash
        await store.save_control_state(ControlStateRecord("prod", STATE_VERSION, {"x": 1}, T0))
        assert await durable.restore() is None
    finally:
        await store.close()


async def test_saving_writes_only_what_changed(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        durable = Durable(store, "prod", "host:a", None)
        await durable.save(STATE, T0)
        saved = await store.control_state("prod")
        assert saved is not None and saved.saved_at == T0 and saved.saved_by == "host:a"
        # only the SLO window differs: nothing a restart needs, nothing written
        slo = SloMonitorState((True,) * 50, STATE.models["digits"].slo.holdoff_until)
        same = STATE.with_model(
            "digits",
            ModelControl(
                STATE.models["digits"].last_wanted, slo, STATE.models["digits"].hold_standbys_until
            ),
        )
        await durable.save(same, T0 + 10)
        assert (await store.control_state("prod")).saved_at == T0  # type: ignore[union-attr]
        # new spill evidence alone waits for the control step's save
        other = STATE.models["other"]
        spilled = STATE.with_model("other", replace(other, spill=other.spill.observe(3, 4, 1e-4)))
        await durable.save(spilled, T0 + 12)
        assert (await store.control_state("prod")).saved_at == T0  # type: ignore[union-attr]
        await durable.save(spilled, T0 + 14, evidence=True)
        assert (await store.control_state("prod")).saved_at == T0 + 14  # type: ignore[union-attr]
        # spot hours alone wait for the step's save too; a notice is saved at once
        seen = spilled.interruptions
        ran = replace(spilled, interruptions=replace(seen, spot_hours=seen.spot_hours + 1))
        await durable.save(ran, T0 + 15)
        assert (await store.control_state("prod")).saved_at == T0 + 14  # type: ignore[union-attr]
        await durable.save(replace(ran, interruptions=ran.interruptions.noticed()), T0 + 16)
        assert (await store.control_state("prod")).saved_at == T0 + 16  # type: ignore[union-attr]
        await durable.save(ControlState(), T0 + 20)
        assert (await store.control_state("prod")).saved_at == T0 + 20  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_a_controller_keeps_what_it_holds_unless_another_saved_since(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        mine = Durable(store, "prod", "a", 180.0)
        await mine.save(STATE, T0)
        newer = replace(STATE, doomed={**STATE.doomed, "i-3": T0 + 200})  # saving it failed
        assert await mine.restore(newer) == newer  # the database still holds its own save
        other = Durable(store, "prod", "b", 180.0)
        await other.save(ControlState(), T0 + 300)  # another controller acted meanwhile
        assert await mine.restore(newer) == ControlState()
    finally:
        await store.close()


async def test_one_holder_at_a_time_until_the_lease_runs_out_or_is_released(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        a = await store.acquire_lease("prod", "a", T0, 180.0)
        assert (a.holder, a.acquired_at, a.expires_at) == ("a", T0, T0 + 180)
        b = await store.acquire_lease("prod", "b", T0 + 10, 180.0)
        assert b.holder == "a"  # refused: a's lease lasts
        renewed = await store.acquire_lease("prod", "a", T0 + 60, 180.0)
        assert (renewed.holder, renewed.acquired_at, renewed.expires_at) == ("a", T0, T0 + 240)
        assert (await store.acquire_lease("other", "b", T0, 180.0)).holder == "b"  # per cluster
        late = await store.acquire_lease("prod", "b", T0 + 240, 180.0)  # a did not renew
        assert (late.holder, late.acquired_at) == ("b", T0 + 240)
        await store.release_lease("prod", "a")  # not a's any more: nothing happens
        assert (await store.acquire_lease("prod", "a", T0 + 250, 180.0)).holder == "b"
        await store.release_lease("prod", "b")
        assert (await store.acquire_lease("prod", "a", T0 + 251, 180.0)).holder == "a"
    finally:
        await store.close()


@pytest.mark.postgres
async def test_racing_controllers_on_postgresql_get_exactly_one_lease(pg_url: str) -> None:
    stores = [await open_store(pg_url, upgrade=True) for _ in range(6)]
    try:
        for round_ in range(3):  # a free lease, then an expired one, twice
            now = T0 + 1000.0 * round_
            got = await asyncio.gather(
                *(s.acquire_lease("prod", f"c{k}", now, 180.0) for k, s in enumerate(stores))
            )
            winners = {g.holder for g in got}
            assert len(winners) == 1, got
            assert sum(1 for k, g in enumerate(got) if g.holder == f"c{k}") == 1
    finally:
        for s in stores:
            await s.close()


# -- two controllers on one database ---------------------------------------------


def _setup(tmp_path: Path) -> tuple[Settings, list[PlannerOption]]:
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path / "data"),
            "offerings": {"types": ["c5.large"], "markets": ["on-demand", "spot"]},
            "timings": {"update_period_s": 60},
        }
    )
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(
        settings.models[0], load_catalog(), ["c5.large"], list(Market), lat, 60.0
    )
    return settings, options


async def _loaded(url: str, model: str, rate: float) -> SqlStore:
    store = await open_store(url, upgrade=True)
    await store.add_arrivals(
        [ArrivalWindow(model, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
    )
    return store


async def test_only_the_lease_holder_acts_and_the_other_takes_over_with_its_state(
    db_url: str, tmp_path: Path
) -> None:
    settings, options = _setup(tmp_path)
    model = settings.models[0].name
    clock = ManualClock(T0)
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 60.0)
    one = await _loaded(db_url, model, 2 * options[0].capacity_rps)
    two = await open_store(db_url)  # a second daemon: its own connections, the same database
    try:
        first = Controller(settings, fleet, one, {model: options}, holder="host-1", cluster="c1")
        second = Controller(settings, fleet, two, {model: options}, holder="host-2", cluster="c1")
        await first.adopt(clock.now())
        assert await second.adopt(clock.now()) == []  # not the holder: adopts nothing
        (res,) = await first.step(clock.now())
        assert res.launched
        assert await second.step(clock.now()) == []  # plans nothing, launches nothing
        assert await second.check_slo(clock.now(), {model: [math.inf] * 200}) == []
        plans = await one.plans(model, limit=10)
        assert len(plans) == 1  # one plan: the holder's

        # The holder learns of an avoided offering; the state is saved as it changes.
        spot = await fleet.launch(
            LaunchRequest(model, "c5.large", Market.SPOT, 1, InstanceRole.SERVING)
        )
        clock.advance(30)
        notice = InterruptionNotice(
            spot[0].instance_id, NoticeKind.INTERRUPTION, clock.now(), clock.now() + 120
        )
        await first.on_interruption(notice, clock.now())
        assert spot[0].instance_id in first.state.doomed
        assert await second.on_interruption(notice, clock.now()) == []

        # The holder stops renewing (it hangs, or its host is gone); after the lease
        # runs out the other controller takes over: the saved state, and the fleet.
        clock.advance(3 * 60 + 1)
        (took,) = await second.step(clock.now())
        assert took.plan_id is not None
        assert second.state.doomed == first.state.doomed
        assert ("c5.large", "spot") in second.state.avoid.avoid_until
        assert await first.step(clock.now()) == []  # the old holder now plans nothing
        # A clean stop hands the lease over at once.
        await second.resign()
        assert await first.step(clock.now())
    finally:
        await one.close()
        await two.close()


async def test_without_the_lease_every_controller_acts(tmp_path: Path) -> None:
    settings, options = _setup(tmp_path)
    settings = settings.model_copy(
        update={"control": settings.control.model_copy(update={"leader_lease": False})}
    )
    model = settings.models[0].name
    clock = ManualClock(T0)
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 60.0)
    url = f"sqlite+aiosqlite:///{tmp_path}/s.db"
    store = await _loaded(url, model, 2 * options[0].capacity_rps)
    try:
        a = Controller(settings, fleet, store, {model: options}, holder="a", cluster="c")
        b = Controller(settings, fleet, store, {model: options}, holder="b", cluster="c")
        assert await a.step(clock.now()) and await b.step(clock.now())
    finally:
        await store.close()
