"""One control-loop step at a time, on a manual clock, a simulated fleet and a real store."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissTally
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.config import Settings, load_settings
from mark.control import Controller, build_options, max_rate_per_minute
from mark.ports import InstanceInfo, InstanceState, InterruptionNotice, NoticeKind
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, open_store
from predictor.base import FloatArray, Forecaster, History, RiseOutlook
from provisioner.capacity_target import best_capacity
from provisioner.greedy import PlannerOption
from provisioner.pooling import capacity_in_pool
from provisioner.rise_headroom import rise_allowance
from provisioner.spill_evidence import SpillCounts

T0 = 1_700_000_000.0


def test_max_rate_per_minute_takes_each_minutes_peak_window() -> None:
    ws = [ArrivalWindow("m", T0 + 5 * k, 5.0, k) for k in range(24)]  # two minutes
    got = max_rate_per_minute(ws, T0, 3)
    assert got[:2] == [11 / 5, 23 / 5] and math.isnan(got[2])  # no window: missing, not 0


class _Draining:
    """``mark.ports.Draining`` that records what it was told, and the fleet's states then."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet
        self.retired: list[tuple[list[str], set[InstanceState]]] = []
        self.kept: list[list[str]] = []

    async def retire(self, instance_ids: Sequence[str]) -> None:
        states = {i.state for i in await self.fleet.list() if i.instance_id in instance_ids}
        self.retired.append((sorted(instance_ids), states))

    async def keep(self, instance_ids: Sequence[str]) -> None:
        self.kept.append(sorted(instance_ids))


async def test_controller_launches_ahead_of_load_and_retires_after_cooldown(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large", "c5.xlarge"], "markets": ["on-demand"]},
            # Terminated at retirement (the warm pool's stops: test_warm_pool_control).
            "timings": {"cooldown_s": 5000, "warm_start_s": None},
        }
    )
    spec = settings.models[0]  # RT_max 100 ms
    catalog = load_catalog()
    lat = {
        "c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080}),
        "c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045}),
        "g4dn.xlarge": BatchLatency.from_mapping({1: 0.5}),  # cannot meet RT_max: dropped
    }
    options = build_options(
        spec, catalog, [*settings.offerings.types, "g4dn.xlarge"], [Market.ON_DEMAND], lat, 90.0
    )
    assert {o.instance_type for o in options} == {"c5.large", "c5.xlarge"}
    assert all(o.capacity_rps > 0 for o in options)

    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 3 * max(o.capacity_rps for o in options)  # needs several instances
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        ctl = Controller(settings, fleet, store, {spec.name: options})
        (res,) = await ctl.step(clock.now())
        assert res.error is None and res.launched
        pool = len(res.launched)  # rated as the pool they serve in (provisioner.pooling)
        capacity = sum(
            next(capacity_in_pool(o, pool) for o in options if o.instance_type == i.instance_type)
            for i in res.launched
        )
        assert capacity >= rate * 1.2 - 1e-6  # the fallback forecast's headroom is covered
        (plan,) = await store.plans(spec.name)
        assert plan.id == res.plan_id and plan.decisions[0].action == "launch"
        assert "r/s" in " ".join(plan.explanation["lines"]) or plan.explanation["lines"]

        # A second step a minute later keeps the fleet (nothing twice).
        clock.advance(60)
        (res2,) = await ctl.step(clock.now())
        assert res2.launched == [] and res2.retired == []

        # The load stops (an hour later the history is empty): nothing retires
        # before the cool-down since the fleet was last wanted, then all of it does.
        clock.advance(3600)
        (res3,) = await ctl.step(clock.now())
        assert res3.retired == [] and res3.forecast[0] == 0.0
        assert all("cool-down" in why for _, why in res3.held) and res3.held
        clock.advance(5000 - 3600)
        drained = _Draining(fleet)
        ctl.draining = drained
        (res4,) = await ctl.step(clock.now())
        assert sorted(res4.retired) == sorted(i.instance_id for i in res.launched)
        # The request path was told first, while every one of them still ran.
        assert drained.retired == [(sorted(res4.retired), {InstanceState.RUNNING})]
        assert drained.kept == []
        assert all(i.state is InstanceState.TERMINATED for i in fleet._instances.values())
        # The store saw every instance come and go, and the ledger priced each run.
        recs = await store.instances(model=spec.name)
        assert {r.instance_id for r in recs} == {i.instance_id for i in res.launched}
        assert all(r.state == "terminated" for r in recs)
        ledger = await store.ledger(model=spec.name)
        assert len(ledger) == len(res.launched)
        for e in ledger:
            assert e.billed_seconds == e.end - e.start == 60 + 3600 + 1400
            assert e.cost == pytest.approx(e.billed_seconds * e.unit_price / 3600)
    finally:
        await store.close()


