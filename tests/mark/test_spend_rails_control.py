"""The spend rails hold a plan, an SLO-monitor backup and a standby start, and the fleet
bound a plan's launches: each recorded, as a decision a user sees."""

from __future__ import annotations

import math
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog
from mark.clock import ManualClock
from mark.config import BudgetSpec, ModelSpec, Settings, load_settings
from mark.control import LIVE, Controller, build_options
from mark.ports import (
    InstanceInfo,
    InstanceRole,
    InstanceState,
    InterruptionNotice,
    NoticeKind,
)
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, SqlStore, open_store
from provisioner.greedy import PlannerOption

T0 = 1_700_000_000.0


LATENCY = {
    "c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080}),
    "c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045}),
}


async def _rig(
    settings: Settings, tmp_path: Path
) -> tuple[ModelSpec, list[PlannerOption], float, ManualClock, SimFleet, SqlStore]:
    """The first model's options on its offerings (c5 profiles), the most one instance
    carries, a clock at ``T0``, a simulated fleet booting in 60 s, an empty store."""
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {t: LATENCY[t] for t in settings.offerings.types}
    options = build_options(
        spec, catalog, settings.offerings.types, settings.offerings.markets, lat, 90.0
    )
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    return spec, options, max(o.capacity_rps for o in options), clock, fleet, store


async def test_plan_backup_and_standby_start_are_held_at_the_spend_rail(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={
            "offerings": {
                "types": ["c5.large", "c5.xlarge"],
                "markets": ["on-demand", "spot"],
                "standby_types": ["t3.large"],
            },
            "budget": {"max_hourly_per_model": None, "max_hourly_cluster": None},
        }
    )
    spec, options, top, clock, fleet, store = await _rig(settings, tmp_path)
    catalog = fleet.catalog

    def price(i: InstanceInfo) -> float:
        return catalog.offering(i.instance_type, i.market).price_per_hour

    async def spend() -> float:
        return sum(price(i) for i in await fleet.list() if i.state in LIVE)

    async def rail_rows() -> list[str]:
        return [d.reason for d in await store.decisions(0, 1e12) if d.action == "spend-rail"]

    try:
        await store.add_arrivals(
            [
                ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(2.5 * top * 5))
                for k in range(720)
            ]
        )
        ctl = Controller(
            settings,
            fleet,
            store,
            {spec.name: options},
            boot_s=60.0,
            standby_capacity={spec.name: 40.0},
        )
        (first,) = await ctl.step(clock.now())
        assert any(i.market.value == "spot" for i in first.launched)
        clock.advance(61)
        await ctl.step(clock.now())  # booted: the standby pool is stopped
        standbys = [i for i in await fleet.list() if i.role is InstanceRole.STANDBY]
        assert standbys and {i.state for i in standbys} == {InstanceState.STOPPED}
        assert await rail_rows() == []

        # The user's rail: what runs now and not a cent more than the cheapest instance.
        limit = await spend() + 0.01
        ctl.settings = settings.model_copy(
            update={"budget": BudgetSpec(max_hourly_per_model=limit, max_hourly_cluster=None)}
        )

        # 1. A plan for four times the load launches nothing; the hold is a decision.
        await store.add_arrivals(
            [
                ArrivalWindow(spec.name, clock.now() - 60 + 5 * k, 5.0, int(10 * top * 5))
                for k in range(12)
            ]
        )
        clock.advance(1)
        (held,) = await ctl.step(clock.now())
        assert held.launched == []
        assert held.plan_id is not None
        (plan,) = await store.plans(spec.name, limit=1)
        assert any(d.action == "spend-rail" for d in plan.decisions)
        assert await spend() <= limit

        # 2. The SLO monitor's backup is held too.
        rows = len(await rail_rows())
        assert await ctl.check_slo(clock.now(), {spec.name: [math.inf] * 100}) == []
        assert len(await rail_rows()) == rows + 1
        assert await spend() <= limit

        # 3. A spot notice: the standbys' start would pass the rail, so none starts.
        victim = next(i for i in first.launched if i.market.value == "spot")
        notice = InterruptionNotice(
            victim.instance_id, NoticeKind.INTERRUPTION, clock.now(), clock.now() + 120
        )
        rows = len(await rail_rows())
        assert await ctl.on_interruption(notice, clock.now()) == []
        reasons = (await rail_rows())[rows:]
        assert any("t3.large" in r for r in reasons), reasons
        assert {i.state for i in await fleet.list() if i.role is InstanceRole.STANDBY} == {
            InstanceState.STOPPED
        }
        assert await spend() <= limit
        assert 'mark_spend_rail_hits_total{model="digits"}' in ctl.prometheus()
    finally:
        await store.close()


async def test_launches_past_the_fleet_bound_are_a_warned_and_counted_decision(
    tmp_path: Path,
) -> None:
    """At ``offerings.max_instances`` the controller launches up to the bound and says so."""
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"], "max_instances": 2},
            "budget": {"max_hourly_per_model": None, "max_hourly_cluster": None},
        }
    )
    spec, options, top, clock, fleet, store = await _rig(settings, tmp_path)
    try:
        # An hour at ten instances' worth of load.
        await store.add_arrivals(
            [
                ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(10 * top * 5))
                for k in range(720)
            ]
        )
        ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=60.0)
        (first,) = await ctl.step(clock.now())
        assert len(first.launched) == 2
        assert len([i for i in await fleet.list() if i.state in LIVE]) == 2
        bound = [d for d in await store.decisions(0, 1e12) if d.action == "fleet-bound"]
        assert len(bound) == 1 and bound[0].instance_type == "c5.large"
        assert bound[0].count >= 1 and "offerings.max_instances (2)" in bound[0].reason
        assert 'mark_fleet_bound_hits_total{model="digits"} 1' in ctl.prometheus()
    finally:
        await store.close()
