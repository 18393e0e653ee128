"""Time the greedy planner: 60 forecast steps over every relevant offering.

Offerings: every on-demand and spot offering in ``mark.catalog`` of a GPU or
Inferentia type or of the c5/c6i/m5/t3 families with at least 2 GiB of
memory for the model (about 190 in the shipped catalog). Target: one plan in at most 50 ms.

The capacities are synthetic but of the right size, since only the timing is
measured: 284 r/m per 2 vCPU on CPU (Inception-v3 on c5.large, paper code),
3320 r/m per GPU (p2.xlarge with N_batch 8), 40 r/s per NeuronCore (a guess);
launch overhead = 90 s of the price. The pooled planner (the default) sees each
offering at 60 % of that rate alone, rising to 97 % in a pool of 32 (the shape
``perf_model.pooled_capacity`` measures for an M/D/1 at the SLO percentile).
The forecast is a seeded wave between about 500 and 3000 r/s, and 10 instances are already running.
The capacity target (``provisioner.capacity_target``) is timed on the same offerings and an
hour of seeded 5 s rates, as the planner runs it before planning when spill is in time.
``plan_step`` is timed whole as the daemon and the simulator call it each P_u: the foreseen
rises (a seeded outlook with chances above and below the break-even), the forecast clip,
the capacity target, the pooled planner, the guards and the spend rails.

    .venv/bin/python benchmarks/bench_planner.py [repeats=50] [--milp]

``--milp`` also solves the MILP optimum of the same hour (dominated offerings
pruned first) and compares it with greedy re-planned every step.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from mark.catalog import load_catalog
from provisioner.capacity_target import capacity_target
from provisioner.control_state import ControlState, Member, Snapshot, StepConfig
from provisioner.greedy import PlannerOption, RunningInstance, plan_greedy
from provisioner.milp import prune_dominated, solve_min_cost
from provisioner.pooling import fleet_size, plan_pooled
from provisioner.rolling import replay_greedy
from provisioner.step import plan_step

FAMILIES = {"c5", "c6i", "m5", "t3"}
BOOT_S = 90.0
POOL_SHAPE = ((2, 0.75), (4, 0.85), (8, 0.92), (16, 0.95), (32, 0.97))


def capacity_rps(vcpus: int, gpus: int, neuron_cores: int, accelerator: str) -> float:
    if accelerator == "gpu":
        return 3320 / 60 * max(gpus, 1)
    if accelerator == "inferentia":
        return 40.0 * max(neuron_cores, 1)
    return 284 / 60 * vcpus / 2


def options() -> list[PlannerOption]:
    out = []
    for o in load_catalog().offerings():
        t = o.instance_type
        if o.accelerator.value not in ("gpu", "inferentia") and t.family not in FAMILIES:
            continue
        if t.memory_mib < 2048:
            continue
        out.append(
            PlannerOption(
                instance_type=t.name,
                market=o.market.value,
                price_per_hour=o.price_per_hour,
                capacity_rps=capacity_rps(t.vcpus, t.gpus, t.neuron_cores, t.accelerator.value),
                launch_overhead=o.price_per_hour * BOOT_S / 3600,
                pool=tuple(
                    (k, capacity_rps(t.vcpus, t.gpus, t.neuron_cores, t.accelerator.value) * f)
                    for k, f in POOL_SHAPE
                ),
            )
        )
    return out


def main(repeats: int, milp: bool) -> None:
    opts = options()
    rng = np.random.default_rng(0)
    steps = np.arange(60)
    forecast = (1750 + 1250 * np.sin(steps / 9.0) + rng.normal(0, 100, 60)).clip(0).tolist()
    by_name = {(o.instance_type, o.market): o for o in opts}
    running = [RunningInstance(f"i-{n}", by_name[("c5.xlarge", "on-demand")]) for n in range(6)] + [
        RunningInstance(f"i-g{n}", by_name[("g4dn.xlarge", "spot")]) for n in range(4)
    ]
    timings = []
    plan = plan_greedy(forecast, running, opts)
    for _ in range(repeats):
        started = time.perf_counter()
        plan = plan_greedy(forecast, running, opts)
        timings.append((time.perf_counter() - started) * 1000)
    print(f"options {len(opts)}, steps {len(forecast)}, running {len(running)}")
    print(
        f"plan_greedy: median {statistics.median(timings):.1f} ms, "
        f"max {max(timings):.1f} ms over {repeats} runs (target <= 50 ms)"
    )
    print(f"plan: {len(plan.items)} items, launches {plan.launches()}, retire {len(plan.retire)}")
    alone = [replace(o, capacity_rps=o.capacity_rps * 0.6) for o in opts]
    run_alone = [
        replace(r, option=replace(r.option, capacity_rps=r.option.capacity_rps * 0.6))
        for r in running
    ]
    pooled_ms = []
    for _ in range(repeats):
        started = time.perf_counter()
        pooled = plan_pooled(forecast, run_alone, alone)
        pooled_ms.append((time.perf_counter() - started) * 1000)
    print(
        f"plan_pooled: median {statistics.median(pooled_ms):.1f} ms, "
        f"max {max(pooled_ms):.1f} ms over {repeats} runs (target <= 50 ms); "
        f"fleet {fleet_size(pooled)} instances"
    )
    # The capacity target on the same offerings: an hour of 12 five-second rates a minute.
    minutes = [list(rng.gamma(5.0, f / 5.0 / 1.3, 12)) for f in forecast]
    target_ms = []
    for _ in range(repeats):
        started = time.perf_counter()
        capacity_target(forecast, minutes, 2e-5, alone)
        target_ms.append((time.perf_counter() - started) * 1000)
    print(
        f"capacity_target: median {statistics.median(target_ms):.1f} ms, "
        f"max {max(target_ms):.1f} ms over {repeats} runs (60 minutes of 5 s rates)"
    )
    step_ms = time_plan_step(forecast, minutes, alone, running, rng, repeats)
    print(
        f"plan_step: median {statistics.median(step_ms):.1f} ms, "
        f"max {max(step_ms):.1f} ms over {repeats} runs (target <= 50 ms; rises, clip, "
        "capacity target, pooled planner, guards, rails)"
    )
    if milp:
        started = time.perf_counter()
        best = solve_min_cost(forecast, opts, time_limit_s=120)
        elapsed = time.perf_counter() - started
        greedy = replay_greedy(forecast, opts).cost
        status = "optimal" if best.optimal else f"bound ${best.lower_bound:.3f}"
        print(
            f"MILP over {len(prune_dominated(opts))} undominated offerings: ${best.cost:.3f} "
            f"({status}) in {elapsed:.1f} s; "
            f"greedy re-planned every step (fresh fleet): ${greedy:.3f}, "
            f"ratio {greedy / best.cost:.3f}"
        )


def time_plan_step(
    forecast: list[float],
    minutes: list[list[float]],
    opts: list[PlannerOption],
    running: list[RunningInstance],
    rng: np.random.Generator,
    repeats: int,
) -> list[float]:
    """``plan_step`` on a snapshot of the same hour: the running instances as ready members,
    a rise outlook with a chance per step, spill priced so the capacity target applies."""
    fleet = tuple(
        Member(
            r.instance_id,
            "m",
            r.option.instance_type,
            r.option.market,
            "serving",
            "ready",
            0.0,
            r.option.price_per_hour,
            owner="bench",
        )
        for r in running
    )
    chance = rng.uniform(0.0, 0.6, len(forecast))
    snap = Snapshot(
        model="m",
        now=3600.0,
        forecast=tuple(forecast),
        observed_peak=max(forecast) * 1.5,
        options=tuple(opts),
        fleet=fleet,
        window_minutes=tuple(tuple(m) for m in minutes),
        rise_chance=tuple(float(c) for c in chance),
        rise_rate=tuple(f * 1.8 for f in forecast),
    )
    cfg = StepConfig(step_s=60.0, tau_steps=2, boot_s=BOOT_S, spill_cost_per_request=2e-5)
    state = ControlState()
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        plan_step(snap, state, cfg, 0.6)
        out.append((time.perf_counter() - started) * 1000)
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--milp"]
    main(int(args[0]) if args else 50, "--milp" in sys.argv)
