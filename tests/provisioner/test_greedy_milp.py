"""Algorithm 1 and the MILP optimum: INFaaS's worked example and random instances."""

import statistics

import numpy as np
import pytest

from provisioner.greedy import NoFeasibleOption, PlannerOption, RunningInstance, plan_greedy
from provisioner.milp import prune_dominated, solve_min_cost
from provisioner.random_instances import random_instance
from provisioner.rolling import replay_greedy

# INFaaS (Romero et al., ATC'21) worked example: cost per hour, one one-hour step.
A = PlannerOption("A", "on-demand", price_per_hour=1, capacity_rps=5, latency_s=0.200)
B = PlannerOption("B", "on-demand", price_per_hour=3, capacity_rps=100, latency_s=0.020)
C = PlannerOption("C", "on-demand", price_per_hour=16, capacity_rps=800, latency_s=0.015)
INFAAS = [A, B, C]
HOUR = 3600.0


@pytest.mark.parametrize(
    ("qps", "slo_s", "expected", "cost"),
    [
        (10, 0.300, {("A", "on-demand"): 2}, 2),
        (10, 0.050, {("B", "on-demand"): 1}, 3),
        (1000, 0.300, {("B", "on-demand"): 2, ("C", "on-demand"): 1}, 22),
    ],
)
def test_infaas_example_greedy_and_milp(
    qps: float, slo_s: float, expected: dict[tuple[str, str], int], cost: float
) -> None:
    plan = plan_greedy([qps], [], INFAAS, slo_s=slo_s, step_s=HOUR, tau_steps=0)
    assert plan.launches() == expected
    assert plan.cost_per_hour == pytest.approx(cost)
    best = solve_min_cost([qps], INFAAS, slo_s=slo_s, step_s=HOUR)
    assert best.cost == pytest.approx(cost)


def test_options_that_cannot_meet_the_slo_are_excluded_and_explained() -> None:
    plan = plan_greedy([10], [], INFAAS, slo_s=0.050, step_s=HOUR, tau_steps=0)
    assert plan.excluded == (A,)
    assert any(line.startswith("exclude A/on-demand") for line in plan.explain())
    with pytest.raises(NoFeasibleOption):
        plan_greedy([10], [], INFAAS, slo_s=0.010, tau_steps=0)


def test_running_instance_is_kept_for_free_and_extra_retired() -> None:
    running = [RunningInstance("i-b", B), RunningInstance("i-c", C)]
    # 90 req/s: the running B covers it with no launch overhead; C is not needed.
    plan = plan_greedy([90] * 10, running, INFAAS, slo_s=0.3, tau_steps=0)
    assert plan.kept() == ("i-b",)
    assert plan.retire == ("i-c",)
    assert plan.launches() == {}
    (item,) = plan.items
    assert item.reason.span_start == 0 and item.reason.span_end == 9
    assert "keep i-b B/on-demand" in item.explain()


def test_launch_overhead_favours_a_running_instance_over_a_cheaper_new_one() -> None:
    slow_old = PlannerOption("old", "on-demand", 1.2, 10)
    cheap_new = PlannerOption("new", "on-demand", 1.0, 10, launch_overhead=0.5)
    running = [RunningInstance("i-old", slow_old)]
    # Over 10 one-minute steps the overhead (0.5) dwarfs the saving (0.2/h x 10 min).
    plan = plan_greedy([10] * 10, running, [cheap_new], tau_steps=0)
    assert plan.kept() == ("i-old",)
    # Over 10 hours the cheaper one pays for its launch.
    plan = plan_greedy([10] * 10, running, [cheap_new], step_s=HOUR, tau_steps=0)
    assert plan.launches() == {("new", "on-demand"): 1}
    assert plan.retire == ("i-old",)


def test_plan_targets_the_forecast_from_tau_on() -> None:
    # A spike in the next 5 minutes cannot be met by launches; the plan sizes for t0 + tau.
    plan = plan_greedy([1000] * 5 + [50] * 55, [], INFAAS, slo_s=0.3)
    assert plan.launches() == {("B", "on-demand"): 1}
    assert plan.items[0].reason.span_start == 5
    assert plan.shortfall == tuple((k, 1000.0) for k in range(5))
    assert "short at step 0: 1000.0 r/s uncovered" in plan.explain()


def test_running_instance_needed_before_tau_is_kept() -> None:
    # Load ends in 3 minutes: no launch, but the running B must carry it until then.
    plan = plan_greedy([90] * 3 + [0] * 57, [RunningInstance("i-b", B)], INFAAS, slo_s=0.3)
    assert plan.kept() == ("i-b",)
    assert (plan.items[0].reason.span_start, plan.items[0].reason.span_end) == (0, 2)
    assert plan.launches() == {} and plan.shortfall == ()


