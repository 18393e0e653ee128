"""Turn a profile and a price into what the planner compares: a ``PlannerOption``.

C_i is the rate one instance sustains *within the SLO*, not its raw
throughput: the paper's SLO is "SL_min of requests within RT_max", so capacity
comes from ``capacity_under_slo`` on the instance's queue model. O_i is what the
instance costs while it boots (price × boot time), as in the paper. The pool
capacities (C_i per instance when k serve together) let the planner count what
pooled dispatch gains (``provisioner.pooling``).
"""

from __future__ import annotations

from provisioner.greedy import PlannerOption
from provisioner.perf_model import InstancePerf, capacity_under_slo, pooled_capacity

DEFAULT_BOOT_S = 90.0
"""Seconds from launch to serving; the paper measured 7.4 s for a GPU to be
ready after boot, and EC2 boots take about a minute."""


def planner_option(
    instance_type: str,
    market: str,
    price_per_hour: float,
    perf: InstancePerf,
    *,
    rt_max_s: float,
    sl_min: float,
    boot_s: float = DEFAULT_BOOT_S,
    seed: int = 0,
    pool: tuple[tuple[int, float], ...] | None = None,
) -> PlannerOption:
    """An offering as the planner sees it for one model and SLO; ``pool`` replaces the
    pool capacities measured at ``perf``'s batching (``provisioner.pool_batching``)."""
    alone = capacity_under_slo(perf, rt_max_s, sl_min, seed=seed)
    if alone <= 0:
        pool = ()  # it carries nothing alone: never planned, so its pools are not measured
    elif pool is None:
        pool = pooled_capacity(perf, rt_max_s, sl_min, seed=seed)
    return PlannerOption(
        instance_type=instance_type,
        market=market,
        price_per_hour=price_per_hour,
        capacity_rps=alone,
        launch_overhead=price_per_hour * boot_s / 3600.0,
        latency_s=perf.batch_time_s,
        pool=pool,
    )
