"""Regression: a steady load with the daemon's default predictor must not run away.

The daemon once forecast 25 r/s as 33 → 368 → 3,941 → 43,610 r/s in four
minutes: the controller handed the predictor 1,500 minutes of history in which
every minute before the daemon started counted as zero load, so the refit rule
("a day of history") fitted the LSTM at the first step on a day of zeros and a
few minutes of load, and its level feature turned the load into an explosion.
This drives the real controller, store, telemetry and default predictor on
virtual time for 10+ control steps at P_u = 60 s and 15 s.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog
from mark.clock import ManualClock
from mark.config import load_settings
from mark.control import LIVE, Controller, build_options, online_predictor
from mark.serve.telemetry import Telemetry
from mark.sim.fleet import SimFleet
from mark.state import open_store

T0 = 1_800_000_000.0
RATE = 25.0


@pytest.mark.parametrize("update_period_s", [60.0, 15.0])
async def test_steady_load_keeps_forecast_and_fleet_at_the_load(
    tmp_path: Path, update_period_s: float
) -> None:
    settings = load_settings(
        overrides={"data_dir": str(tmp_path), "timings": {"update_period_s": update_period_s}}
    )
    spec = settings.models[0]
    catalog = load_catalog()
    measured = BatchLatency.from_mapping({1: 0.004, 8: 0.012, 32: 0.040})
    types = settings.offerings.types
    options = build_options(
        spec, catalog, types, settings.offerings.markets, {t: measured for t in types}, 10.0
    )
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 10.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    online = online_predictor(settings)  # the default: LSTM behind the refit schedule
    ctl = Controller(
        settings,
        fleet,
        store,
        {spec.name: options},
        boot_s=10.0,
        predictors={spec.name: online},
    )
    tel = Telemetry(spec.name, spec.slo.rt_max_ms, started_at=T0)
    rng = np.random.default_rng(7)
    peak = 0.0
    cheapest = min(options, key=lambda o: o.price_per_hour / o.capacity_rps)
    try:
        steps = math.ceil(8 * 60 / update_period_s)  # eight minutes of load
        for k in range(steps):
            # one control period of Poisson arrivals at 25 r/s, drained every 5 s
            for _ in range(int(update_period_s / 5)):
                n = int(rng.poisson(RATE * 5))
                for t in np.sort(rng.uniform(clock.now(), clock.now() + 5, n)):
                    tel.arrival(float(t))
                peak = max(peak, n / 5)
                clock.advance(5)
                windows, _ = tel.drain(clock.now())
                await store.add_arrivals(windows)
            (res,) = await ctl.step(clock.now())
            if online._task is not None:  # a refit started: let it land, as it would
                await asyncio.wait_for(online._task, 300)
            assert res.error is None
            top = max(res.forecast)
            assert top <= 1.5 * peak, f"step {k}: forecast {top:.1f} r/s, observed peak {peak}"
            assert top >= peak, f"step {k}: forecast {top:.1f} r/s below the observed {peak}"
            live = [i for i in await fleet.list() if i.state in LIVE]
            need = math.ceil(1.5 * peak / cheapest.capacity_rps)
            assert len(live) <= need + 1, f"step {k}: {len(live)} instances for {peak} r/s"
        assert online.model is None, "no model is fitted on minutes of data"
    finally:
        await store.close()