async def test_a_model_no_offering_can_serve_reports_an_error(tmp_path: Path) -> None:
    settings = load_settings(overrides={"offerings": {"types": ["c5.large"]}})
    clock = ManualClock(T0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        await store.add_arrivals([ArrivalWindow("digits", T0 - 60, 5.0, 50)])
        ctl = Controller(settings, SimFleet(load_catalog(), clock.now), store, {"digits": []})
        (res,) = await ctl.step(clock.now())
        assert res.error and res.launched == []
    finally:
        await store.close()


@pytest.mark.parametrize("market", ["on-demand", "spot"])
def test_options_carry_the_catalog_price(market: str) -> None:
    settings = load_settings()
    opts = build_options(
        settings.models[0],
        load_catalog(),
        ["c5.large"],
        [Market(market)],
        {"c5.large": BatchLatency.from_mapping({1: 0.02})},
        90.0,
    )
    (o,) = opts
    assert o.price_per_hour == load_catalog().offering("c5.large", market).price_per_hour


async def test_slo_monitor_launches_backups_once_per_miss_streak(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={"slo_monitor": {"last_m": 10, "launch_l": 2, "holdoff_s": 120}}
    )
    clock = ManualClock(T0)
    fleet = SimFleet(load_catalog(), clock.now)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        # No backup type is configured: the cheapest offering that serves, spot included.
        options = [
            PlannerOption("c5.xlarge", "on-demand", 0.17, 40.0),
            PlannerOption("c5.large", "spot", 0.03, 20.0),
            PlannerOption("c5.large", "on-demand", 0.085, 20.0),
        ]
        ctl = Controller(settings, fleet, store, {"digits": options})
        ok, slow = [0.01] * 10, [0.5] * 10  # RT_max of the demo model is 100 ms
        assert await ctl.check_slo(clock.now(), {"digits": ok}) == []
        launched = await ctl.check_slo(clock.now(), {"digits": slow[:5]})
        assert len(launched) == 2  # 5 of the last 10 missed: below SL_min 98 %
        clock.advance(30)
        assert await ctl.check_slo(clock.now(), {"digits": slow}) == []  # held off
        insts = await fleet.list()
        assert {(i.instance_type, i.market.value, i.role.value) for i in insts} == {
            ("c5.large", "spot", "backup")
        }
        (d,) = await store.decisions(0, 1e12)
        assert d.action == "backup" and "50.0% of the last 10" in d.reason
        assert {r.role for r in await store.instances()} == {"backup"}
        clock.advance(120)
        assert len(await ctl.check_slo(clock.now(), {"digits": slow})) == 2  # a new streak
    finally:
        await store.close()


class CountingFleet(SimFleet):
    """A simulated fleet counting how often it is listed (on AWS, a DescribeInstances)."""

    lists = 0

    async def list(self) -> list[InstanceInfo]:
        self.lists += 1
        return await super().list()


async def test_where_spill_misses_rt_max_backups_carry_the_measured_load(tmp_path: Path) -> None:
    """Where spill is measured to miss RT_max, the monitor's backups are as many as carry
    the load of the last closed windows above the fleet, topped up while they are judged
    as the load keeps rising; before spill is measured, and once it answers in time
    (early steps plan there), L."""
    settings = load_settings(overrides={"slo_monitor": {"last_m": 10, "holdoff_s": 120}})
    clock = ManualClock(T0)
    fleet = CountingFleet(load_catalog(), clock.now)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)

    async def load(rps: float) -> None:  # two 5 s windows closed just now
        now = clock.now()
        await store.add_arrivals(
            [ArrivalWindow("digits", now - 10 + 5 * k, 5.0, int(rps * 5)) for k in range(2)]
        )

    try:
        options = [PlannerOption("c5.large", "on-demand", 0.085, 20.0)]
        ctl = Controller(settings, fleet, store, {"digits": options})
        slow = [0.5] * 10  # RT_max of the demo model is 100 ms
        await load(100.0)
        assert len(await ctl.check_slo(clock.now(), {"digits": slow})) == 1  # nothing known: L
        await ctl.record_spills({"digits": SpillCounts(100, 0, 0.01)})  # spill misses RT_max
        clock.advance(120)
        await load(100.0)
        assert len(await ctl.check_slo(clock.now(), {"digits": slow})) == 4  # (100 − 20) / 20
        looked = fleet.lists
        clock.advance(30)
        await load(100.0)
        assert await ctl.check_slo(clock.now(), {"digits": slow}) == []  # carried, booting
        assert fleet.lists == looked  # the load is what they were sized to: no look needed
        clock.advance(30)
        await load(180.0)
        assert len(await ctl.check_slo(clock.now(), {"digits": []})) == 4  # (180 − 100) / 20
        assert fleet.lists == looked + 1
        reasons = [d.reason for d in await store.decisions(0, 1e12)]
        assert any("180.0 r/s" in r and r.startswith("more backups") for r in reasons)

        await ctl.record_spills({"digits": SpillCounts(400, 400, 0.01)})  # spill in time
        clock.advance(120)
        await load(400.0)
        assert len(await ctl.check_slo(clock.now(), {"digits": slow})) == 1  # L
    finally:
        await store.close()


