"""Pooled capacity where spill cannot answer in time: enough to carry the worst rise.

Pooled dispatch lets each instance carry far more within the SLO than it does alone
(``provisioner.pooling``): a request that arrives while one instance runs a batch
starts on another at once. Alone, an instance must mostly idle: on OpenNMT-ende a
p2.xlarge carries 0.137 r/s alone (a request that waits out a 0.75 s batch and then
runs its own passes RT_max 1.4 s) and 1.24 r/s in a pool of 32. Planning a fleet at
the pooled figure is exact while the load is what was planned for; when it rises
faster than new instances boot, the excess is what spill takes, which is why
``pool_with`` pools under ``auto`` only once spill is measured to answer in time.

Where spill cannot answer in time, the excess of a rise is misses, so the fleet must
carry the rise itself until the instances bought for it serve. Planning every
instance at ``max(alone, pooled / R)``, with ``R`` the largest rise the model's own
history shows within one lead time (the boot), buys a pooled fleet that carries
``R`` times the planned load, and never more instances than the stand-alone plan.
Whatever counts the fleet as the plan does (the standby pool, the early step's fleet
capacity) rates it through ``planning_options`` and ``pools`` too.
``R`` is measured, per minute ``t`` of the history, as the highest per-minute peak in
the ``lead`` minutes after ``t`` over the median peak of the ``LEVEL_MINUTES`` up to
``t`` (what a forecast made at ``t`` would be near), and the largest over the
history is taken; with less history than that, ``None`` (plan alone, as before).

The Twitter history before Table 5's windows rises up to 4.96x within two minutes:
OpenNMT-ende still pools under it (about half the cost, always within RT_max), NASNet
mostly plans stand-alone (``experiments/table5/README.md``). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from provisioner.control_state import Snapshot, StepConfig
from provisioner.greedy import PlannerOption

LEVEL_MINUTES = 10
"""Minutes of history whose median peak stands for the level a rise is measured from."""


def worst_rise(per_minute: Sequence[float], lead_minutes: int) -> float | None:
    """The largest ratio of the highest peak in the ``lead_minutes`` after a minute to the
    median peak of the ``LEVEL_MINUTES`` up to it, over ``per_minute`` (NaN: a minute not
    observed); at least 1. None when no minute has a full level and lead observed with
    load (nothing to measure a rise from)."""
    x = np.asarray(per_minute, dtype=np.float64)
    lead = max(1, lead_minutes)
    n = x.size - LEVEL_MINUTES - lead + 1
    if n <= 0:
        return None
    level_w = np.lib.stride_tricks.sliding_window_view(x, LEVEL_MINUTES)[:n]
    ahead_w = np.lib.stride_tricks.sliding_window_view(x[LEVEL_MINUTES:], lead)[:n]
    ok = np.isfinite(level_w).all(axis=1) & np.isfinite(ahead_w).all(axis=1)
    if not ok.any():
        return None
    level = np.median(level_w[ok], axis=1)
    ahead = ahead_w[ok].max(axis=1)
    loaded = level > 0.0
    if not loaded.any():
        return None
    return max(1.0, float((ahead[loaded] / level[loaded]).max()))


def absorbing(option: PlannerOption, rise: float) -> PlannerOption:
    """``option`` with each pooled capacity divided by ``rise`` and never below its
    stand-alone capacity: the fleet ``plan_pooled`` buys with it carries ``rise`` times
    its plan in one pool."""
    if not option.pool or not math.isfinite(rise) or rise < 1.0:
        return option
    alone = option.capacity_rps
    pool = tuple((n, max(alone, c / rise)) for n, c in option.pool)
    return PlannerOption(
        option.instance_type,
        option.market,
        option.price_per_hour,
        alone,
        option.launch_overhead,
        option.latency_s,
        pool,
    )


def lead_minutes(cfg: StepConfig) -> int:
    """The lead a rise is measured over: the steps until a launch serves
    (``tau_steps``), in whole minutes."""
    return math.ceil(cfg.tau_steps * cfg.step_s / 60.0 - 1e-9)


def pools(snap: Snapshot, cfg: StepConfig) -> bool:
    """Whether the plan rates instances in a pool: as configured or with spill in time
    (``cfg.pooled``), or (``cfg.pool_for_rises``) at capacity that carries the history's
    worst rise."""
    return cfg.pooled or (cfg.pool_for_rises and snap.worst_rise is not None)


def rating(snap: Snapshot, cfg: StepConfig) -> str:
    """How the plan rates each instance, in words for ``mark plan --explain``."""
    if cfg.pooled:
        return "in a pool (spill answers in time, or as configured)"
    if cfg.pool_for_rises and snap.worst_rise is not None:
        return (
            f"in a pool carrying the history's worst rise, x{snap.worst_rise:.2f} within "
            f"{lead_minutes(cfg)} min, never below alone (spill is not measured in time)"
        )
    return "alone (its own queue)"


def planning_options(snap: Snapshot, cfg: StepConfig) -> list[PlannerOption]:
    """The options as the plan rates them, for the plan and whatever counts the fleet as
    it does: as measured where it pools with spill in time or as configured; else, once
    the history shows its worst rise, ``absorbing`` it; else stand-alone."""
    if cfg.pooled or not cfg.pool_for_rises or snap.worst_rise is None:
        return list(snap.options)
    return [absorbing(o, snap.worst_rise) for o in snap.options]
