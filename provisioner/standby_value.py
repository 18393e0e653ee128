"""How many stopped standbys are worth their volumes (paper §4.5, priced).

The paper keeps burstable standbys stopped to carry a spot fleet's lost capacity until
replacements boot. A stopped standby is not free: its EBS volume bills every hour it
waits. What it saves depends on what would carry that load without it:

* where spill answers within RT_max (``SpillEvidence.in_time``), the lost load is
  spilled: answered, at spill's measured price. A standby then saves at most that
  price for the requests it would have carried. Over an hour, every spot instance is
  interrupted at ``interruptions_per_hour`` and its load is lost from its reclaim until
  a replacement launched at the notice serves, at most ``gap_s`` (the boot: the same
  span ``standby_step`` holds started standbys for). So the whole pool saves at most
  ``interruptions_per_hour × spot capacity × gap_s × spill price`` dollars an hour, an
  upper bound whatever the pool's size (it ignores what a started standby itself
  bills), and more standbys than that pays the volumes of are worth less than they
  cost (``standbys_worth``).
* where spill is late (NASNet's and OpenNMT's 2–3 s against a 1–1.4 s RT_max) or not
  yet measured, the lost load would be misses, and the pool is sized to the capacity
  at risk, as the paper does (``provisioner.spot.standby_pool_size``).

The interruption rate starts as the configured one (``offerings.spot_interruption_rate``,
the share of spot instances interrupted in a month, the AWS Spot Instance Advisor's
measure; its top bucket, ">20 %", by default: a higher rate keeps more standbys, so the
default errs towards keeping them) and is learned from the notices the cluster sees
(``provisioner.interruption_rate``). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from provisioner.spill_evidence import SpillEvidence
from provisioner.spot import SpotHolding, standby_pool_size

HOURS_PER_MONTH = 730.0
"""The average month (8,760 h / 12): the Spot Instance Advisor's monthly share and an
EBS GB-month (``mark.billing.EBS_MONTH_S``) both span it."""


@dataclass(frozen=True)
class StandbyValue:
    """What prices a standby: how often spot capacity is lost, for how long, and what a
    stopped standby's volume costs."""

    interruptions_per_hour: float
    """Interruptions per spot instance-hour."""
    gap_s: float
    """How long an interrupted instance's load goes unserved without standbys: until a
    replacement launched at the notice could serve (the boot)."""
    volume_per_hour: float
    """A stopped standby's EBS volume, $/h."""


def interruptions_per_hour(monthly_share: float) -> float:
    """Interruptions per instance-hour from the share of instances interrupted a month."""
    return max(0.0, monthly_share) / HOURS_PER_MONTH


def standbys_worth(
    holdings: Sequence[SpotHolding], value: StandbyValue | None, spill: SpillEvidence
) -> float:
    """The most stopped standbys whose volumes the spill they could save pays for; inf
    where the lost load would otherwise miss (spill late or not yet measured), the
    volumes are free, or nothing prices them (``value`` None)."""
    price = spill.in_time_price()
    if value is None or price is None or value.volume_per_hour <= 0.0:
        return math.inf
    spot_rps = sum(h.total_rps for h in holdings)
    saved_per_hour = value.interruptions_per_hour * spot_rps * value.gap_s * price
    return float(math.floor(saved_per_hour / value.volume_per_hour + 1e-9))


def standbys_wanted(
    holdings: Sequence[SpotHolding],
    standby_capacity_rps: float,
    loss_fraction: float,
    value: StandbyValue | None,
    spill: SpillEvidence,
) -> int:
    """The stopped pool a model keeps: the paper's, covering the spot capacity at risk, but
    no more standbys than they are worth."""
    if not holdings:
        return 0
    size = standby_pool_size(holdings, standby_capacity_rps, loss_fraction)
    worth = standbys_worth(holdings, value, spill)
    return size if worth >= size else int(worth)
