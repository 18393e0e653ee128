"""Pooled capacity: what a pool of instances carries within the SLO, and plans made with it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.control_state import ControlState, Member, Snapshot, StepConfig
from provisioner.greedy import PlannerOption, plan_greedy
from provisioner.perf_model import (
    InstancePerf,
    capacity_under_slo,
    pooled_capacity,
    simulate_queue,
    tail_latency,
)
from provisioner.pooling import capacity_in_pool, fleet_size, plan_pooled
from provisioner.standby_step import standby_pool_step
from provisioner.step import plan_step

RT, SL = 0.6, 0.98
CPU = InstancePerf(1 / 4.73, 1, 0.0)  # Inception-v3 on a c5.large (paper profile): 211 ms


def _option(perf: InstancePerf, market: str = "spot", price: float = 0.029) -> PlannerOption:
    return PlannerOption(
        "c5.large",
        market,
        price,
        capacity_under_slo(perf, RT, SL),
        latency_s=perf.batch_time_s,
        pool=pooled_capacity(perf, RT, SL),
    )


def test_a_pool_carries_more_per_instance_than_one_alone_and_still_meets_the_slo() -> None:
    alone = capacity_under_slo(CPU, RT, SL)
    pool = dict(pooled_capacity(CPU, RT, SL))
    assert alone < pool[2] < pool[8] <= pool[32] <= CPU.throughput
    assert pool[8] > 2 * alone  # M/D/1 at the 98th percentile idles most of a lone server
    # Checked on other draws: 8 pooled servers at 97 % of that rate meet the percentile.
    unit = np.cumsum(np.random.default_rng(7).exponential(1.0, size=40_000))
    rate = 0.97 * 8 * pool[8]
    pooled = replace(CPU, servers=8)
    assert tail_latency(simulate_queue(pooled, unit / rate), SL) <= RT
    # ...which 8 separate queues could not: each would get rate/8, far past its capacity.
    assert tail_latency(simulate_queue(CPU, unit / (rate / 8)), SL) > RT


def test_capacity_in_pool_interpolates_and_never_drops_with_size() -> None:
    opt = PlannerOption("x", "spot", 1.0, 2.0, pool=((2, 3.0), (4, 2.9), (8, 5.0)))
    assert capacity_in_pool(opt, 1) == 2.0
    assert capacity_in_pool(opt, 2) == 2.9  # the noisy dip at 4 caps the value at 2
    assert capacity_in_pool(opt, 6) == 2.9 + (5.0 - 2.9) * 2 / 4
    assert capacity_in_pool(opt, 100) == 5.0
    sizes = [capacity_in_pool(opt, n) for n in range(1, 20)]
    assert sizes == sorted(sizes)
    assert capacity_in_pool(replace(opt, pool=()), 50) == 2.0


def test_pooled_plan_buys_fewer_instances_and_its_pool_covers_the_load() -> None:
    opt = _option(CPU)
    forecast = [40.0] * 10
    alone = plan_greedy(forecast, [], [opt], slo_s=RT, tau_steps=1)
    pooled = plan_pooled(forecast, [], [opt], slo_s=RT, tau_steps=1)
    n_alone, n_pooled = fleet_size(alone), fleet_size(pooled)
    assert n_alone == 25  # 40 / 1.66 r/s
    assert n_pooled < n_alone / 2
    # The fleet it buys, as a pool of its own size, carries the forecast.
    assert n_pooled * capacity_in_pool(opt, n_pooled) >= 40.0


def test_a_plan_is_topped_up_to_the_pool_that_carries_it() -> None:
    """NASNet's profiles (``provisioner.pool_batching``): a p2.xlarge alone carries 0.06 r/s,
    two batching together 8.3 each. For 5 r/s one p2 would do at the pool figure, which a
    pool of one does not earn, so the largest consistent size is 1 (five c5.4xlarge, $3.40
    an hour); two p2.xlarge, $1.80, hold as a pool of two and carry it."""
    p2 = PlannerOption(
        "p2.xlarge", "on-demand", 0.9, 0.06, latency_s=0.632, pool=((2, 8.3), (4, 11.2), (8, 11.9))
    )
    c5 = PlannerOption(
        "c5.4xlarge", "on-demand", 0.68, 1.24, latency_s=0.321, pool=((2, 1.9), (4, 2.4), (8, 2.8))
    )
    forecast = [5.0] * 10
    alone = plan_greedy(forecast, [], [p2, c5], slo_s=1.0, tau_steps=1)
    assert alone.launches() == {("c5.4xlarge", "on-demand"): 5}
    plan = plan_pooled(forecast, [], [p2, c5], slo_s=1.0, tau_steps=1)
    assert plan.launches() == {("p2.xlarge", "on-demand"): 2}
    assert plan.cost_per_hour < alone.cost_per_hour
    assert 2 * capacity_in_pool(p2, 2) >= 5.0


@settings(max_examples=40, deadline=None)
@given(
    rates=st.lists(st.floats(0.0, 300.0), min_size=3, max_size=8),
    price_big=st.floats(0.1, 2.0),
)
def test_pooled_plans_are_consistent(rates: list[float], price_big: float) -> None:
    """Whatever the forecast: every step from tau on is covered by the plan's capacity at
    the pool size it assumed, and that size is no more than the fleet it buys now."""
    small = replace(_option(CPU), pool=((2, 2.8), (4, 3.6), (8, 4.2), (16, 4.4)))
    big = PlannerOption(
        "p2.xlarge", "on-demand", price_big, 51.0, latency_s=0.15, pool=((2, 52.0), (8, 54.0))
    )
    plan = plan_pooled(rates, [], [small, big], slo_s=RT, tau_steps=1)
    n = fleet_size(plan)
    for item in plan.now():
        base = small if item.option.key == small.key else big
        assumed = [
            k for k in range(1, n + 1) if capacity_in_pool(base, k) == item.option.capacity_rps
        ]
        assert assumed, "every option is rated at a pool size no larger than the fleet"
    assert plan.capacity_at(1) >= rates[1] - 1e-6


def test_plan_step_pools_unless_told_not_to() -> None:
    opt = _option(CPU)
    cfg = StepConfig(step_s=60.0, tau_steps=1, boot_s=60.0, window_steps=5)
    snap = Snapshot("m", 1000.0, (40.0,) * 5, 40.0, (opt,), ())
    pooled = plan_step(snap, ControlState(), cfg, RT)
    alone = plan_step(snap, ControlState(), replace(cfg, pooled=False), RT)
    assert sum(x.count for x in alone.launches) == 25
    assert sum(x.count for x in pooled.launches) < 12


def test_standbys_stop_once_the_pooled_fleet_carries_the_load() -> None:
    """A fleet sized at pooled capacity counts as covering the load; rated one by one it
    would look short and keep started standbys running for nothing."""
    opt = _option(CPU)
    n = 10
    load = n * capacity_in_pool(opt, n) * 0.99
    fleet = tuple(
        Member(f"s{i}", "m", "c5.large", "spot", "serving", "ready", 0.0, 0.029) for i in range(n)
    )
    standby = Member("t", "m", "t3.large", "on-demand", "standby", "running", 0.0, 0.0832)
    cfg = StepConfig(
        step_s=60.0,
        tau_steps=1,
        boot_s=60.0,
        standby_type="t3.large",
        standby_price=0.0832,
        standby_capacity_rps=1.0,
    )
    snap = Snapshot("m", 1000.0, (load,) * 5, load, (opt,), (*fleet, standby))
    stop = standby_pool_step(snap, ControlState(), cfg, fleet, load).stop
    assert stop is not None and stop.instance_ids == ("t",)
    stop = standby_pool_step(snap, ControlState(), replace(cfg, pooled=False), fleet, load).stop
    assert stop is None