async def test_backups_out_of_capacity_are_asked_of_the_next_offering_at_once(
    tmp_path: Path,
) -> None:
    """Spot backups are the cheapest, but EC2 may have none: the offering is avoided (the
    plans avoid it too) and the backups are bought on the next offering in the same
    check, as a plan step falls back."""
    settings = load_settings(overrides={"slo_monitor": {"last_m": 10, "launch_l": 2}})
    clock = ManualClock(T0)
    spot = ("c5.large", "spot")
    fleet = SimFleet(load_catalog(), clock.now, capacity={spot: 0})
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        options = [
            PlannerOption("c5.large", "spot", 0.03, 20.0),
            PlannerOption("c5.large", "on-demand", 0.085, 20.0),
        ]
        ctl = Controller(settings, fleet, store, {"digits": options})
        launched = await ctl.check_slo(clock.now(), {"digits": [0.5] * 10})
        assert len(launched) == 2
        insts = await fleet.list()
        assert {(i.market.value, i.role.value) for i in insts} == {("on-demand", "backup")}
        assert ctl.state.avoid.avoid_until[spot] > clock.now()
        actions = [d.action for d in await store.decisions(0, 1e12)]
        assert actions.index("launch-unavailable") < actions.index("backup")
    finally:
        await store.close()


async def test_the_configured_predictor_forecasts_from_the_stores_history(tmp_path: Path) -> None:
    """With a day of history a seasonal model is fitted off the loop, then it forecasts."""
    import asyncio

    from mark.control import online_predictor

    settings = load_settings(
        overrides={
            "predictor": {
                "model": "seasonal",
                "history_minutes": 1500,
                "min_history_minutes": 1440,
                "refit_at_minute_of_day": None,
            }
        }
    )
    clock = ManualClock(T0 - T0 % 86400 + 86400 + 3600)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        # yesterday: 2 r/s, except 10 r/s from 01:10 to 01:20; today so far: 2 r/s
        day = clock.now() - 3600 - 86400
        ws = []
        for k in range(0, 86400 + 3600, 5):
            t = day + k
            busy = 4200 <= k < 4800
            ws.append(ArrivalWindow("digits", t, 5.0, 50 if busy else 10))
        await store.add_arrivals(ws)
        online = online_predictor(settings)
        ctl = Controller(
            settings,
            SimFleet(load_catalog(), clock.now),
            store,
            {"digits": []},
            predictors={"digits": online},
        )
        await ctl.step(clock.now())  # first step: cold-start rule, refit started
        assert online._task is not None
        await asyncio.wait_for(online._task, 30)
        assert online.model is not None and online.last_error is None
        forecast = await ctl.forecast_for("digits", clock.now(), 60)
        # same minutes yesterday: 2 r/s, then the 10 r/s burst at minutes 10..19
        assert forecast[5] == pytest.approx(2.0) and forecast[12] == pytest.approx(10.0)
    finally:
        await store.close()


class _SeesWhatItFits(Forecaster):
    """Forecasts the last value; remembers the history it was fitted on."""

    fitted_on: ClassVar[list[History]] = []

    def _fit(self, history: History) -> None:
        self.fitted_on.append(history)

    def _forecast(self, history: History, steps: int) -> FloatArray:
        return np.full(steps, history.observed[-1])


