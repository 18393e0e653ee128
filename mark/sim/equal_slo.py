"""A target-tracking baseline at an equal SLO: the loosest target that meets SL_min.

The paper's baseline targets half an instance's capacity (2× over-provisioning), and
that fleet may meet the SLO with room to spare, or miss it. Compared with mark at a
different SLO, neither cost says much. So each target-tracking policy also runs with
``-equal-slo``: the over-provisioning factor is searched over ``FACTORS`` for the least
(the loosest target) whose run keeps SL_min of the window's requests within RT_max.
The search runs on the window itself, which no user could do: it is a kindness to the
baseline, stated beside its figure. Fewer instances never serve more in time, so the
share within RT_max does not rise as the factor falls, and bisection over the sorted
factors finds the least that passes. If none does, the tightest factor's run is
reported (it misses the SLO, and its row says so): the most over-provisioned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from mark.sim.results import PolicyResult

FACTORS = (16.0, 12.0, 8.0, 6.0, 5.0, 4.0, 3.0, 2.5, 2.0, 1.75, 1.5, 1.25, 1.0)
"""Over-provisioning factors tried, most instances first: target = pooled capacity × 60 / factor
invocations per instance per minute. 1.0 targets the full capacity within the SLO; the
large factors are there because target tracking has no spill: a rise within its three
datapoints and a boot queues on the instances it has (on Twitter day 10, 00:02, the load
went from 24 to 108 r/s in a minute, and at 2× a fifth of the window missed RT_max)."""

RunAt = Callable[[float], Awaitable[PolicyResult]]


def meets(result: PolicyResult, sl_min: float) -> bool:
    return result.within_slo >= sl_min


async def loosest_target(run_at: RunAt, sl_min: float) -> PolicyResult:
    """The run at the least factor in ``FACTORS`` that meets ``sl_min`` (module doc); its
    ``extra`` says the factor and how many runs the search took."""
    runs: dict[float, PolicyResult] = {}

    async def at(i: int) -> PolicyResult:
        f = FACTORS[i]
        if f not in runs:
            runs[f] = await run_at(f)
        return runs[f]

    lo, hi = 0, len(FACTORS) - 1  # FACTORS[lo] is the loosest factor known to pass
    if meets(await at(lo), sl_min):
        while lo < hi:  # invariant: FACTORS[lo] passes; those after hi are not tried
            mid = (lo + hi + 1) // 2
            if meets(await at(mid), sl_min):
                lo = mid
            else:
                hi = mid - 1
    best = runs[FACTORS[lo]]
    extra = {**best.extra, "equal_slo_runs": len(runs), "equal_slo_met": meets(best, sl_min)}
    return replace(best, extra=extra)
