"""The oracle forecast: the window's true per-minute peaks, and what a planner does with them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from mark.sim.models import paper_model
from mark.sim.oracle_forecast import OracleForecast
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig, Simulation
from mark.sim.workloads import Workload, surge_workload
from predictor.base import History
from predictor.baselines import LastValue

EPOCH = 1_700_000_010.0  # 30 s before a clock minute: the trace's minutes are not the clock's


def _history(workload: Workload, minutes: int) -> History:
    """``minutes`` clock minutes from the first whole one in ``workload`` (their values do
    not matter to the oracle, only where they end)."""
    first = int(np.ceil(workload.epoch / 60))
    return History(np.ones(minutes), np.datetime64(first, "m"))


def test_it_forecasts_the_next_minutes_true_peaks_and_holds_the_last_past_the_end() -> None:
    per_second = np.concatenate([np.full(600, 10.0), np.full(120, 50.0), np.full(180, 20.0)])
    per_second[702] = 80.0  # one busy second: its clock-aligned 5 s window (700-704) is 56
    w = Workload("steps", per_second, EPOCH, 0, per_second.size)
    history = _history(w, 5)  # the first whole clock minute is trace second 30; ends at 330
    got = OracleForecast(w).forecast(history, 12)
    # Clock minutes from trace second 330: [330, 390) ... [810, 870), then past the end
    # (the trace's last 30 s are no whole minute). 10 r/s to 600, 50 to 720, 20 after.
    assert got.tolist() == [10.0, 10.0, 10.0, 10.0, 50.0, 50.0, 56.0, 20.0, 20.0] + [20.0] * 3


async def test_a_perfect_forecast_buys_before_the_surge_where_the_last_value_cannot() -> None:
    w = surge_workload(base_rps=20.0, surge=0.8, hours=0.75, surge_at_s=1200, ramp_s=30)
    # Declines on (they are opt-in): a rise met late then shows as misses, not only spill.
    cfg = SimConfig(warmup_s=600, decline_share=0.9)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, seed=3)
    model = paper_model("inception-v3")
    history = _history(w, 60)
    results = {}
    for name, forecaster in {
        "oracle": OracleForecast(w),
        "last": LastValue().fit(history),
    }.items():
        sim = Simulation(w, model, POLICIES["mark"], cfg, arrivals=arrivals, forecaster=forecaster)
        results[name] = r = await sim.run()
        assert r.within_slo >= model.sl_min
    serving = {
        n: [k for t, k, _, _ in r.timeline if w.t0 + 1140 <= t <= w.t0 + 1230]
        for n, r in results.items()
    }
    # The oracle's fleet has grown for the surge when it arrives (+80 %, within the
    # forecast's sanity clip of twice the peak seen); the last value learns of it after,
    # so the rise's first minutes go to Lambda or miss RT_max.
    assert min(serving["oracle"][-1:]) > max(serving["last"])
    assert results["oracle"].spilled <= results["last"].spilled
    assert results["oracle"].missed < results["last"].missed / 4


def test_simulate_takes_oracle_as_the_predictor() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mark.cli.main",
            "simulate",
            "--trace",
            "surge",
            "--hours",
            "0.3",
            "--warmup-s",
            "900",
            "--base-rps",
            "10",
            "--policies",
            "mark",
            "--predictor",
            "oracle",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["predictor"] == "oracle"
    assert "true per-minute peaks" in done.stderr
    assert doc["results"][0]["cost_total"] >= doc["results"][0]["bound"] > 0
