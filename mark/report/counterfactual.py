"""What the same load would have cost under the paper's baseline: SageMaker target
tracking with 2× over-provisioning on one instance type, as SageMaker users pay it.

Pure: the store's arrival windows in, a priced replay of
``provisioner.target_tracking`` out. The load is the requests the daemon
recorded per minute, from the start of the first sample window with arrivals
to the end of the last (telemetry stores only windows that saw requests; a
minute in between with none counts as zero). The replay behaves as the
simulator's ``sagemaker`` policy does (``sagemaker_config_for``: the alarm sees
a minute's load 60 s late, cooldowns run from completion, no re-scaling while
the endpoint updates). Instances are priced at the caller's price, the ml.*
real-time hosting price of the type (``mark.catalog.hosting``), per second with
the 60 s minimum. Latency is not modelled: the baseline is SLO-oblivious and
simply serves late.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mark.billing import ec2_charge
from mark.state.records import ArrivalWindow
from provisioner.target_tracking import DEFAULT_METRIC_DELAY_S, sagemaker_config_for, simulate


def served_period(windows: Sequence[ArrivalWindow]) -> tuple[float, float] | None:
    """[start of the first window, end of the last), or None when nothing was recorded."""
    if not windows:
        return None
    return min(w.window_start for w in windows), max(w.window_start + w.window_s for w in windows)


def per_minute_invocations(
    windows: Sequence[ArrivalWindow], start: float, end: float
) -> list[float]:
    """Requests per minute from ``start`` (SageMaker's metric is a per-minute sum)."""
    n = max(1, math.ceil((end - start) / 60.0 - 1e-9))
    out = [0.0] * n
    for w in windows:
        k = math.floor((w.window_start - start) / 60.0)
        if 0 <= k < n:
            out[k] += w.count
    return out


@dataclass(frozen=True, slots=True)
class Counterfactual:
    model: str
    instance_type: str
    price_per_hour: float
    capacity_rps: float
    capacity_source: str
    over_provision: float
    target_per_instance_per_minute: float
    boot_s: float
    start: float
    end: float
    requests: int
    peak_instances: int
    runs: tuple[tuple[float, float], ...]
    """(start, end) of each baseline instance, absolute seconds."""
    instance_seconds: float
    billed_seconds: float
    cost: float
    price_source: str = ""
    """Where ``price_per_hour`` comes from (for the ml.* price: a citation, or the rule)."""
    metric_delay_s: float = DEFAULT_METRIC_DELAY_S


def target_tracking_cost(
    model: str,
    windows: Sequence[ArrivalWindow],
    *,
    instance_type: str,
    price_per_hour: float,
    capacity_rps: float,
    capacity_source: str,
    boot_s: float,
    over_provision: float = 2.0,
    price_source: str = "",
    metric_delay_s: float = DEFAULT_METRIC_DELAY_S,
) -> Counterfactual | None:
    """Replay target tracking over the served period; None when no load was recorded.

    The endpoint starts with as many instances as the first minute's load needs
    at the target (at least one: target tracking cannot scale out from zero).
    """
    period = served_period(windows)
    if period is None:
        return None
    start, end = period
    cfg = sagemaker_config_for(capacity_rps, over_provision, metric_delay_s=metric_delay_s)
    series = per_minute_invocations(windows, start, end)
    initial = max(
        cfg.min_capacity, math.ceil(series[0] / cfg.target_invocations_per_instance - 1e-9)
    )
    fleet = simulate(series, cfg, boot_s, initial)
    length = end - start
    runs = tuple(
        (start + s, start + min(e, length)) for s, e in fleet.runs if s < length or s == 0.0
    )
    charges = [ec2_charge(price_per_hour, s, e) for s, e in runs]
    return Counterfactual(
        model=model,
        instance_type=instance_type,
        price_per_hour=price_per_hour,
        capacity_rps=capacity_rps,
        capacity_source=capacity_source,
        over_provision=over_provision,
        target_per_instance_per_minute=cfg.target_invocations_per_instance,
        boot_s=boot_s,
        start=start,
        end=end,
        requests=sum(w.count for w in windows),
        peak_instances=max(fleet.provisioned, default=0),
        runs=runs,
        instance_seconds=sum(c.seconds for c in charges),
        billed_seconds=sum(c.billed_seconds for c in charges),
        cost=sum(c.cost for c in charges),
        price_source=price_source,
        metric_delay_s=metric_delay_s,
    )
