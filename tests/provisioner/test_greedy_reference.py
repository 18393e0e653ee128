"""The vectorised, copy-batching planner picks what a literal Algorithm 1 picks."""

from collections import Counter

import numpy as np

from provisioner.greedy import PlannerOption, RunningInstance, plan_greedy
from provisioner.random_instances import random_instance


def literal_algorithm_1(
    forecast: list[float],
    running: list[RunningInstance],
    options: list[PlannerOption],
    tau: int = 0,
) -> Counter[str]:
    """One instance per iteration, plain Python, 60-s steps; as the paper's, except that
    keeping a running instance costs every step until its span ends, and that the steps
    from ``tau`` on are planned first, then the steps before it by the running instances
    left, each covering those steps alone."""
    cands: list[tuple[str, PlannerOption, float]] = [
        (r.instance_id, r.option, 0.0) for r in running
    ] + [(o.label, o, o.launch_overhead) for o in options]
    used: set[int] = set()
    unmet = list(forecast)
    chosen: Counter[str] = Counter()
    for lo, hi, bridge in ((tau, len(unmet), False), (0, tau, True)):
        while any(u > 1e-9 for u in unmet[lo:hi]):
            start = next(t for t in range(lo, hi) if unmet[t] > 1e-9)
            end = start
            while end + 1 < hi and unmet[end + 1] > 1e-9:
                end += 1
            best, best_cost = -1, float("inf")
            for k, (_, opt, overhead) in enumerate(cands):
                if k in used or (bridge and k >= len(running)):
                    continue
                served = sum(min(opt.capacity_rps, unmet[t]) for t in range(start, end + 1)) * 60
                # A kept running instance bills from lo, idle until its span.
                steps = end + 1 - lo if k < len(running) else end - start + 1
                cost = (overhead + steps * opt.price_per_hour / 60) / served
                if cost < best_cost:
                    best, best_cost = k, cost
            if best < 0:  # nothing can serve this step before tau: a shortfall
                unmet[start] = 0.0
                continue
            name, opt, _ = cands[best]
            if best < len(running):
                used.add(best)
            chosen[name] += 1
            for t in range(0, hi):
                if best < len(running) or t >= tau:
                    unmet[t] -= opt.capacity_rps
    return chosen


def test_same_choices_as_the_literal_algorithm() -> None:
    batched = bridged = 0
    for seed in range(60):
        forecast, options = random_instance(seed)
        rng = np.random.default_rng(seed)
        running = [
            RunningInstance(f"i-{n}", options[int(rng.integers(len(options)))])
            for n in range(int(rng.integers(0, 4)))
        ]
        for tau in (0, 2, 5):
            plan = plan_greedy(forecast, running, options, tau_steps=tau)
            got: Counter[str] = Counter()
            for item in plan.items:
                got[item.instance_id or item.option.label] += item.count
                batched += item.count > 1
                bridged += item.bridge_until is not None
            assert got == literal_algorithm_1(forecast, running, options, tau), (seed, tau)
    assert batched > 0  # the copy-batching shortcut was exercised
    assert bridged > 0  # and a running instance kept only until tau


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


P2 = PlannerOption("p2.xlarge", "on-demand", 0.90, 52.0, launch_overhead=0.03)
C5 = PlannerOption("c5.large", "on-demand", 0.085, 2.8, launch_overhead=0.003)


def test_a_large_instance_needed_only_before_tau_bridges_to_a_small_one() -> None:
    """After a surge: the forecast is a few r/s above two p2.xlarge. Only the third p2,
    already running, can serve the first two steps, so it is kept; from step 2 on two
    c5.large cover the rest for a tenth of its price, and the plan counts it no longer."""
    running = [RunningInstance(f"i-{n}", P2) for n in range(3)]
    forecast = [107.0, 109.0] + [108.0] * 58
    plan = plan_greedy(forecast, running, [P2, C5], tau_steps=2)
    assert plan.retire == ()
    bridge = [i for i in plan.items if i.bridge_until is not None]
    assert [i.instance_id for i in bridge] == ["i-2"] and bridge[0].bridge_until == 2
    assert plan.launches() == {("c5.large", "on-demand"): 2}
    assert plan.capacity_at(1) == 3 * 52.0
    assert plan.capacity_at(2) == 2 * 52.0 + 2 * 2.8
    assert any(line.startswith("keep i-2 until step 2 ") for line in plan.explain())


def test_a_bridge_still_the_cheapest_after_tau_is_kept_on() -> None:
    """The forecast needs a whole third p2.xlarge throughout: keeping it on beats 20
    c5.large, so nothing is launched and it counts at every step."""
    running = [RunningInstance(f"i-{n}", P2) for n in range(3)]
    plan = plan_greedy([150.0] * 60, running, [P2, C5], tau_steps=2)
    assert plan.launches() == {} and plan.retire == ()
    assert all(i.bridge_until is None for i in plan.items)
    assert plan.capacity_at(30) == 3 * 52.0
