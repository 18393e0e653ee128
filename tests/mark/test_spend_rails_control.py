"""The spend rails hold a plan, an SLO-monitor backup and a standby start, each recorded."""

from __future__ import annotations

import math
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog
from mark.clock import ManualClock
from mark.config import BudgetSpec, load_settings
from mark.control import LIVE, Controller, build_options
from mark.ports import InstanceInfo, InstanceRole, InstanceState, InterruptionNotice, NoticeKind
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, open_store

T0 = 1_700_000_000.0


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
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {
        "c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080}),
        "c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045}),
    }
    options = build_options(
        spec, catalog, settings.offerings.types, settings.offerings.markets, lat, 90.0
    )
    top = max(o.capacity_rps for o in options)
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)

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
