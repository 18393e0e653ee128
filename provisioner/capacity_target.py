"""How much of a step's load to buy instances for when spill takes the rest.

The forecast is each step's peak 5 s rate, the paper's series. A capacity ``c``
serves ``min(c, r_w)`` of each window's rate ``r_w`` and spill takes the rest,
at ``c_λ`` per request. One more request/s of capacity costs ``c_o`` per second
of the step: the cheapest offering's price per request at full use,
``price / (3600·C)``. It saves ``c_λ`` for each second of the step in which
``r_w > c``. The expected cost is least where ``P(r_w > c) = c_o / c_λ``, i.e. at
the ``q = 1 − c_o/c_λ`` quantile of the step's window rates: the newsvendor's
critical ratio, with Lambda as the cost of being short and idle capacity the
cost of being long. When instances cost nearly what spill does, ``q`` falls
towards 0 and spill takes most of each step; when spill is dear, ``q`` → 1 and
the plan covers the peak, as the paper does.

The forecaster predicts the peak, not that quantile. The ratio of a step's
``q``-quantile window rate to its peak is measured on the last hour of windows
(the median over its minutes, so one burst does not move it) and scales the
forecast. It assumes the within-minute shape of the next hour is that of the
last, which holds for the traces' second-scale noise, not for a burst shorter
than a minute that is about to start.

Used only once spill is measured to answer in time (``provisioner.spill_evidence``):
otherwise the excess would be misses, not Lambda charges. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from provisioner.greedy import PlannerOption
from provisioner.spill_evidence import SpillEvidence

MIN_WINDOWS = 6
"""A minute with fewer windows recorded (the daemon was starting) is not measured."""


def best_capacity(option: PlannerOption) -> float:
    """The most an instance of ``option`` carries within the SLO: alone, or in its best pool."""
    return max([option.capacity_rps, *(c for _, c in option.pool)])


def cheapest_per_request(options: Sequence[PlannerOption]) -> float | None:
    """``c_o``: the least price per request among ``options`` at full use (alone or in
    their best pool); None when none can serve."""
    per_request = [
        o.price_per_hour / 3600.0 / best_capacity(o) for o in options if best_capacity(o) > 0
    ]
    return min(per_request) if per_request else None


def critical_quantile(spill_cost_per_request: float, options: Sequence[PlannerOption]) -> float:
    """``1 − c_o/c_λ``: the share of a step's windows whose rate instances should cover.

    ``c_o`` is the least price per request among ``options`` at full use; 1.0 (cover
    the peak) when there is no usable offering or spill costs nothing measurable."""
    c_o = cheapest_per_request(options)
    if c_o is None or spill_cost_per_request <= 0.0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - c_o / spill_cost_per_request))


def quantile_to_peak(minutes: Sequence[Sequence[float]], q: float) -> float:
    """Median over ``minutes`` (each a minute's window rates) of its ``q``-quantile rate over
    its peak; 1.0 when no minute has enough windows and some load."""
    if q >= 1.0:
        return 1.0
    ratios = []
    for rates in minutes:
        if len(rates) < MIN_WINDOWS:
            continue
        peak = max(rates)
        if peak > 0.0:
            ratios.append(float(np.quantile(np.asarray(rates, dtype=float), q)) / peak)
    return statistics.median(ratios) if ratios else 1.0


def spill_price(enabled: bool, spill: SpillEvidence) -> float | None:
    """Spill's measured price per request when the plan may leave load to it: enabled,
    and spill measured to answer in time (``SpillEvidence.in_time``); else None."""
    return spill.in_time_price() if enabled else None


def capacity_target(
    forecast: Sequence[float],
    minutes: Sequence[Sequence[float]],
    spill_cost_per_request: float | None,
    options: Sequence[PlannerOption],
) -> tuple[list[float], float]:
    """The load per step to plan instances for, and the factor applied to ``forecast``
    (1.0 while spill's price is unknown)."""
    if spill_cost_per_request is None:
        return list(forecast), 1.0
    ratio = quantile_to_peak(minutes, critical_quantile(spill_cost_per_request, options))
    return [f * ratio for f in forecast], ratio
