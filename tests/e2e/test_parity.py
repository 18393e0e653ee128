"""Parity: one seeded arrival sequence through the local world and through the simulator.

The local world serves it for real: the daemon's frontend and dispatcher, one
agent process emulating a c5.large (a fixed reference profile, so the test
does not depend on how fast this machine happens to be), its Bouncer, and
real awslambdaric runtimes for the spill. The control loop is off, so the
fleet is exactly that one instance in both worlds and only the data plane is
compared. The rate ramps from a quarter of the instance's capacity to twice
it, so the Bouncer must reject and Lambda absorb the excess.

The simulator replays the same arrivals (as the client sent them) through its
engine (``mark.sim.replay``) with what the daemon served with: the agent's
T_b curve, the dispatcher's N_batch and W_batch, and the spill function's
latency as measured on the warm runtimes before the run.

Tolerances, and why:

- share on instances and share spilled: ±5 points. The rules are the same
  code; what differs is time. A batch here holds up to 16 requests, so one
  batch admitted in one world and rejected in the other moves 0.4 % of the
  requests; the event loop, the agent's HTTP hop and the 2-core machine's
  scheduling shift dispatch by milliseconds, which near the Bouncer's edge
  flips some tens of batches over the overload phase.
- share declined (the daemon's miss budget, the same ``MissBudget`` in both worlds,
  asked at the same spills): ±5 points, as spilled.
- share within RT_max: ±5 points. The simulator finishes every admitted
  batch exactly when the Bouncer predicted; a real batch also pays the hop
  back to the frontend, which the dispatcher's transport allowance covers
  only on average.
- p50 and p99: within 25 % (and 60 ms) of the simulator's. At low load a
  request waits out most of W_batch (600 ms here) in both worlds; the
  milliseconds of HTTP, JSON and loop scheduling that only the real world
  pays are small beside it, while Lambda's measured latency varies run to
  run by tens of milliseconds on this machine.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bouncer.miss_budget import DECLINED_MARK, MissBudget
from mark.catalog import Market, load_catalog
from mark.cloud.local.lambda_ import LocalLambda
from mark.config import Settings, load_settings
from mark.daemon import Running, start, stop
from mark.demo import ensure_demo_model
from mark.ports import LaunchRequest
from mark.sim.replay import ReplayServer, Shares, replay
from tests.e2e.test_local_world import admin_key

RT_MAX_MS = 1000.0
# T_b on this machine that every agent emulates, ×4 for a c5.large (8 / vCPUs): T_b =
# 40 ms + 10 ms · b there, so N_batch = 16, W_batch = 600 ms, capacity 80 r/s.
REFERENCE = ",".join(f"{b}:{(10.0 + 2.5 * b) / 1000.0:.4f}" for b in (1, 2, 4, 8, 16, 32))
PROFILE = "0:20,10:20,35:160,45:160"  # a quarter of capacity, then a ramp to twice it
SEED = 11
LAMBDA_CONCURRENCY = 4

SHARE_TOL = 0.05
LATENCY_REL_TOL = 0.25
LATENCY_ABS_TOL_S = 0.060


def _settings(data_dir: Path) -> Settings:
    settings = load_settings(
        overrides={
            "data_dir": str(data_dir),
            "api": {"port": 0},
            "offerings": {"types": ["c5.large"], "standby_types": []},
            "local": {
                "boot_delay_s": 0,
                "control_loop": False,
                "lambda_concurrency": LAMBDA_CONCURRENCY,
                "reference_profile": {"digits": REFERENCE},
            },
        }
    )
    spec = settings.models[0]
    spec = spec.model_copy(update={"slo": spec.slo.model_copy(update={"rt_max_ms": RT_MAX_MS})})
    return settings.model_copy(update={"models": (spec,)})


async def _one_instance(run: Running) -> ReplayServer:
    """Launch the fleet's one instance and wait until the dispatcher serves on it."""
    assert run.world.fleet is not None
    await run.world.fleet.launch(LaunchRequest("digits", "c5.large", Market.ON_DEMAND, 1))
    dispatcher = run.models["digits"].dispatcher
    assert dispatcher is not None
    deadline = time.monotonic() + 90
    while not dispatcher.backends:
        assert time.monotonic() < deadline, "the instance never served"
        await asyncio.sleep(0.2)
    b = next(iter(dispatcher.backends.values()))
    return ReplayServer(b.instance_id, b.instance_type, b.latency, b.n_batch, b.w_batch_s)


