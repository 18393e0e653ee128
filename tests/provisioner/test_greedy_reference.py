"""The vectorised, copy-batching planner picks what a literal Algorithm 1 picks."""

from collections import Counter

import numpy as np

from provisioner.greedy import PlannerOption, RunningInstance, plan_greedy
from provisioner.random_instances import random_instance


def literal_algorithm_1(
    forecast: list[float], running: list[RunningInstance], options: list[PlannerOption]
) -> Counter[str]:
    """One instance per iteration, plain Python, 60-s steps, tau = 0; as the paper's,
    except that keeping a running instance costs every step until its span ends."""
    cands: list[tuple[str, PlannerOption, float]] = [
        (r.instance_id, r.option, 0.0) for r in running
    ] + [(o.label, o, o.launch_overhead) for o in options]
    used: set[int] = set()
    unmet = list(forecast)
    chosen: Counter[str] = Counter()
    while any(u > 1e-9 for u in unmet):
        start = next(t for t, u in enumerate(unmet) if u > 1e-9)
        end = start
        while end + 1 < len(unmet) and unmet[end + 1] > 1e-9:
            end += 1
        best, best_cost = -1, float("inf")
        for k, (_, opt, overhead) in enumerate(cands):
            if k in used:
                continue
            served = sum(min(opt.capacity_rps, unmet[t]) for t in range(start, end + 1)) * 60
            # A kept running instance bills from now (step 0), idle until its span.
            steps = end + 1 if k < len(running) else end - start + 1
            cost = (overhead + steps * opt.price_per_hour / 60) / served
            if cost < best_cost:
                best, best_cost = k, cost
        name, opt, _ = cands[best]
        if best < len(running):
            used.add(best)
        chosen[name] += 1
        for t in range(start, len(unmet)):
            unmet[t] -= opt.capacity_rps
    return chosen


def test_same_choices_as_the_literal_algorithm() -> None:
    batched = 0
    for seed in range(40):
        forecast, options = random_instance(seed)
        rng = np.random.default_rng(seed)
        running = [
            RunningInstance(f"i-{n}", options[int(rng.integers(len(options)))])
            for n in range(int(rng.integers(0, 4)))
        ]
        plan = plan_greedy(forecast, running, options, tau_steps=0)
        got: Counter[str] = Counter()
        for item in plan.items:
            got[item.instance_id or item.option.label] += item.count
            batched += item.count > 1
        assert got == literal_algorithm_1(forecast, running, options), seed
    assert batched > 0  # the copy-batching shortcut was exercised


def test_a_running_instance_idle_until_a_later_peak_is_retired_not_kept() -> None:
    """Keeping it would bill 40 idle steps; relaunching for the peak costs its boot."""
    opt = PlannerOption("c5.large", "on-demand", 1.0, 10.0, launch_overhead=0.05)
    forecast = [0.0] * 30 + [10.0] * 11 + [0.0] * 19
    plan = plan_greedy(forecast, [RunningInstance("i-1", opt)], [opt], tau_steps=2)
    assert plan.retire == ("i-1",)
    (item,) = plan.items
    assert not item.kept and plan.is_deferred(item) and item.reason.span_start == 30


def test_a_running_instance_needed_soon_is_kept() -> None:
    opt = PlannerOption("c5.large", "on-demand", 1.0, 10.0, launch_overhead=0.05)
    forecast = [0.0] * 2 + [10.0] * 11 + [0.0] * 47
    plan = plan_greedy(forecast, [RunningInstance("i-1", opt)], [opt], tau_steps=2)
    assert plan.retire == () and plan.kept() == ("i-1",)
