"""How long the simulator takes for 24 h of the Twitter trace at request level, per policy.

Prints requests simulated, wall seconds and requests per second for each policy. The
forecaster is trained (or loaded from the cache) before timing starts: its fit is the
predictor's cost, not the simulator's. Target (issue #6): <= 120 s per policy.

    .venv/bin/python benchmarks/bench_simulator.py [--hours 24] [--policies mark,sagemaker]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from mark.sim.compare import train_forecaster
from mark.sim.models import paper_model
from mark.sim.policies import parse_policies
from mark.sim.run import SimConfig, Simulation
from mark.sim.workloads import trace_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--policies", default="mark,mark-spot,sagemaker")
    ap.add_argument("--predictor", default="seasonal")
    ap.add_argument("--model", default="inception-v3")
    args = ap.parse_args()
    w = trace_workload("twitter", hours=args.hours, start_day=10)
    cfg = SimConfig()
    cache = Path(tempfile.gettempdir()) / "mark-bench-cache"
    forecaster = train_forecaster(args.predictor, w, cfg.warmup_s, cache)
    t = time.perf_counter()
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, cfg.seed)
    print(f"arrivals: {arrivals.shape[0]:,} requests drawn in {time.perf_counter() - t:.1f} s")
    for policy in parse_policies(args.policies):
        sim = Simulation(
            w, paper_model(args.model), policy, cfg, arrivals=arrivals, forecaster=forecaster
        )
        t = time.perf_counter()
        r = asyncio.run(sim.run())
        dt = time.perf_counter() - t
        print(
            f"{policy.name:>12}: {r.requests:,} requests in {dt:.1f} s "
            f"({r.requests / dt:,.0f} req/s), cost ${r.total_cost:.2f}, "
            f"{r.within_slo:.2%} within RT_max"
        )


if __name__ == "__main__":
    main()
