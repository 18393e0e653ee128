"""Replay a planner step by step over a known forecast, priced like the MILP.

The greedy planner decides only what to run *now*; its cost over a horizon is
what you pay when you call it every step with the remaining forecast and the
fleet it left behind. Pricing that replay with the MILP's objective (price per
step for each instance, launch overhead for each new one) makes the two
directly comparable: the replay is a feasible MILP schedule, so
greedy cost ≥ MILP cost always, and the ratio is greedy's price of being online.
Retirement here is immediate (no cool-down) to compare the policies, not the
guards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from provisioner.greedy import PlannerOption, RunningInstance, plan_greedy


@dataclass(frozen=True)
class Replay:
    cost: float
    fleet_sizes: tuple[int, ...]
    launches: int


def replay_greedy(
    forecast: Sequence[float],
    options: Sequence[PlannerOption],
    *,
    slo_s: float | None = None,
    step_s: float = 60.0,
    defer_launches: bool = True,
) -> Replay:
    fleet: list[RunningInstance] = []
    cost = 0.0
    sizes: list[int] = []
    launched = 0
    for t in range(len(forecast)):
        plan = plan_greedy(
            forecast[t:],
            fleet,
            options,
            slo_s=slo_s,
            step_s=step_s,
            tau_steps=0,
            defer_launches=defer_launches,
        )
        kept = set(plan.kept())
        fleet = [r for r in fleet if r.instance_id in kept]
        for item in plan.launch_items():
            for _ in range(item.count):
                fleet.append(RunningInstance(f"i-{launched}", item.option))
                launched += 1
                cost += item.option.launch_overhead
        cost += sum(r.option.price_per_hour for r in fleet) * step_s / 3600.0
        sizes.append(len(fleet))
    return Replay(cost, tuple(sizes), launched)