async def _lambda_latency(run: Running) -> float:
    """The spill function's latency for one request, median of warm invocations."""
    serverless = run.world.serverless
    assert serverless is not None
    row = np.zeros((1, 8, 8), dtype=np.float32).tolist()
    await asyncio.gather(*(serverless.invoke("digits", [row]) for _ in range(LAMBDA_CONCURRENCY)))
    took = []
    for _ in range(30):
        t = time.perf_counter()
        await serverless.invoke("digits", [row])
        took.append(time.perf_counter() - t)
    return statistics.median(took)


def _real(outcomes: list[dict[str, object]]) -> Shares:
    lat, where = [], []
    for o in outcomes:
        ok = o["status"] == 200
        lat.append(float(o["latency_s"]) if ok else math.inf)  # type: ignore[arg-type]
        if ok:
            where.append("lambda" if o["served_by"] == "lambda" else "instance")
        else:
            where.append("declined" if DECLINED_MARK in str(o["error"]) else "failed")
    return Shares.of(lat, where, RT_MAX_MS / 1000.0)


def _close(real: float, sim: float) -> bool:
    return abs(real - sim) <= max(LATENCY_REL_TOL * sim, LATENCY_ABS_TOL_S)


@pytest.mark.slow
@pytest.mark.alone  # its latencies are compared with the simulator's: no other test beside it
async def test_the_simulator_serves_a_seeded_ramp_as_the_local_world_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_demo_model(tmp_path)
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path))
    settings = _settings(tmp_path)
    slo = settings.models[0].slo
    run = await start(settings)
    out = tmp_path / "outcomes.json"
    try:
        server = await _one_instance(run)
        lambda_s = await _lambda_latency(run)
        assert isinstance(run.world.serverless, LocalLambda)
        queue_timeout_s = run.world.serverless.queue_timeout_s
        # An admin key: the client sees who served each request (X-Mark-Served-By).
        monkeypatch.setenv("MARK_API_KEY", await admin_key(run))
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.parity_load", run.url, PROFILE, str(SEED), str(out)
        )
        assert await client.wait() == 0
    finally:
        await stop(run)
    outcomes = json.loads(out.read_text())
    real = _real(outcomes)
    arrivals = np.sort(np.array([float(o["sent_s"]) for o in outcomes]))
    sim = replay(
        arrivals,
        RT_MAX_MS / 1000.0,
        [server],
        lambda_latency_s=lambda_s,
        lambda_concurrency=LAMBDA_CONCURRENCY,
        lambda_prices=load_catalog().lambda_prices,
        lambda_queue_timeout_s=queue_timeout_s,
        budget=MissBudget(slo.sl_min, slo.decline_share),  # the daemon's, for this model
    )
    rows = [
        ("requests", f"{real.requests}", f"{sim.requests}"),
        ("on instances", f"{real.on_instances:.1%}", f"{sim.on_instances:.1%}"),
        ("spilled", f"{real.spilled:.1%}", f"{sim.spilled:.1%}"),
        ("failed", f"{real.failed:.1%}", f"{sim.failed:.1%}"),
        ("declined", f"{real.declined:.1%}", f"{sim.declined:.1%}"),
        ("within RT_max", f"{real.within_rt_max:.1%}", f"{sim.within_rt_max:.1%}"),
        ("p50", f"{real.p50_s * 1e3:.0f} ms", f"{sim.p50_s * 1e3:.0f} ms"),
        ("p99", f"{real.p99_s * 1e3:.0f} ms", f"{sim.p99_s * 1e3:.0f} ms"),
    ]
    table = "\n".join(f"| {k} | {a} | {b} |" for k, a, b in [("", "local", "sim"), *rows])
    print(
        f"\nN_batch {server.n_batch}, W_batch {server.w_batch_s * 1e3:.0f} ms, "
        f"Lambda {lambda_s * 1e3:.1f} ms\n{table}"
    )
    assert real.spilled > 0.2 and sim.spilled > 0.2, f"the ramp did not force spill\n{table}"
    assert real.failed == 0.0, f"requests failed in the local world\n{table}"
    assert abs(real.on_instances - sim.on_instances) <= SHARE_TOL, table
    assert abs(real.spilled - sim.spilled) <= SHARE_TOL, table
    assert abs(real.declined - sim.declined) <= SHARE_TOL, table
    assert abs(real.within_rt_max - sim.within_rt_max) <= SHARE_TOL, table
    assert _close(real.p50_s, sim.p50_s), table
    assert _close(real.p99_s, sim.p99_s), table
