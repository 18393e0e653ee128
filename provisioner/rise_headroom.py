"""Pooled capacity where spill cannot answer in time: enough to carry the rises the SLO
does not let it miss.

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
instance at ``max(alone, pooled / R)`` buys a pooled fleet that carries ``R`` times the
planned load, and never more instances than the stand-alone plan. Whatever counts the
fleet as the plan does (the standby pool, the early step's fleet capacity, a spot
notice) rates it through ``planning_options`` and ``pools`` too.

``R`` is measured on the model's own history of 5 s windows. ``worst_rise`` is the
largest: per minute ``t``, the highest per-minute peak in the ``lead`` minutes after
``t`` over the median peak of the ``LEVEL_MINUTES`` up to ``t``. Carrying it misses no
rise the history shows and spends none of the SLO's allowance.

``carried_rise`` is the least ``R`` whose misses fit a share of the requests in every
hour of the history (``ACCOUNT_MINUTES``, the span its misses are measured on): every
window's rate above ``R`` times the level its fleet was planned from (the median peak of the
ten minutes ending a lead time earlier, the newest fleet that could serve it). That
counts a miss for every request above the rated pool, as if nothing else answered a
rise (no forecast of it, no SLO-monitor backup, no headroom from whole instances), so
it errs towards carrying more. The share is ``rise_allowance``: the part of
``planner.rise_miss_share`` of the allowance that the last hour's measured misses
(``bouncer.miss_budget``: late, failed and declined alike) have not spent, so the
pool's own queueing misses come first, and nothing is left to rises before anything
is measured. With less history than a level and a lead, ``None``: plan alone.

That count errs far: on NASNet's and OpenNMT-ende's Twitter loads it carries 2.0-5.2x,
while a pool planned outright misses 0.3-1.1 % of requests. So ``by_misses`` (on by
default: ``planner.rise_by_misses``) carries only the part of that rise the measured
misses show is needed, the last hour's or the SLO period's, whichever spent more of the
share: on every window of ``experiments/windows`` it cut mark's cost there by 18-43 %
on average, with none below SL_min, where the hour alone let mark-spot's NASNet fleet
fall below it on 2 of 12.

The Twitter history before Table 5's windows rises up to 4.96x within two minutes
(per minute, the highest peak of the next two minutes over the median peak of the last
ten; git history of experiments/table5/README.md, 2026-11-26). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bouncer.miss_budget import RECENT_S, MissTally
from provisioner.control_state import Rise, Snapshot, StepConfig
from provisioner.greedy import PlannerOption

DEFAULT_RISE_MISS_SHARE = 0.75
"""``planner.rise_miss_share``'s default: the share of the allowance rises may miss where
spill cannot answer them. Every such miss is one nobody chose, so a quarter is held back
for the pool's own queueing and the rest; the decline budget's reserve
(``bouncer.miss_budget``) guards declines, not these."""

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


BISECTION_STEPS = 40
"""Halvings of ``[1, worst]`` in ``carried_rise``: far below any rise that matters."""


def _levels(peaks: np.ndarray, lead: int) -> np.ndarray:
    """Per minute, the median peak of the ``LEVEL_MINUTES`` ending ``lead`` minutes before
    it (what a fleet serving then was planned from); NaN without a full observed level."""
    out = np.full(peaks.size, np.nan)
    if peaks.size < LEVEL_MINUTES + lead:
        return out
    win = np.lib.stride_tricks.sliding_window_view(peaks, LEVEL_MINUTES)
    level = np.median(win, axis=1)  # NaN where a minute of the level is NaN
    out[LEVEL_MINUTES - 1 + lead :] = level[: peaks.size - LEVEL_MINUTES + 1 - lead]
    return out


ACCOUNT_MINUTES = round(RECENT_S / 60.0)
"""The misses of every hour of the history must fit, not only of the whole, since rises
come in a few of them: the span of the measured misses the allowance is judged on
(``bouncer.miss_budget.RECENT_S``), however long the SLO's period."""


def _sliding(per_minute: np.ndarray, span: int) -> np.ndarray:
    """Sums over every ``span`` consecutive minutes."""
    c = np.concatenate(([0.0], np.cumsum(per_minute)))
    return c[span:] - c[:-span]