@pytest.mark.parametrize("fit_days", [3, 0])
async def test_a_refit_learns_from_days_of_history_the_forecast_does_not_read(
    tmp_path: Path, fit_days: int
) -> None:
    """The simulator's forecaster learns from every day before its window; the daemon's
    refit reads ``fit_history_minutes`` (3 days, or the default 14 of a store holding 4
    and a half hour) while each forecast reads ``history_minutes`` (1 hour)."""
    import asyncio

    from mark.control import online_predictor

    fit = {"fit_history_minutes": fit_days * 1440} if fit_days else {}
    settings = load_settings(
        overrides={
            "predictor": {
                "model": "seasonal",
                "history_minutes": 60,
                "refit_at_minute_of_day": None,
                **fit,
            }
        }
    )
    clock = ManualClock(T0 - T0 % 86400)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        since = clock.now() - 4 * 86400 - 1800  # four days and a half hour of arrivals
        await store.add_arrivals(
            [ArrivalWindow("digits", since + t, 5.0, 10) for t in range(0, 4 * 86400 + 1800, 5)]
        )
        online = online_predictor(settings)
        online.make = _SeesWhatItFits
        _SeesWhatItFits.fitted_on.clear()
        ctl = Controller(
            settings,
            SimFleet(load_catalog(), clock.now),
            store,
            {"digits": []},
            predictors={"digits": online},
        )
        await ctl.step(clock.now())
        assert online._task is not None
        await asyncio.wait_for(online._task, 30)
        (history,) = _SeesWhatItFits.fitted_on
        assert history.observed.size == len(history)
        if fit_days:
            assert len(history) == 3 * 1440
            assert history.start_minute == int(clock.now() // 60) - 3 * 1440
        else:  # more than the store holds: all of it, from the first observed minute
            assert len(history) == 4 * 1440 + 30
            assert history.start_minute == int(since // 60)
        assert await ctl.forecast_for("digits", clock.now(), 3) == pytest.approx([2.0] * 3)
    finally:
        await store.close()


async def test_spot_interruption_starts_standbys_and_replans_around_the_offering(
    tmp_path: Path,
) -> None:
    from mark.ports import InstanceRole, InterruptionNotice, NoticeKind

    settings = load_settings(
        overrides={
            "offerings": {
                "types": ["c5.large", "c5.xlarge"],
                "markets": ["on-demand", "spot"],
                "standby_types": ["t3.large"],
            }
        }
    )
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {
        "c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080}),
        "c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045}),
    }
    options = build_options(
        spec, catalog, settings.offerings.types, settings.offerings.markets, lat, 90.0
    )
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 2.5 * max(o.capacity_rps for o in options)
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        ctl = Controller(
            settings,
            fleet,
            store,
            {spec.name: options},
            boot_s=60.0,
            standby_capacity={spec.name: 40.0},
        )
        (res,) = await ctl.step(clock.now())
        spot = [i for i in res.launched if i.market is Market.SPOT]
        assert spot, "spot is cheapest: the planner buys it"
        standbys = [i for i in await fleet.list() if i.role is InstanceRole.STANDBY]
        assert standbys, "a standby pool covers the spot capacity at risk"

        clock.advance(61)  # booted: standbys are stopped, the fleet serves
        await ctl.step(clock.now())
        states = {i.state for i in await fleet.list() if i.role is InstanceRole.STANDBY}
        assert states == {InstanceState.STOPPED}

        victim = spot[0]
        notice = InterruptionNotice(
            victim.instance_id, NoticeKind.INTERRUPTION, clock.now(), clock.now() + 120
        )
        started = await ctl.on_interruption(notice, clock.now())
        assert started, "standbys start at once on the 2-minute notice"
        assert await ctl.on_interruption(notice, clock.now()) == []  # a repeat changes nothing
        after = await fleet.list()
        assert {i.state for i in after if i.instance_id in started} == {InstanceState.PENDING}
        replacements = [
            i for i in after if i.role is InstanceRole.SERVING and i.launched_at == clock.now()
        ]
        assert replacements, "the re-plan replaces the lost capacity at once"
        assert all(
            (i.instance_type, i.market) != (victim.instance_type, Market.SPOT) for i in replacements
        ), "the interrupted offering is avoided for a while"
        actions = [d.action for d in await store.decisions(0, 1e12)]
        assert "start-standby" in actions

        await fleet.terminate([victim.instance_id])  # AWS reclaims it
        clock.advance(121)  # reclaimed, but the replacements are still booting: standbys stay
        await ctl.step(clock.now())
        assert {i.state for i in await fleet.list() if i.instance_id in started} == {
            InstanceState.RUNNING
        }
        clock.advance(60)  # replacements booted: the standbys stop again
        await ctl.step(clock.now())
        assert {i.state for i in await fleet.list() if i.instance_id in started} == {
            InstanceState.STOPPED
        }
        billed = [e for e in await store.ledger() if e.instance_id == victim.instance_id]
        assert len(billed) == 1 and billed[0].end == notice.action_at
    finally:
        await store.close()


def _spot_with_standbys() -> tuple[Settings, list[PlannerOption], ManualClock, SimFleet]:
    """One model on spot c5.large with t3.large standbys, a 60 s boot: its settings,
    options, clock and fleet."""
    settings = load_settings(
        overrides={
            "offerings": {
                "types": ["c5.large"],
                "markets": ["spot"],
                "standby_types": ["t3.large"],
            }
        }
    )
    catalog = load_catalog()
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(settings.models[0], catalog, ["c5.large"], [Market.SPOT], lat, 90.0)
    clock = ManualClock(T0)
    return settings, options, clock, SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)


async def test_stopped_standbys_worth_less_than_their_volumes_are_ended_and_billed(
    tmp_path: Path,
) -> None:
    """Once spill is measured to answer within RT_max at a price that the spill a
    standby saves at the configured interruption rate cannot pay its volume for, the
    stopped pool goes (``retire-standby``), each standby billed once for its boot."""
    from mark.ports import InstanceRole

    settings, options, clock, fleet = _spot_with_standbys()
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 2.5 * options[0].capacity_rps
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        ctl = Controller(
            settings,
            fleet,
            store,
            {spec.name: options},
            boot_s=60.0,
            standby_capacity={spec.name: 10.0},
            cluster="c",
        )
        await ctl.step(clock.now())  # spill not measured yet: the paper's pool
        clock.advance(61)
        await ctl.step(clock.now())  # booted: stopped
        standbys = [i for i in await fleet.list() if i.role is InstanceRole.STANDBY]
        assert standbys and {i.state for i in standbys} == {InstanceState.STOPPED}

        # Spill answers in time at $1e-9 a request: 0.2/730 interruptions an hour × a few
        # r/s × 60 s × $1e-9 is far below an 8 GB volume's $0.0009 an hour.
        await ctl.record_spills({spec.name: SpillCounts(100, 100, 1e-7)})
        clock.advance(60)
        await ctl.step(clock.now())
        left = [
            i
            for i in await fleet.list()
            if i.role is InstanceRole.STANDBY and i.state is not InstanceState.TERMINATED
        ]
        assert left == []
        decisions = [d for d in await store.decisions(0, 1e12) if d.action == "retire-standby"]
        assert sorted(d.instance_id or "" for d in decisions) == sorted(
            i.instance_id for i in standbys
        )
        ledger = [
            e for e in await store.ledger() if e.instance_id in {i.instance_id for i in standbys}
        ]
        assert len(ledger) == len(standbys), "each standby's boot billed once"

        # A dearer spill (here $1 a request) is worth the pool again: it is bought back.
        await ctl.record_spills({spec.name: SpillCounts(10_000, 10_000, 10_000.0)})
        clock.advance(60)
        await ctl.step(clock.now())
        again = [
            i
            for i in await fleet.list()
            if i.role is InstanceRole.STANDBY and i.state is not InstanceState.TERMINATED
        ]
        assert len(again) == len(standbys)
    finally:
        await store.close()


async def test_spot_notices_raise_the_interruption_rate_the_pool_is_priced_at(
    tmp_path: Path,
) -> None:
    """The standby pool is priced at the interruption rate the cluster meets: with spill
    cheap enough that the configured rate keeps no standby, two notices (about eleven
    times the configured 0.2 a month, over the few spot hours seen) buy standbys, and a
    restart keeps what was learned."""
    from mark.ports import InstanceRole

    settings, options, clock, fleet = _spot_with_standbys()
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)

    async def standbys() -> list[str]:
        return [
            i.instance_id
            for i in await fleet.list()
            if i.role is InstanceRole.STANDBY and i.state is not InstanceState.TERMINATED
        ]

    try:
        rate = 2.5 * options[0].capacity_rps
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        kwargs: dict[str, Any] = {"boot_s": 60.0, "standby_capacity": {spec.name: 10.0}}
        ctl = Controller(settings, fleet, store, {spec.name: options}, cluster="c", **kwargs)
        (first,) = await ctl.step(clock.now())
        spot = [i for i in first.launched if i.market is Market.SPOT]
        value = ctl.config_for(spec).standby_value
        assert value is not None
        assert value.interruptions_per_hour == pytest.approx(0.2 / 730)
        # spill in time at the price where the configured rate saves half a volume an hour
        price = value.volume_per_hour / (
            2 * value.interruptions_per_hour * len(spot) * options[0].capacity_rps * 60.0
        )
        clock.advance(61)
        await ctl.step(clock.now())  # booted: the paper's pool, stopped
        assert await standbys()
        await ctl.record_spills({spec.name: SpillCounts(1000, 1000, 1000 * price)})
        clock.advance(60)
        await ctl.step(clock.now())
        assert await standbys() == []

        for victim in spot[:2]:
            notice = InterruptionNotice(
                victim.instance_id, NoticeKind.INTERRUPTION, clock.now(), clock.now() + 120
            )
            await ctl.on_interruption(notice, clock.now())
        seen = ctl.state.interruptions
        assert seen.notices == 2.0 and seen.spot_hours >= len(spot) * 121 / 3600
        learned = ctl.config_for(spec).standby_value
        assert learned is not None
        assert learned.interruptions_per_hour == pytest.approx((0.2 + 2) / (730 + seen.spot_hours))
        clock.advance(60)
        await ctl.step(clock.now())
        assert await standbys(), "at the rate met, spill no longer pays for the loss"

        await ctl.resign()
        again = Controller(settings, fleet, store, {spec.name: options}, cluster="c", **kwargs)
        await again.adopt(clock.now())
        assert again.state.interruptions.notices == 2.0
    finally:
        await store.close()


