"""How often AWS interrupts spot instances of each type: the Spot Instance Advisor's buckets.

The Advisor publishes, per type and region, the share of spot instances interrupted
over the last month as one of five buckets (<5 %, 5–10 %, 10–15 %, 15–20 %, >20 %).
The shipped snapshot (``data/spot-advisor-us-east-1.json``, its source inside) keeps
each type's bucket; ``monthly_share`` reads a bucket as its upper edge, the worst it
allows ('>20 %' as 20 %, its only edge). The simulator interrupts each spot instance
at its type's rate (``mark simulate --interrupt-rate advisor``), and the daemon's
``offerings.spot_interruption_rate`` is the same unit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from mark.errors import UnknownOffering

ADVISOR_FILE = "spot-advisor-us-east-1.json"
HOURS_PER_MONTH = 730.0  # AWS's billing month, the Advisor's unit


@dataclass(frozen=True)
class SpotAdvisor:
    """Each type's Advisor bucket, and what a bucket means as a monthly share."""

    buckets: Mapping[int, tuple[str, float]]
    """Bucket index → (label, monthly share of instances interrupted)."""
    types: Mapping[str, int]
    source: str

    def monthly_share(self, instance_type: str) -> float:
        try:
            return self.buckets[self.types[instance_type]][1]
        except KeyError:
            raise UnknownOffering(
                f"the Spot Instance Advisor snapshot has no {instance_type} in us-east-1"
            ) from None

    def rate_per_hour(self, instance_type: str) -> float:
        """Interruptions per spot instance-hour of the type (its monthly share / 730 h)."""
        return self.monthly_share(instance_type) / HOURS_PER_MONTH


@cache
def load_spot_advisor() -> SpotAdvisor:
    raw = json.loads(resources.files("mark.catalog").joinpath("data", ADVISOR_FILE).read_text())
    return SpotAdvisor(
        buckets={
            int(b["index"]): (str(b["label"]), float(b["monthly_share"])) for b in raw["buckets"]
        },
        types={str(k): int(v) for k, v in raw["types"].items()},
        source=str(raw["source"]),
    )
