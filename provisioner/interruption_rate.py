"""How often spot capacity is interrupted: the configured rate, learned from the notices.

The standby pool is priced by the rate spot instances are interrupted at
(``provisioner.standby_value``). The configured rate (``offerings.spot_interruption_rate``,
the AWS Spot Instance Advisor's monthly share) is what AWS publishes for a type and region
over the last month, not what this cluster meets. The daemon sees every notice for its own
spot instances and how long they ran, so it learns the rate: the mean of the Gamma
posterior of a Poisson rate, with the configured rate as the prior, weighted as one spot
instance-month (``PRIOR_HOURS``, the Advisor's unit):

    rate = (prior × PRIOR_HOURS + notices) / (PRIOR_HOURS + spot instance-hours)

With no evidence it is the configured rate; a cluster that ran 100 spot instances for a
week weighs the prior as 4 % of its evidence (730 of 17,530 hours). Counted per cluster,
not per offering: a handful of notices cannot tell offerings apart. Hours are counted
only while the controller steps (``ran``): while it is down, notices go unseen, so its
hours count nothing either. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from provisioner.standby_value import HOURS_PER_MONTH

PRIOR_HOURS = HOURS_PER_MONTH
"""The prior's weight: one spot instance-month at the configured rate."""


@dataclass(frozen=True)
class InterruptionEvidence:
    """The spot interruptions a cluster noticed and the spot instance-hours they came in."""

    notices: float = 0.0
    """Interruption notices for distinct instances."""
    spot_hours: float = 0.0
    """Spot instance-hours counted while the controller stepped."""
    counted_at: float | None = None
    """When ``spot_hours`` was last counted (not saved: a restart counts from its first step)."""

    def rate_per_hour(self, prior_per_hour: float) -> float:
        """Interruptions per spot instance-hour: the posterior mean (module docstring)."""
        prior = max(0.0, prior_per_hour)
        return (prior * PRIOR_HOURS + self.notices) / (PRIOR_HOURS + self.spot_hours)

    def noticed(self) -> InterruptionEvidence:
        """One more instance's interruption notice."""
        return replace(self, notices=self.notices + 1.0)

    def ran(self, spot_instances: int, now: float, max_gap_s: float) -> InterruptionEvidence:
        """``spot_instances`` live since the last count, for at most ``max_gap_s`` (a longer
        gap is time the controller did not step, and saw no notice in)."""
        if self.counted_at is None or now <= self.counted_at:
            return replace(self, counted_at=now if self.counted_at is None else self.counted_at)
        span = min(now - self.counted_at, max(0.0, max_gap_s))
        return replace(
            self,
            spot_hours=self.spot_hours + max(0, spot_instances) * span / 3600.0,
            counted_at=now,
        )