async def test_a_measured_standby_profile_resizes_the_pool_as_a_restart_would(
    tmp_path: Path,
) -> None:
    """The standby type re-rated from a measured profile (slower than first rated) takes
    effect on the running daemon's next step, not only after a restart."""
    from mark.ports import InstanceRole

    settings, options, clock, fleet = _spot_with_standbys()
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 8 * options[0].capacity_rps
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        big = 1000.0  # one standby covers any loss
        ctl = Controller(
            settings,
            fleet,
            store,
            {spec.name: options},
            boot_s=60.0,
            standby_capacity={spec.name: big},
        )

        async def standbys() -> int:
            return sum(1 for i in await fleet.list() if i.role is InstanceRole.STANDBY)

        await ctl.step(clock.now())
        assert await standbys() == 1
        small = options[0].capacity_rps / 2  # measured: a standby carries half a c5.large
        await ctl.set_options(spec.name, options, {"c5.large": "measured"}, small)
        clock.advance(5)
        await ctl.step(clock.now())
        assert await standbys() > 1, "the pool is sized from the re-rated standby"
    finally:
        await store.close()


def _two_types(settings_overrides: dict[str, object] | None = None) -> tuple[Any, list[Any]]:
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large", "c5.xlarge"], "markets": ["on-demand"]},
            # these tests drive loads of dozens of instances: no spend rail in the way
            "budget": {"max_hourly_per_model": None, "max_hourly_cluster": None},
            **(settings_overrides or {}),
        }
    )
    lat = {
        "c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080}),
        "c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045}),
    }
    spec = settings.models[0]
    options = build_options(
        spec, load_catalog(), settings.offerings.types, [Market.ON_DEMAND], lat, 90.0
    )
    return settings, options


