"""Twice a pinned fleet's capacity for a minute, on loopback: Lambda takes the excess, nothing
is lost.

The fault suite's harness (``tests/faults/harness.py``) runs a daemon in the local
world with the control loop off and one c5.large launched by hand, its speed pinned
(``local.reference_profile`` × ``local.slowdown``, the fault suite's: T_b = 160 ms +
40 ms · b), so the fleet and its capacity do not depend on this machine. Its capacity
C is what the planner would rate it at: N_batch and W_batch by the dispatcher's rule
(``serving_batching``) and the largest Poisson rate at which SL_min of requests finish
within RT_max (``capacity_under_slo``). The fault suite's client then sends
``--factor`` × C open-loop (seeded Poisson arrivals) for ``--seconds``, and the row
says what became of every request, counted exactly as the fault suite counts (sent,
on EC2, on Lambda, explicit errors, lost, answered twice, within RT_max). Nothing is
asserted: the numbers are printed.

    .venv/bin/python benchmarks/bench_overload.py [--factor 2] [--seconds 60] [--seed 7]

Run it on a quiet machine: the agent, the Lambda runtimes, the daemon and the client
share its cores (the pinned speeds keep the fleet's capacity fixed, not the host's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.faults, run as a script

from bouncer.latency import BatchLatency
from mark.catalog import Market
from mark.control.recorder import Recorder
from mark.daemon import Running
from mark.ports import InstanceState, LaunchRequest
from provisioner.batching import serving_batching
from provisioner.perf_model import InstancePerf, capacity_under_slo
from tests.faults.harness import (
    C5_LARGE_SLOWDOWN,
    MODEL,
    REFERENCE,
    Fault,
    Live,
    run_scenario,
    scenario_settings,
)


def capacity(rt_max_s: float, sl_min: float) -> tuple[float, int, float]:
    """C of one pinned c5.large under the SLO, with its N_batch and W_batch."""
    latency = BatchLatency.parse(REFERENCE).scaled(C5_LARGE_SLOWDOWN)
    n, w = serving_batching(latency, rt_max_s)
    perf = InstancePerf(batch_time_s=latency(n), batch_size=n, window_s=w)
    return capacity_under_slo(perf, rt_max_s, sl_min), n, w


async def one_instance(run: Running) -> None:
    """The pinned fleet: one on-demand c5.large, serving before the load starts, recorded
    in the store as launched by hand (so the orphan count does not count it)."""
    fleet = run.world.fleet
    assert fleet is not None and run.catalog is not None
    (inst,) = await fleet.launch(LaunchRequest(MODEL, "c5.large", Market.ON_DEMAND))
    recorder = Recorder(run.store, run.catalog)
    await recorder.set_state(inst, InstanceState.RUNNING, time.time(), "the pinned fleet")
    dispatcher = run.models[MODEL].dispatcher
    assert dispatcher is not None
    deadline = time.monotonic() + 120
    while not dispatcher.backends:
        if time.monotonic() > deadline:
            raise RuntimeError("the c5.large's agent never came up")
        await asyncio.sleep(0.5)


def no_fault() -> Fault:
    async def fault(live: Live) -> str:
        return "none (overload only)"

    return fault


async def main(factor: float, seconds: float, seed: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mark-overload-") as tmp:
        data_dir = Path(tmp)
        os.environ["MARK_DATA_DIR"] = str(data_dir)  # where agents and runtimes look
        settings = scenario_settings(data_dir, {"local": {"control_loop": False}})
        slo = settings.models[0].slo
        rt_max_s = slo.rt_max_ms / 1000.0
        cap, n, w = capacity(rt_max_s, slo.sl_min)
        rate = factor * cap
        print(
            f"fleet: 1 c5.large (T_b = {REFERENCE} x {C5_LARGE_SLOWDOWN:g}), N_batch {n}, "
            f"W_batch {w * 1000:.0f} ms: C = {cap:.1f} r/s within RT_max {rt_max_s:g} s at "
            f"SL_min {slo.sl_min:g}; sending {factor:g} x C = {rate:.1f} r/s for {seconds:g} s"
        )
        t = await run_scenario(
            f"{factor:g}x capacity, {seconds:g} s",
            settings,
            f"0:{rate:.2f},{seconds:g}:{rate:.2f}",
            seed=seed,
            fault_at_s=0,
            fault=no_fault(),
            before_load=one_instance,
            check=False,
        )
        served = t.on_ec2 + t.on_lambda
        print(
            f"\nsent {t.sent}, on EC2 {t.on_ec2} ({t.on_ec2 / seconds:.1f} r/s), "
            f"on Lambda {t.on_lambda} ({t.on_lambda / max(served, 1):.0%} of those served), "
            f"errors {t.errors}, lost {t.lost}, twice {t.twice}, wrong {t.wrong}, "
            f"orphans {t.orphans}, within RT_max {t.within_rt_max:.1%}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=float, default=2.0, help="load as a multiple of C")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    parser.add_argument("--seed", type=int, default=7, help="seed of the Poisson arrivals")
    args = parser.parse_args()
    asyncio.run(main(args.factor, args.seconds, args.seed))
