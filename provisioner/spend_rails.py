"""Spending rails: the most an hour of a model's fleet, and of the whole cluster, may cost.

A bug anywhere upstream (a forecast that explodes, an SLO monitor that fires
on every check, a standby pool sized wrong) ends as launches, and on AWS
launches are money. The rails are the last word before any launch or start:
each request to add capacity is priced, and the part that would take the
model's or the cluster's hourly spend past its limit is not carried out.
The limits come from the user (``budget`` in the configuration); the spend
is what is running now (instances not yet retired, provisioned concurrency).

Pure: the caller prices its fleet, these functions only add and compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from provisioner.greedy import OptionKey


@dataclass(frozen=True)
class SpendLimits:
    """Dollars per hour; ``None`` is no limit."""

    per_model: float | None = None
    cluster: float | None = None


@dataclass(frozen=True)
class Spend:
    """What is being paid per hour now, before this decision."""

    model: float
    cluster: float

    def plus(self, dollars_per_hour: float) -> Spend:
        return Spend(self.model + dollars_per_hour, self.cluster + dollars_per_hour)


@dataclass(frozen=True)
class RailHit:
    """Some of a request to add capacity was held back by a rail."""

    rail: str  # "model" or "cluster"
    key: OptionKey
    wanted: int
    allowed: int
    limit: float
    spend: float
    unit_price: float

    def explain(self) -> str:
        itype, market = self.key
        return (
            f"{self.rail} spend rail ${self.limit:.2f}/h: {self.wanted}× {itype}/{market} "
            f"at ${self.unit_price:.4f}/h wanted, {self.allowed} allowed "
            f"(spending ${self.spend:.4f}/h before it)"
        )


def _room(limit: float | None, spend: float, price: float) -> int | None:
    if limit is None:
        return None
    if price <= 0:
        return None  # free capacity never breaks a spend limit
    # A hair of tolerance so that exactly reaching the limit is allowed despite rounding.
    return max(0, int((limit - spend) / price + 1e-9))


def within_rails(
    requests: Sequence[tuple[OptionKey, int, float]],
    spend: Spend,
    limits: SpendLimits,
) -> tuple[list[tuple[OptionKey, int]], list[RailHit], Spend]:
    """How many of each request (offering, count, $/h each) fit under both limits, in order.

    Requests are served in the order given (the planner's, most cost-effective
    first); one cut short does not stop a cheaper one after it from fitting.
    Returns the allowed counts (zero counts left out), what each rail held
    back, and the spend once the allowed part runs.
    """
    allowed: list[tuple[OptionKey, int]] = []
    hits: list[RailHit] = []
    for key, count, price in requests:
        n = count
        for rail, limit, current in (
            ("model", limits.per_model, spend.model),
            ("cluster", limits.cluster, spend.cluster),
        ):
            room = _room(limit, current, price)
            if room is not None and room < n:
                assert limit is not None
                hits.append(RailHit(rail, key, count, room, limit, current, price))
                n = room
        if n > 0:
            allowed.append((key, n))
            spend = spend.plus(n * price)
    return allowed, hits, spend
