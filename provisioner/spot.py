"""Spot interruptions and burstable standbys (paper §4.5).

A spot interruption gives 2 minutes' notice, too little for a replacement to
boot and warm up. The paper keeps a few *stopped* burstable instances (t3) as
cold standbys: stopped they cost only their disk, they resume in under two
minutes, and they can run at full speed for about 30 minutes on CPU credits.

* ``standby_pool_size``: how many standbys to keep stopped. The capacity that
  can go at once is at least the largest single spot offering (one spot pool is
  reclaimed together) and, for correlated loss, ``loss_fraction`` of all spot
  capacity; diversifying across types lowers the first term.
* ``standbys_to_start``: on a notice, the fewest stopped standbys covering the
  lost capacity; what they cannot cover is reported (it spills to Lambda).
* ``standbys_to_stop``: once replacements serve, stop the standbys no longer
  needed, keeping enough for capacity not yet replaced.
* ``InterruptionMemory`` / ``avoid_interrupted``: do not buy an offering again
  for ``ttl_s`` after it was interrupted, or found out of capacity (Karpenter
  uses 3 minutes for both).
* ``diversify_spot``: spread spot capacity over the cheapest offerings, at most
  ``max_share`` of it on any one, so one reclaimed pool cannot take it all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.greedy import OptionKey, PlannerOption

INTERRUPTED_OFFERING_TTL_S = 180.0
"""Karpenter's unavailable-offerings cache lasts 3 minutes."""

UNAVAILABLE_OFFERING_TTL_S = INTERRUPTED_OFFERING_TTL_S
"""An offering out of capacity (InsufficientInstanceCapacity, SpotMaxPriceTooLow)
is avoided as long, in the same memory: Karpenter caches both the same way."""


@dataclass(frozen=True)
class SpotHolding:
    """Running spot instances of one offering."""

    key: OptionKey
    count: int
    capacity_rps: float

    @property
    def total_rps(self) -> float:
        return self.count * self.capacity_rps


@dataclass(frozen=True)
class Standby:
    instance_id: str
    capacity_rps: float


def capacity_at_risk(holdings: Sequence[SpotHolding], loss_fraction: float) -> float:
    total = sum(h.total_rps for h in holdings)
    largest = max((h.total_rps for h in holdings), default=0.0)
    return min(total, max(largest, loss_fraction * total))


def standby_pool_size(
    holdings: Sequence[SpotHolding], standby_capacity_rps: float, loss_fraction: float = 0.25
) -> int:
    """Stopped standbys needed to cover the spot capacity that could go at once."""
    if standby_capacity_rps <= 0:
        raise ValueError("standby capacity must be positive")
    at_risk = capacity_at_risk(holdings, loss_fraction)
    return math.ceil(at_risk / standby_capacity_rps - 1e-9)


@dataclass(frozen=True)
class StartDecision:
    start: tuple[str, ...]
    uncovered_rps: float
    """Lost capacity no standby covers: it goes to Lambda until replaced."""


def standbys_to_start(lost_rps: float, stopped: Sequence[Standby]) -> StartDecision:
    """Fewest stopped standbys whose capacity covers ``lost_rps``."""
    chosen: list[str] = []
    remaining = lost_rps
    for standby in sorted(stopped, key=lambda s: -s.capacity_rps):
        if remaining <= 1e-9:
            break
        chosen.append(standby.instance_id)
        remaining -= standby.capacity_rps
    return StartDecision(tuple(chosen), max(0.0, remaining))


def standbys_to_stop(active: Sequence[Standby], still_needed_rps: float) -> tuple[str, ...]:
    """Standbys to stop now that replacements serve all but ``still_needed_rps``.

    Keeps the smallest set of the largest standbys that still covers what is
    not yet replaced, and stops the rest.
    """
    keep_capacity = 0.0
    stop: list[str] = []
    for standby in sorted(active, key=lambda s: -s.capacity_rps):
        if keep_capacity < still_needed_rps - 1e-9:
            keep_capacity += standby.capacity_rps
        else:
            stop.append(standby.instance_id)
    return tuple(stop)


@dataclass(frozen=True)
class InterruptionMemory:
    """Offerings interrupted recently, with the time until which to avoid them."""

    avoid_until: Mapping[OptionKey, float] = field(default_factory=dict)


def record_interruption(
    memory: InterruptionMemory,
    key: OptionKey,
    now: float,
    ttl_s: float = INTERRUPTED_OFFERING_TTL_S,
) -> InterruptionMemory:
    kept = {k: t for k, t in memory.avoid_until.items() if t > now}
    kept[key] = max(kept.get(key, now), now + ttl_s)
    return InterruptionMemory(kept)


def avoid_interrupted(
    options: Sequence[PlannerOption], memory: InterruptionMemory, now: float
) -> list[PlannerOption]:
    """The options a planner may buy now: recently interrupted offerings left out."""
    return [o for o in options if memory.avoid_until.get(o.key, -math.inf) <= now]


def diversify_spot(
    required_rps: float, spot_options: Sequence[PlannerOption], max_share: float = 0.5
) -> dict[OptionKey, int]:
    """Instances per spot offering covering ``required_rps``, spread out.

    Cheapest price per request-rate first; each offering takes at most
    ``max_share`` of the requirement (at least one instance, since instances do
    not split). If the share caps leave capacity uncovered, the cheapest
    offerings take the rest: coverage matters more than spread.
    """
    ranked = sorted(
        (o for o in spot_options if o.capacity_rps > 0),
        key=lambda o: o.price_per_hour / o.capacity_rps,
    )
    counts: dict[OptionKey, int] = {}
    remaining = required_rps
    for option in ranked:
        if remaining <= 1e-9:
            break
        cap_count = max(1, math.floor(max_share * required_rps / option.capacity_rps + 1e-9))
        need = math.ceil(remaining / option.capacity_rps - 1e-9)
        n = min(need, cap_count)
        counts[option.key] = n
        remaining -= n * option.capacity_rps
    if remaining > 1e-9 and ranked:
        cheapest = ranked[0]
        counts[cheapest.key] += math.ceil(remaining / cheapest.capacity_rps - 1e-9)
    return counts


@dataclass(frozen=True)
class InterruptionResponse:
    """What to do at once on a 2-minute notice; then re-plan with ``memory``."""

    start: tuple[str, ...]
    uncovered_rps: float
    memory: InterruptionMemory


def on_interruption_notice(
    key: OptionKey,
    lost_rps: float,
    stopped: Sequence[Standby],
    memory: InterruptionMemory,
    now: float,
    ttl_s: float = INTERRUPTED_OFFERING_TTL_S,
) -> InterruptionResponse:
    """Start standbys for the capacity about to go and stop buying its offering."""
    decision = standbys_to_start(lost_rps, stopped)
    return InterruptionResponse(
        decision.start, decision.uncovered_rps, record_interruption(memory, key, now, ttl_s)
    )
