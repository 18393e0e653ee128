"""A steady 25 r/s on `mark up`'s defaults for 6+ control steps: no runaway, no surplus fleet.

The reproduction of the runaway (25 r/s forecast as 43,609 r/s four minutes
later, 50 instances bought for it), end to end in the local world: the default
predictor, the default offerings, the real telemetry → store → controller
path, at P_u = 60 s (the default) and 15 s, both daemons side by side so the
test takes the 60 s daemon's six-and-a-bit minutes once. Each plan's forecast
must stay within 1.5× of the highest 5-second rate observed until then, and
the fleet must hold no capacity beyond what 1.5× that rate needs.
"""

from __future__ import annotations

import asyncio
import math
import shutil
from pathlib import Path

import pytest

from mark.config import load_settings
from mark.control import LIVE
from mark.daemon import Running, start, stop
from mark.demo import ensure_demo_model
from mark.demo.loadgen import run_load
from mark.demo.model import default_model_path
from mark.demo.rate_profile import RateProfile
from mark.ports import InstanceRole

RATE = 25.0
LOAD_S = 390.0  # steps at 60, 120, ..., 360 s after start: six of P_u = 60 s


async def _run(data_dir: Path, update_period_s: float) -> Running:
    settings = load_settings(
        overrides={
            "data_dir": str(data_dir),
            "api": {"port": 0},
            "timings": {"update_period_s": update_period_s},
        }
    )
    return await start(settings)


async def _check(run: Running, steps_at_least: int) -> None:
    spec = run.settings.models[0]
    plans = sorted(await run.store.plans(spec.name, limit=100), key=lambda p: p.at)
    assert len(plans) >= steps_at_least, f"only {len(plans)} control steps ran"
    windows = await run.store.arrivals(spec.name, 0, 1e12)
    assert windows, "no arrivals recorded"
    for p in plans:
        seen = [w.rate for w in windows if w.window_start + w.window_s <= p.at]
        peak = max(seen, default=0.0)
        top = max(p.forecast, default=0.0)
        assert top <= 1.5 * peak + 1e-9, (
            f"P_u={run.settings.timings.update_period_s:g}: forecast {top:.1f} r/s at "
            f"t={p.at:.0f}, observed peak {peak:.1f} r/s"
        )
    assert run.controller is not None and run.world.fleet is not None
    options = {o.key: o for o in run.controller.options[spec.name]}
    # The planner's fleet (SLO-monitor backups are the monitor's, judged by their own rule).
    live = [
        i
        for i in await run.world.fleet.list()
        if i.state in LIVE and i.role is InstanceRole.SERVING
    ]
    capacity = [options[(i.instance_type, i.market.value)].capacity_rps for i in live]
    peak = max(w.rate for w in windows)
    # Nothing beyond covering 1.5x the peak: without the last instance it would fall short.
    assert not capacity or sum(capacity) - max(capacity) < 1.5 * peak, (
        f"{len(live)} instances ({sum(capacity):.0f} r/s) for a peak of {peak:.1f} r/s"
    )


@pytest.mark.slow
async def test_steady_load_on_the_defaults_neither_runs_away_nor_overbuys(tmp_path: Path) -> None:
    built = ensure_demo_model(tmp_path / "model")
    dirs = [tmp_path / "pu60", tmp_path / "pu15"]
    for d in dirs:  # each daemon its own store and demo model (trained once, copied)
        target = default_model_path(d)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(built, target)
    runs: list[Running] = []
    try:
        for d, p_u in zip(dirs, (60.0, 15.0), strict=True):
            runs.append(await _run(d, p_u))
        profile = RateProfile.parse(f"0:{RATE:g},{LOAD_S:g}:{RATE:g}")
        results = await asyncio.gather(
            *(
                run_load(r.url, r.settings.models[0].name, profile, seed=i, api_key=r.api_key)
                for i, r in enumerate(runs)
            )
        )
        for res in results:
            assert res.summary is not None and res.summary.sent >= 0.9 * RATE * LOAD_S
        await _check(runs[0], steps_at_least=6)
        await _check(runs[1], steps_at_least=math.floor(LOAD_S / 15.0) - 2)
    finally:
        for r in runs:
            await stop(r)
