"""The instance catalog: what can be bought, what it is, what it costs.

The planner asks the catalog (``catalog.offerings(accelerator="gpu").cheapest()``);
it never parses price tables. Data ships inside the package (see ``data/README.md``).
SageMaker's ml.* hosting prices, for the baseline, are in ``hosting``; the Spot Instance
Advisor's interruption buckets in ``spot_advisor``.
"""

from mark.catalog.hosting import HostingPrice, HostingPrices, load_hosting_prices
from mark.catalog.model import (
    Accelerator,
    Catalog,
    InstanceType,
    LambdaPrices,
    Market,
    Offering,
    Offerings,
    load_catalog,
)
from mark.catalog.spot_advisor import SpotAdvisor, load_spot_advisor

__all__ = [
    "Accelerator",
    "Catalog",
    "HostingPrice",
    "HostingPrices",
    "InstanceType",
    "LambdaPrices",
    "Market",
    "Offering",
    "Offerings",
    "SpotAdvisor",
    "load_catalog",
    "load_hosting_prices",
    "load_spot_advisor",
]
