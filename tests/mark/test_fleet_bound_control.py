"""At ``offerings.max_instances`` the controller launches up to the bound and says so."""

from __future__ import annotations

from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog
from mark.clock import ManualClock
from mark.config import load_settings
from mark.control import LIVE, Controller, build_options
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, open_store

T0 = 1_700_000_000.0


async def test_launches_past_the_fleet_bound_are_a_warned_and_counted_decision(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"], "max_instances": 2},
            "budget": {"max_hourly_per_model": None, "max_hourly_cluster": None},
        }
    )
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(
        spec, catalog, settings.offerings.types, settings.offerings.markets, lat, 90.0
    )
    top = max(o.capacity_rps for o in options)
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
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