async def test_an_offering_out_of_capacity_is_avoided_and_the_next_one_bought_in_the_same_step(
    tmp_path: Path,
) -> None:
    settings, options = _two_types()
    spec = settings.models[0]
    catalog = load_catalog()
    clock = ManualClock(T0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 3 * max(o.capacity_rps for o in options)
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 600 + 5 * k, 5.0, int(rate * 5)) for k in range(120)]
        )
        # The planner buys c5.large when everything is available...
        probe = Controller(settings, SimFleet(catalog, clock.now), store, {spec.name: options})
        (first,) = await probe.step(clock.now())
        key = ("c5.large", "on-demand")
        assert key in {(i.instance_type, i.market.value) for i in first.launched}
        # ...but it is out of capacity here (as EC2 answers InsufficientInstanceCapacity).
        fleet = SimFleet(catalog, clock.now, capacity={key: 0})
        ctl = Controller(settings, fleet, store, {spec.name: options})
        (res,) = await ctl.step(clock.now())
        assert res.error is None and res.launched
        assert {i.instance_type for i in res.launched} == {"c5.xlarge"}
        capacity = sum(
            next(
                capacity_in_pool(o, len(res.launched))
                for o in options
                if o.instance_type == i.instance_type
            )
            for i in res.launched
        )
        assert capacity >= rate * 1.2 - 1e-6  # the fallback still covers the forecast
        plan = (await store.plans(spec.name, limit=1))[0]
        actions = [(d.action, d.instance_type) for d in plan.decisions]
        unavailable = actions.index(("launch-unavailable", "c5.large"))
        assert ("launch", "c5.xlarge") in actions[unavailable:]  # bought after, same step
        (why,) = [d.reason for d in plan.decisions if d.action == "launch-unavailable"]
        assert "avoided for 180 s" in why

        # Within the TTL the offering is not tried again; after it, it is.
        fleet.capacity[key] = 100
        clock.advance(60)
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 + 5 * k, 5.0, int(3 * rate * 5)) for k in range(12)]
        )
        (res2,) = await ctl.step(clock.now())
        assert all((i.instance_type, i.market.value) != key for i in res2.launched)
        clock.advance(180)
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 + 60 + 5 * k, 5.0, int(9 * rate * 5)) for k in range(48)]
        )
        (res3,) = await ctl.step(clock.now())
        assert any((i.instance_type, i.market.value) == key for i in res3.launched)
    finally:
        await store.close()


async def test_fallbacks_are_bounded_when_nothing_has_capacity(tmp_path: Path) -> None:
    settings, options = _two_types()
    spec = settings.models[0]
    clock = ManualClock(T0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        await store.add_arrivals([ArrivalWindow(spec.name, T0 - 30, 5.0, 500)])
        fleet = SimFleet(load_catalog(), clock.now, capacity={o.key: 0 for o in options})
        ctl = Controller(settings, fleet, store, {spec.name: options}, max_fallbacks=1)
        (res,) = await ctl.step(clock.now())
        assert res.launched == [] and res.error is None
        plan = (await store.plans(spec.name, limit=1))[0]
        actions = [d.action for d in plan.decisions]
        assert actions == ["launch-unavailable", "launch-unavailable", "fallback-exhausted"]
    finally:
        await store.close()


async def test_backups_are_not_retired_while_the_slo_monitor_waits_to_judge_them(
    tmp_path: Path,
) -> None:
    settings, options = _two_types(
        {
            "timings": {"cooldown_s": 90, "billing_minimum_s": 60},
            "slo_monitor": {"last_m": 10, "launch_l": 1, "holdoff_s": 270},
        }
    )
    spec = settings.models[0]
    clock = ManualClock(T0)
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 10.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=10.0)
        # No load the planner can see, yet requests miss RT_max: the model was wrong.
        (backup,) = await ctl.check_slo(clock.now(), {spec.name: [0.5] * 10})
        for _ in range(4):  # 4 minutes, inside the hold-off: past cool-down and billing minimum
            clock.advance(60)
            (res,) = await ctl.step(clock.now())
            assert res.retired == []
            assert [h[0] for h in res.held] == [backup] and "SLO missed" in res.held[0][1]
        clock.advance(60)  # hold-off over, but the cool-down runs from the last held step
        (res,) = await ctl.step(clock.now())
        assert res.retired == [] and "cool-down" in res.held[0][1]
        clock.advance(60)
        (res,) = await ctl.step(clock.now())
        assert res.retired == [backup]
    finally:
        await store.close()


async def test_with_a_short_update_period_the_forecast_sees_the_last_60_s(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={"timings": {"update_period_s": 5, "window_steps": 24, "lead_time_s": 30}}
    )
    spec = settings.models[0]
    now = T0 + 45.0  # 45 s into a wall-clock minute
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 60 + 5 * k, 5.0, 10) for k in range(12)]  # 2 r/s
            + [ArrivalWindow(spec.name, T0 + 5 * k, 5.0, 100) for k in range(9)]  # now 20 r/s
        )
        ctl = Controller(
            settings, SimFleet(load_catalog(), ManualClock(now).now), store, {spec.name: []}
        )
        forecast = await ctl.forecast_for(spec.name, now, 24)
        # The climb inside the current minute is seen at once, and 24 steps of 5 s come back.
        assert forecast == [pytest.approx(24.0)] * 24
    finally:
        await store.close()


