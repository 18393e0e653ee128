"""What a simulated policy cost and how it served: the figures a comparison prints.

Costs are split the way a bill is (EC2 on-demand, spot, standby, the EBS
volumes of stopped instances, Lambda); service is the fraction of requests
answered within RT_max (failed requests count as misses), latency percentiles
over every request, and how many went to Lambda. The CCDF is kept as a few
hundred points so the plot and the JSON stay small however many requests were
simulated.

Beside each policy's cost stands the whole-system lower bound of its window
and markets (``mark.sim.bound``) and ``cost / bound``; a run that missed more
than its SLO allows also gets the bound at its own misses, the one that
bounds what it paid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mark.sim.bound import Bound

CCDF_POINTS = 400


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    model: str
    workload: str
    hours: float
    rt_max_ms: float
    requests: int
    within_slo: float  # fraction of requests answered within RT_max
    p50_ms: float
    p95_ms: float
    p99_ms: float
    spilled: int
    failed: int
    costs: Mapping[str, float]  # on-demand, spot, standby, ebs, lambda
    instance_hours: Mapping[str, float]
    timeline: Sequence[tuple[float, int, float, int]] = field(repr=False)
    load: Sequence[float] = field(repr=False)  # per-minute peak rate from load_t0
    load_t0: float = 0.0
    ccdf: Sequence[tuple[float, float]] = field(default=(), repr=False)  # (ms, P[L > ms])
    extra: Mapping[str, Any] = field(default_factory=dict)
    per_minute: Sequence[tuple[float, int, float, float]] = field(default=(), repr=False)
    """(minute start, requests, p99 ms, share within RT_max) for latency over time."""
    bound: Bound | None = field(default=None, repr=False)
    """The lower bound on the cost of any run of this window in the policy's markets that
    meets the SLO (shared by the policies with the same markets)."""
    bound_own: Bound | None = field(default=None, repr=False)
    """When this run missed more than the SLO allows: the bound with its own misses as
    the budget, the one that bounds its cost."""

    @property
    def total_cost(self) -> float:
        return float(sum(self.costs.values()))

    @property
    def missed(self) -> int:
        """Requests not answered within RT_max (late, failed or never served)."""
        return self.requests - round(self.within_slo * self.requests)

    @property
    def cost_over_bound(self) -> float | None:
        return _ratio(self.total_cost, self.bound)

    @property
    def cost_over_bound_own(self) -> float | None:
        return _ratio(self.total_cost, self.bound_own)

    @property
    def ec2_cost(self) -> float:
        """Everything but Lambda (EBS, too, is billed as EC2)."""
        return float(sum(v for k, v in self.costs.items() if k != "lambda"))

    def row(self) -> dict[str, Any]:
        """The flat figures (no series), for tables, CSV and JSON."""
        return {
            "policy": self.policy,
            "model": self.model,
            "workload": self.workload,
            "hours": round(self.hours, 3),
            "requests": self.requests,
            "cost_total": round(self.total_cost, 4),
            "cost_on_demand": round(self.costs.get("on-demand", 0.0), 4),
            "cost_spot": round(self.costs.get("spot", 0.0), 4),
            "cost_standby": round(self.costs.get("standby", 0.0), 4),
            "cost_ebs": round(self.costs.get("ebs", 0.0), 4),
            "cost_lambda": round(self.costs.get("lambda", 0.0), 4),
            "within_slo": round(self.within_slo, 5),
            # null when more than that share of requests failed (no finite latency)
            "p50_ms": _round(self.p50_ms, 1),
            "p95_ms": _round(self.p95_ms, 1),
            "p99_ms": _round(self.p99_ms, 1),
            "spilled": self.spilled,
            "failed": self.failed,
            "missed": self.missed,
            "instance_hours": {k: round(v, 3) for k, v in sorted(self.instance_hours.items())},
            **self._bound_row(),
            **{k: v for k, v in self.extra.items()},
        }

    def _bound_row(self) -> dict[str, Any]:
        if self.bound is None:
            return {}
        row: dict[str, Any] = {
            "bound": _round(self.bound.value, 4),
            "cost_over_bound": _round(self.cost_over_bound, 3),
        }
        if self.bound_own is not None:
            row["bound_own_misses"] = _round(self.bound_own.value, 4)
            row["cost_over_bound_own_misses"] = _round(self.cost_over_bound_own, 3)
        return row

    def to_json(self) -> dict[str, Any]:
        d = self.row()
        d["ccdf"] = [list(p) for p in self.ccdf]
        d["timeline"] = [list(r) for r in self.timeline]
        d["per_minute"] = [list(r) for r in self.per_minute]
        return d


def _ratio(cost: float, bound: Bound | None) -> float | None:
    if bound is None or not math.isfinite(bound.value):
        return None
    if bound.value <= 0:
        return math.inf if cost > 0 else 1.0
    return cost / bound.value


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def _ccdf(lat_ms: NDArray[np.float64]) -> list[tuple[float, float]]:
    finite = np.sort(lat_ms[np.isfinite(lat_ms)])
    n_all = lat_ms.shape[0]
    if n_all == 0 or finite.shape[0] == 0:
        return []
    qs = 1.0 - np.logspace(0, -6, CCDF_POINTS)  # dense in the tail
    qs = np.clip(qs, 0.0, 1.0)
    pts = []
    for q in np.unique(qs):
        v = float(np.quantile(finite, q))
        frac = float(np.count_nonzero(lat_ms > v)) / n_all
        pts.append((round(v, 3), frac))
    return pts


def summarise(
    *,
    policy: str,
    model: str,
    workload: str,
    hours: float,
    rt_max_s: float,
    latencies: NDArray[np.float64],
    spilled: int,
    failed: int,
    costs: Mapping[str, float],
    instance_hours: Mapping[str, float],
    timeline: Sequence[tuple[float, int, float, int]],
    load: Sequence[float],
    load_t0: float,
    extra: Mapping[str, Any],
    arrivals: NDArray[np.float64] | None = None,
) -> PolicyResult:
    lat = np.where(np.isnan(latencies), math.inf, latencies)  # never served = missed
    n = int(lat.shape[0])
    ms = lat * 1000.0
    within = float(np.count_nonzero(lat <= rt_max_s + 1e-9)) / n if n else 1.0

    def pct(q: float) -> float:
        return float(np.quantile(ms, q, method="higher")) if n else 0.0

    return PolicyResult(
        policy=policy,
        model=model,
        workload=workload,
        hours=hours,
        rt_max_ms=rt_max_s * 1000.0,
        requests=n,
        within_slo=within,
        p50_ms=pct(0.5),
        p95_ms=pct(0.95),
        p99_ms=pct(0.99),
        spilled=spilled,
        failed=failed,
        costs=dict(costs),
        instance_hours=dict(instance_hours),
        timeline=list(timeline),
        load=list(load),
        load_t0=load_t0,
        ccdf=_ccdf(ms),
        extra=dict(extra),
        per_minute=_per_minute(arrivals, lat, rt_max_s) if arrivals is not None else [],
    )


def _per_minute(
    arrivals: NDArray[np.float64], lat: NDArray[np.float64], rt_max_s: float
) -> list[tuple[float, int, float, float]]:
    if arrivals.shape[0] == 0:
        return []
    t0 = float(arrivals[0]) - float(arrivals[0]) % 60
    minute = ((arrivals - t0) // 60).astype(np.int64)
    bounds = np.searchsorted(minute, np.arange(minute[-1] + 2))
    out = []
    for k in range(bounds.shape[0] - 1):
        x = lat[bounds[k] : bounds[k + 1]]
        if x.shape[0] == 0:
            continue
        p99 = float(np.quantile(x, 0.99, method="higher")) * 1000.0
        within = float(np.count_nonzero(x <= rt_max_s + 1e-9)) / x.shape[0]
        out.append((t0 + 60.0 * k, int(x.shape[0]), round(min(p99, 1e9), 1), round(within, 5)))
    return out