def carried_rise(windows: np.ndarray, lead_minutes: int, allowed_share: float) -> float | None:
    """The least rise ``R`` (at most ``worst_rise``) a pool must carry so that, in every
    ``ACCOUNT_MINUTES`` of the history, the requests above ``R`` times the level a fleet
    was planned from, while that fleet was the newest that could serve, are at most
    ``allowed_share`` of that span's requests.

    ``windows`` is minutes × windows of rates (NaN: not observed). Each window's excess
    over ``R`` times its minute's level (``_levels``) is what a pool carrying ``R`` would
    miss until the instances bought for the rise boot; ``allowed_share`` is the share of
    the SLO's miss allowance the plan may spend on rises. None: no rise measurable.
    """
    peaks = np.max(windows, axis=1, initial=-np.inf, where=np.isfinite(windows))
    peaks[~np.isfinite(peaks)] = np.nan
    lead = max(1, lead_minutes)
    worst = worst_rise(peaks, lead)
    if worst is None or allowed_share <= 0.0:
        return worst
    level = _levels(peaks, lead)
    rows = np.isfinite(level) & (level > 0.0)
    rates = np.where(np.isfinite(windows), windows, 0.0)
    rates[~rows] = 0.0
    level = np.where(rows, level, 0.0)[:, None]
    span = min(ACCOUNT_MINUTES, rates.shape[0])
    per_span = _sliding(rates.sum(axis=1), span)
    if float(per_span.max(initial=0.0)) <= 0.0:
        return worst

    def fits(rise: float) -> bool:
        missed = _sliding(np.maximum(rates - rise * level, 0.0).sum(axis=1), span)
        return bool(np.all(missed <= allowed_share * per_span + 1e-12))

    if fits(1.0):
        return 1.0
    lo, hi = 1.0, worst
    if not fits(hi):
        return worst
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def rise_allowance(share: float, misses: MissTally) -> float:
    """The share of requests a pool sized for rises may leave to miss: ``share`` less what
    the last hour's misses already spent, at least 0, as the miss budget lets declines
    spend only what the window has left; 0 (the worst rise) before anything is
    measured."""
    if misses.arrived <= 0 or share <= 0.0:
        return 0.0
    return max(0.0, share - misses.missed / misses.arrived)


def by_misses(rise: float, share: float, misses: MissTally) -> float:
    """The part of ``rise`` (from ``carried_rise``) to carry, in proportion to the share of
    the rises' allowance (``share``) the measured misses spent, the last hour's or the
    SLO period's, whichever spent more: 1 (pool outright) while nothing missed, all of
    ``rise`` once the allowance is spent or before anything is measured.

    ``carried_rise`` counts every request above ``R`` times the level as a miss, as if
    nothing else answered a rise; the measured misses say how many a rise actually cost
    the fleet as it is (forecasts, the SLO monitor's backups and whole instances all
    answering some of it), so the headroom grows only as far as they show it is needed.
    The hour reacts to a bad hour; the period, on which SL_min is judged, remembers it
    after the hour has forgotten, so the pool does not shrink back into the next one
    while the period's misses stand near the allowance."""
    if misses.arrived <= 0 or share <= 0.0:
        return rise
    spent = misses.missed / misses.arrived
    if misses.period_arrived > 0:
        spent = max(spent, misses.period_missed / misses.period_arrived)
    return 1.0 + min(1.0, spent / share) * (rise - 1.0)


def rise_to_carry(windows: np.ndarray, cfg: StepConfig, misses: MissTally) -> Rise | None:
    """The rise the plan's pool carries over the history ``windows`` (minutes × 5 s
    windows of rates), given the measured ``misses``: ``carried_rise`` at what the last
    hour's left of ``cfg.rise_miss_share``, and with ``cfg.rise_by_misses`` only the
    part of it they show is needed (``by_misses``). None: plan alone."""
    lead = lead_minutes(cfg)
    if lead <= 0:
        return None
    rise = carried_rise(windows, lead, rise_allowance(cfg.rise_miss_share, misses))
    if rise is None:
        return None
    if not cfg.rise_by_misses:
        return Rise(rise, rise)
    return Rise(by_misses(rise, cfg.rise_miss_share, misses), rise)


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


def sizes_for_rises(cfg: StepConfig) -> bool:
    """Whether the plan would rate instances by ``carried_rise``: pooling for rises, and
    not pooling outright (spill in time, or as configured)."""
    return cfg.pool_for_rises and not cfg.pooled


def pools(snap: Snapshot, cfg: StepConfig) -> bool:
    """Whether the plan rates instances in a pool: as configured or with spill in time
    (``cfg.pooled``), or (``cfg.pool_for_rises``) at capacity that carries
    ``carried_rise``."""
    return cfg.pooled or (cfg.pool_for_rises and snap.carried_rise is not None)


def rating(snap: Snapshot, cfg: StepConfig) -> str:
    """How the plan rates each instance, in words for ``mark plan --explain``."""
    if cfg.pooled:
        return "in a pool (spill answers in time, or as configured)"
    rise = snap.carried_rise
    if cfg.pool_for_rises and rise is not None:
        scaled = (
            f" of the x{rise.counted:.2f} the history shows, as far as the misses measured "
            "call for it"
            if rise.counted > rise.carried + 1e-9
            else ""
        )
        return (
            f"in a pool carrying a rise of x{rise.carried:.2f}{scaled} within "
            f"{lead_minutes(cfg)} min, never below alone (spill is not measured in time)"
        )
    return "alone (its own queue)"


def planning_options(snap: Snapshot, cfg: StepConfig) -> list[PlannerOption]:
    """The options as the plan rates them, for the plan and whatever counts the fleet as
    it does: as measured where it pools with spill in time or as configured; else, once
    the history measures the rise to carry, ``absorbing`` it; else stand-alone."""
    if cfg.pooled or not cfg.pool_for_rises or snap.carried_rise is None:
        return list(snap.options)
    return [absorbing(o, snap.carried_rise.carried) for o in snap.options]