async def test_spilled_requests_decide_pooling_and_the_capacity_target(tmp_path: Path) -> None:
    """Under the default ``auto``, the step plans stand-alone until spill is measured in
    time, then pooled, with spill's measured price as the capacity target's; spill that
    misses RT_max takes both back. The launch count follows: pooled capacity and a
    target below the peak buy fewer instances for the same load."""
    settings = load_settings(overrides={"offerings": {"types": ["c5.large"], "markets": ["spot"]}})
    spec = settings.models[0]
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(spec, load_catalog(), ["c5.large"], [Market.SPOT], lat, 90.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        ctl = Controller(
            settings, SimFleet(load_catalog(), lambda: T0), store, {spec.name: options}
        )
        first = ctl.config_for(spec)
        assert not first.pooled and first.spill_cost_per_request is None
        await ctl.record_spills({spec.name: SpillCounts(total=100, within=95, cost=100 * 2e-5)})
        warm = ctl.config_for(spec)
        assert warm.pooled and warm.spill_cost_per_request == pytest.approx(2e-5)
        for _ in range(5):  # spill slows down past RT_max
            await ctl.record_spills({spec.name: SpillCounts(total=200, within=0, cost=4e-3)})
        slow = ctl.config_for(spec)
        assert not slow.pooled and slow.spill_cost_per_request is None
    finally:
        await store.close()


async def test_the_last_hours_misses_are_what_rises_may_still_spend(tmp_path: Path) -> None:
    settings = load_settings()
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/m.db", upgrade=True)
    try:
        ctl = Controller(settings, SimFleet(load_catalog(), lambda: T0), store, {spec.name: []})
        assert ctl.state.of(spec.name).misses == MissTally(0, 0)
        await ctl.record_misses({spec.name: MissTally(10_000, 40, 100_000, 90)})
        assert ctl.state.of(spec.name).misses == MissTally(10_000, 40, 100_000, 90)
        cfg = ctl.config_for(spec)
        left = rise_allowance(cfg.rise_miss_share, ctl.state.of(spec.name).misses)
        assert left == pytest.approx(0.75 * (1 - spec.slo.sl_min) - 0.004)
    finally:
        await store.close()


async def test_the_capacity_target_buys_for_less_than_the_peak(tmp_path: Path) -> None:
    """Windows that peak once a minute: with spill in time and priced, the step plans for
    the newsvendor quantile of each minute's windows and launches fewer instances."""
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["spot"]},
            "planner": {"pooled_capacity": False},
        }
    )
    spec = settings.models[0]
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(spec, load_catalog(), ["c5.large"], [Market.SPOT], lat, 90.0)
    cap = options[0].capacity_rps
    # spill at twice an instance's price per request: cover the median window (q = 0.5)
    c_o = options[0].price_per_hour / 3600.0 / best_capacity(options[0])
    launched: list[int] = []
    for spills in (None, SpillCounts(total=100, within=100, cost=100 * 2 * c_o)):
        store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/{len(launched)}.db", upgrade=True)
        try:
            # 11 windows a minute at 4 instances' worth, one at 12
            windows = [
                ArrivalWindow(
                    spec.name, T0 - 3600 + 5 * k, 5.0, int((12 if k % 12 == 0 else 4) * cap * 5)
                )
                for k in range(720)
            ]
            await store.add_arrivals(windows)
            fleet = SimFleet(load_catalog(), lambda: T0)
            ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=60.0)
            if spills is not None:
                await ctl.record_spills({spec.name: spills})
            await ctl.step(T0)
            launched.append(len(await fleet.list()))
        finally:
            await store.close()
    assert launched[0] >= 12 and launched[1] <= launched[0] / 2, launched


class _FlatWithARise(Forecaster):
    """Forecasts the median; foresees a rise to ``RISE`` r/s from step 2 on."""

    chance: ClassVar[float] = 0.9
    RISE: ClassVar[float] = 0.0

    def _forecast(self, history: History, steps: int) -> FloatArray:
        return np.full(steps, np.median(history.observed))

    def rises(self, history: History, steps: int) -> RiseOutlook | None:
        chance = np.where(np.arange(steps) >= 2, self.chance, 0.0)
        return RiseOutlook(chance, np.where(chance > 0, self.RISE, 0.0))


