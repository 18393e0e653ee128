"""What the spill function has shown lately: how often it answered in time, and its price.

Two planning rules lean on Lambda taking what the instances do not:

- a pooled fleet runs close to saturation and hands its transient overload to
  the Bouncer's spill (``provisioner.pooling``);
- capacity planned below a step's peak leaves the peak to spill
  (``provisioner.capacity_target``).

Both pay only if spill answers within RT_max, and the second needs spill's
price per request. Where spill is measured to miss RT_max for good (``late``), a
shortfall is misses, and the SLO monitor's backups are sized to it instead
(``provisioner.backup_step.backup_launch``). "Answers within RT_max" means its
median does: a spilled request that meets a cold start (1-2 s) misses, and a burst that widens
Lambda's concurrency meets many of them, so on Inception-v3 a fifth to a third
of a burst's spills miss while the run keeps 99.9 % within RT_max; NASNet's and
OpenNMT's spill (2.2 s and 3.1 s against RT_max 1 s and 1.4 s) never answers in
time, and there overload on a pool would be all misses. Neither is taken from a profile: a spill's
latency includes the wait before the Bouncer handed it over, a cold start and
the network, and its price is what the account is billed. So both are
measured, by the daemon from its telemetry and by the simulator from its
Lambda, and folded here the same way. Old evidence fades with every new
spilled request (a memory of ``MEMORY`` requests), not with time: a fleet that
rarely spills keeps what it last saw.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY = 500.0
"""Spilled requests after which a past one weighs 1/e."""

MIN_SEEN = 20.0
"""Spilled requests (weighted) before the evidence decides anything."""

LATE_MEMORY = 10_000.0
"""Spilled requests after which a past one weighs 1/e in ``late``. A burst that widens
Lambda's concurrency meets a few thousand cold starts (Inception-v3's rise at 05:02 of
Twitter day 10: the ``MEMORY`` view turned late for seconds), which must not make spill
that answers in time look as if it never does."""

IN_TIME_SHARE = 0.5
"""Spill is in time when at least this share of spilled requests met RT_max: its median."""


@dataclass(frozen=True)
class SpillCounts:
    """Spilled requests that ended in some interval: all, those within RT_max (errors are
    not), and the dollars billed for them."""

    total: int = 0
    within: int = 0
    cost: float = 0.0


@dataclass(frozen=True)
class SpillEvidence:
    """Exponentially weighted counts of spilled requests, those within RT_max, and their cost."""

    seen: float = 0.0
    within: float = 0.0
    cost: float = 0.0
    """Dollars billed for them (invocations and GB-seconds)."""
    seen_long: float = 0.0
    within_long: float = 0.0
    """The same two counts over ``LATE_MEMORY`` spilled requests, for ``late``."""

    def observe(self, within: int, total: int, cost: float) -> SpillEvidence:
        """Fold in ``total`` spilled requests that ended since the last call, ``within``
        of them answered within RT_max, billed ``cost`` dollars."""
        if total <= 0:
            return self
        keep = (1.0 - 1.0 / MEMORY) ** total
        keep_long = (1.0 - 1.0 / LATE_MEMORY) ** total
        return SpillEvidence(
            self.seen * keep + total,
            self.within * keep + min(within, total),
            self.cost * keep + max(cost, 0.0),
            self.seen_long * keep_long + total,
            self.within_long * keep_long + min(within, total),
        )

    @property
    def known(self) -> bool:
        return self.seen >= MIN_SEEN

    def late(self) -> bool:
        """Whether spill is measured to miss RT_max for good: enough were seen, and most
        missed it, lately and over the last ``LATE_MEMORY`` (not merely not known to answer
        in time, as ``not in_time()`` is at first, nor late through one burst's cold
        starts). NASNet's and OpenNMT-ende's spill is; Inception-v3's is not."""
        long_late = self.within_long < IN_TIME_SHARE * self.seen_long
        return self.known and not self.in_time() and long_late

    def in_time(self) -> bool:
        """Whether spill typically answers within RT_max: most spilled requests lately did.

        False until enough were seen: before that, plan as if spill could not be
        relied on (stand-alone capacity, the whole peak on instances)."""
        return self.known and self.within >= IN_TIME_SHARE * self.seen

    def in_time_price(self) -> float | None:
        """What one spilled request is billed where spill answers in time: what load left
        to spill costs. None: not measured, or late (load left to it would miss)."""
        return self.cost_per_request() if self.in_time() else None

    def cost_per_request(self) -> float | None:
        """What one spilled request is billed, once known and non-zero."""
        if not self.known:
            return None
        price = self.cost / self.seen  # a subnormal cost divides to 0.0: not a price either
        return price if price > 0.0 else None