def test_booting_instance_counts_only_once_ready() -> None:
    booting = RunningInstance("i-b", B, ready_in_steps=3)
    plan = plan_greedy([50] * 60, [booting], INFAAS, slo_s=0.3)
    assert plan.kept() == ("i-b",)
    assert plan.launches() == {}
    assert [k for k, _ in plan.shortfall] == [0, 1, 2]


def test_without_offerings_the_uncovered_load_is_reported() -> None:
    plan = plan_greedy([200] * 10, [RunningInstance("i-b", B)], [], tau_steps=0)
    assert plan.kept() == ("i-b",)
    assert plan.shortfall == tuple((k, 100.0) for k in range(10))


def test_greedy_covers_every_step() -> None:
    rng = np.random.default_rng(7)
    forecast = rng.uniform(0, 3000, size=60)
    plan = plan_greedy(forecast.tolist(), [], INFAAS, tau_steps=0)
    assert all(plan.capacity_at(t) >= f for t, f in enumerate(forecast))
    assert plan.capacity_rps >= forecast[0]


def test_capacity_needed_later_is_launched_later() -> None:
    plan = plan_greedy([50] * 10 + [150] * 10, [], INFAAS, slo_s=0.3, tau_steps=0)
    assert plan.launches() == {("B", "on-demand"): 1}
    (later,) = [i for i in plan.items if plan.is_deferred(i)]
    assert later.reason.span_start == 10
    assert plan.capacity_at(10) >= 150
    assert any(line.startswith("later (step 10) launch") for line in plan.explain())
    # The paper's Algorithm 1 launches it now.
    paper = plan_greedy(
        [50] * 10 + [150] * 10, [], INFAAS, slo_s=0.3, tau_steps=0, defer_launches=False
    )
    assert sum(paper.launches().values()) == len(plan.items)


def test_greedy_is_never_below_the_optimum_and_close_on_random_instances() -> None:
    ratios, paper_ratios = [], []
    for seed in range(25):
        forecast, options = random_instance(seed)
        best = solve_min_cost(forecast, options).cost
        greedy = replay_greedy(forecast, options).cost
        paper = replay_greedy(forecast, options, defer_launches=False).cost
        # Both replays are feasible schedules of the MILP, so neither can beat it.
        assert greedy >= best - 1e-6
        assert paper >= best - 1e-6
        ratios.append(greedy / best)
        paper_ratios.append(paper / best)
    print(
        f"greedy/MILP over 25 instances: median {statistics.median(ratios):.3f}, "
        f"worst {max(ratios):.3f}; paper's launch-all: median "
        f"{statistics.median(paper_ratios):.3f}, worst {max(paper_ratios):.3f}"
    )
    assert statistics.median(ratios) < 1.1
    assert max(ratios) < 1.5
    assert statistics.median(ratios) <= statistics.median(paper_ratios)


def test_milp_uses_running_instances_without_overhead_and_can_retire_them() -> None:
    old = PlannerOption("old", "on-demand", 1.2, 10, launch_overhead=0.5)
    new = PlannerOption("new", "on-demand", 1.0, 10, launch_overhead=0.5)
    short = solve_min_cost([10] * 10, [old, new], {old.key: 1})
    assert short.cost == pytest.approx(1.2 * 10 / 60)
    assert short.launches.sum() == 0
    # Demand that drops to zero: the running instance is retired, not paid for.
    drop = solve_min_cost([10] * 5 + [0] * 5, [old, new], {old.key: 1})
    assert drop.cost == pytest.approx(1.2 * 5 / 60)
    # Over long steps the cheaper new one pays for its launch.
    long = solve_min_cost([10] * 10, [old, new], {old.key: 1}, step_s=HOUR)
    assert long.cost == pytest.approx(10 * 1.0 + 0.5)


def test_dominated_options_are_pruned_without_changing_the_optimum() -> None:
    old_b = PlannerOption("B-old", "on-demand", price_per_hour=3.5, capacity_rps=90)
    twin_b = PlannerOption("B-twin", "spot", price_per_hour=3, capacity_rps=100)
    assert prune_dominated([A, B, C, old_b, twin_b]) == [A, B, C]
    assert prune_dominated([A, B, old_b], protected={old_b.key}) == [A, B, old_b]
    for seed in range(5):
        forecast, options = random_instance(seed)
        worse = [
            PlannerOption(
                o.instance_type + "-old",
                o.market,
                o.price_per_hour * 1.1,
                o.capacity_rps * 0.9,
                o.launch_overhead,
            )
            for o in options
        ]
        plain = solve_min_cost(forecast, options)
        assert plain.optimal and plain.lower_bound == plain.cost
        assert solve_min_cost(forecast, options + worse).cost == pytest.approx(plain.cost)