@pytest.mark.parametrize(("chance", "ahead"), [(1.0, True), (0.9, False)])
async def test_the_daemon_buys_ahead_for_a_rise_its_forecaster_foresees_when_likely(
    tmp_path: Path, chance: float, ahead: bool
) -> None:
    """The rises a forecaster foresees reach the plan: bought for (a ``rise-ahead``
    decision) at a chance that pays: with spill not yet priced, only a certain rise."""
    from mark.control import online_predictor

    settings = load_settings(overrides={"predictor": {"model": "last"}})
    spec = settings.models[0]
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(spec, load_catalog(), ("c5.large",), (Market.ON_DEMAND,), lat, 90.0)
    capacity = max(o.capacity_rps for o in options)
    clock = ManualClock(T0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        peak = 3 * capacity  # an hour at one instance's worth; three times that once
        await store.add_arrivals(
            [
                ArrivalWindow(
                    spec.name, T0 - 3600 + 5 * k, 5.0, int((peak if k == 360 else capacity) * 5)
                )
                for k in range(720)
            ]
        )
        online = online_predictor(settings)
        _FlatWithARise.chance, _FlatWithARise.RISE = chance, peak
        online.model = _FlatWithARise().fit(History(np.ones(3), np.datetime64(int(T0 // 60), "m")))
        online.last_fit = int(T0 // 60)
        ctl = Controller(
            settings,
            SimFleet(load_catalog(), clock.now),
            store,
            {spec.name: options},
            predictors={spec.name: online},
        )
        (res,) = await ctl.step(clock.now())
        actions = [d.action for d in await store.decisions(0, 1e12)]
        assert ("rise-ahead" in actions) is ahead, actions
        assert len(res.launched) == (3 if ahead else 1), res.launched
    finally:
        await store.close()


async def test_load_outrunning_the_plan_is_planned_for_before_the_next_step(
    tmp_path: Path,
) -> None:
    """``react``: two 5 s windows above what the last plan was made for and what the fleet
    carries plan at once (a decision says why) while spill answers in time; windows at the
    planned rate do not; and the switch is off."""
    catalog = load_catalog()
    for early in (True, False):
        settings = load_settings(
            overrides={
                "offerings": {"types": ["c5.large"], "markets": ["on-demand"]},
                "timings": {"early_steps": early},
            }
        )
        spec = settings.models[0]
        lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
        options = build_options(spec, catalog, ["c5.large"], [Market.ON_DEMAND], lat, 90.0)
        clock = ManualClock(T0)
        fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
        store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s{early}.db", upgrade=True)
        try:
            rate = options[0].capacity_rps  # steady: about one instance's worth
            await store.add_arrivals(
                [
                    ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5))
                    for k in range(720)
                ]
            )
            ctl = Controller(settings, fleet, store, {spec.name: options})
            (first,) = await ctl.step(clock.now())
            bought = len(first.launched)
            assert first.error is None and bought >= 1

            # Windows at the planned rate: no early step.
            await store.add_arrivals(
                [ArrivalWindow(spec.name, T0 + 5 * k, 5.0, int(rate * 5)) for k in range(2)]
            )
            clock.advance(10)
            assert await ctl.react(clock.now()) == []

            # The load sextuples for two windows: the step runs now, not at T0 + 60, once
            # spill is measured to answer in time (before, a shortfall is misses: the SLO
            # monitor's).
            await store.add_arrivals(
                [
                    ArrivalWindow(spec.name, T0 + 10 + 5 * k, 5.0, int(6 * rate * 5))
                    for k in range(2)
                ]
            )
            clock.advance(10)
            assert await ctl.react(clock.now()) == []
            await ctl.record_spills({spec.name: SpillCounts(100, 99, 0.002)})
            got = await ctl.react(clock.now())
            if not early:
                assert got == []
                continue
            (res,) = got
            assert res.error is None and len(res.launched) >= 1  # bought for the new load
            plans = await store.plans(spec.name)
            assert len(plans) == 2
            latest = max(plans, key=lambda p: p.at)
            assert latest.at == clock.now()
            assert any(d.action == "early-step" for d in latest.decisions)
            # The early step was itself a plan: the same windows do not trigger again.
            clock.advance(2)
            assert await ctl.react(clock.now()) == []
        finally:
            await store.close()


async def test_a_version_rolls_then_one_never_ready_turns_back(tmp_path: Path) -> None:
    """The controller's roll on a simulated fleet with agents' health: version 2's
    instances are bought and, once ready, version 1's drain and end; version 3's never
    get ready, so the roll turns back to 2 (the daemon is told) and 3's instances go."""
    from mark.control.health import HealthTracker

    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"], "standby_types": []},
            "timings": {"cooldown_s": 5000, "warm_start_s": None, "boot_deadline_s": 300},
        }
    )
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(spec, catalog, ["c5.large"], [Market.ON_DEMAND], lat, 90.0)
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    health = HealthTracker()
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, 100) for k in range(720)]
        )
        ctl = Controller(settings, fleet, store, {spec.name: options})
        ctl.health = health.view
        drained = _Draining(fleet)
        ctl.draining = drained
        told: list[str] = []
        ctl.rollouts.on_version = lambda back: told.append(back.version)

        ok: set[str | None] = set()  # versions whose agents answer ready

        async def sync() -> None:  # the daemon's agent sync, as the health tracker sees it
            live = [i for i in await fleet.list() if i.state is InstanceState.RUNNING]
            serving = [i.instance_id for i in live if i.version in ok]
            health.observe(clock.now(), [i.instance_id for i in live], serving)

        async def step() -> None:
            await sync()
            await ctl.step(clock.now())

        async def live_versions() -> list[str]:
            listed = await fleet.list()
            return sorted(i.version or "" for i in listed if i.state is InstanceState.RUNNING)

        ok.add("1")
        await step()  # version 1 (the spec's) bought
        clock.advance(60)
        await step()
        first = await live_versions()
        assert first and set(first) == {"1"}

        ctl.roll_to(spec.model_copy(update={"version": "2"}), clock.now())
        await step()  # the plan, without version 1's instances, buys version 2's
        clock.advance(30)
        await step()
        assert set(await live_versions()) == {"1"}  # 2's are booting; 1 serves on
        clock.advance(40)
        ok.add("2")
        await step()  # 2's ready: 1's drain and end
        assert set(await live_versions()) == {"2"} and drained.retired
        clock.advance(60)
        await step()
        assert spec.name not in ctl.rollouts.under_way  # over

        ctl.roll_to(spec.model_copy(update={"version": "3"}), clock.now())
        await step()  # buys 3's, which never report ready
        for _ in range(7):
            clock.advance(60)
            await step()
        assert told == ["2"] and ctl.settings.models[0].version == "2"
        assert set(await live_versions()) == {"2"}
        actions = [d.action for d in await store.decisions(0, 1e12)]
        assert actions.index("rollout") < actions.index("rollback")
    finally:
        await store.close()
