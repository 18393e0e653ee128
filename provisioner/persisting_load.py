"""The load that has persisted, as a floor under the forecast: what a forecaster misses.

A forecaster learns what its history showed. One fitted on a quiet history (the
``surge`` trace's 100 r/s) answers a tripled load with a forecast that creeps up a few
r/s a minute: on Inception-v3 the fleet had bought 13 c5.large for a 300 r/s surge by its
thirteenth minute, after it ended, and Lambda carried the whole of it. The load measured
now says more than the forecast about the next minutes, but not how long it will last:
a spike bought for is paid for minutes after it is gone.

So rent (spill) while a rise is young and buy once it has lasted, as in renting or
buying skis, with the rise's own age as the only estimate of what is left of it: a level
the load has held for the last ``d`` seconds is taken to hold ``d`` seconds more. An
instance bought now serves after its boot ``b`` and idles through the cool-down ``k``
after the rise before it is retired, so it earns its price only if
``c_λ (d − b) > c_o (d + k)`` per r/s (``c_λ`` spill's price per request, ``c_o`` the
cheapest instance's at full use): once ``d > (b + r k) / (1 − r)``, ``r = c_o/c_λ``
(``break_even_age``). From then
on the forecast of step ``j``, ``j`` steps ahead, is at least the lowest window rate of
the last ``max(j steps, that age)``; a rise that ends lowers the floor with its first
quiet window. The lowest window, not the mean: the floor never exceeds what the load did
in every window of its span, so a load that only fluctuates raises nothing the forecast
of its peaks does not already cover. The floor corrects the forecast, not the plan: the
share of it instances carry is still ``capacity_target``'s (raising that share instead,
to the level held, bought LSTM-ptb instances against the newsvendor's cheap spill, +13 %
on ``mmpp``). Where spill is priced near the instances (LSTM-ptb's),
the age is long and little is bought; where it costs four times as much (Inception-v3's
on p2.xlarge), a rise is bought for after about 160 s.

Only where there is something to rent: where spill is measured to answer within RT_max
and priced (``StepConfig.spill_cost_per_request``, as for ``capacity_target``). Where it
misses RT_max a shortfall is misses, which the SLO monitor's backups are sized to
(``provisioner.backup_step``); a floor there bought serving instances for bursts of a few
minutes after they had ended (NASNet on ``mmpp``: +20 % for 99.0 % within RT_max where
98.2 % met the SLO). Pure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

MIN_WINDOWS = 2
"""The fewest windows a level must have held: one window is counting noise (the early
step's trigger asks two in a row too, ``provisioner.early_step.EARLY_WINDOWS``)."""


def break_even_age(boot_s: float, quantile: float, cooldown_s: float) -> float:
    """How long a rise must have lasted before an instance bought for it pays, if it
    lasts as long again: ``(b + r k) / (1 − r)``, with ``r = c_o/c_λ`` (``quantile`` is the
    newsvendor's ``1 − r``, ``provisioner.capacity_target.critical_quantile``), ``b`` the
    boot and ``k`` the cool-down the instance idles through after the rise before it is
    retired; inf where an instance costs spill's price or more."""
    if quantile <= 0.0:
        return math.inf
    return (boot_s + (1.0 - quantile) * cooldown_s) / quantile


def persisting_floor(
    recent: Sequence[float], window_s: float, steps: int, step_s: float, min_age_s: float
) -> list[float]:
    """Per plan step, the rate the load has held long enough to plan for.

    ``recent``: the rates of the P_s windows closed by now, newest first, one every
    ``window_s`` seconds (0 where no request came). Step ``j`` gets the lowest of the
    newest ``max(MIN_WINDOWS, ceil(max(j * step_s, min_age_s) / window_s))`` of them, or
    0 where the history is shorter than that (always, for an infinite ``min_age_s``)."""
    if window_s <= 0 or not math.isfinite(min_age_s):
        return [0.0] * steps
    lowest = list(itertools.accumulate(recent, min))  # lowest[n - 1]: of the newest n
    floor: list[float] = []
    for j in range(steps):
        n = max(MIN_WINDOWS, math.ceil(max(j * step_s, min_age_s) / window_s - 1e-9))
        floor.append(lowest[n - 1] if len(lowest) >= n else 0.0)
    return floor


def with_floor(target: Sequence[float], floor: Sequence[float]) -> list[float]:
    """``target`` raised to ``floor`` step by step (steps past ``floor`` unchanged)."""
    return [max(t, floor[j]) if j < len(floor) else t for j, t in enumerate(target)]


def persisting_why(floor: Sequence[float], raised: Sequence[int], step_s: float) -> str:
    """Why the plan carries more than the forecast: the level held and how far ahead."""
    last = raised[-1]
    return (
        f"the load has held {floor[last]:.1f} r/s long enough to buy for: {len(raised)} "
        f"step(s), up to {last} ({last * step_s:g} s) ahead, planned for it, not the forecast"
    )
