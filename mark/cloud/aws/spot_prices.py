"""Refresh the catalog's spot prices from EC2 ``DescribeSpotPriceHistory``.

Per instance type we take each Availability Zone's newest price and use the
median across zones: a fleet spread over zones pays about that, where the
minimum would flatter spot. A price below ``MIN_PLAUSIBLE_FRACTION`` of the
on-demand price is not believed (AWS's own feed never goes below about 9 %):
the shipped price stays, and the caller is told which types were refused.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiobotocore.session import get_session

from mark.catalog import Catalog

MIN_PLAUSIBLE_FRACTION = 0.05
PRODUCT = "Linux/UNIX"


@dataclass(frozen=True, slots=True)
class SpotQuote:
    instance_type: str
    zone: str
    price_per_hour: float
    at: datetime


@dataclass(frozen=True, slots=True)
class SpotRefresh:
    catalog: Catalog
    updated: Mapping[str, float]
    refused: Mapping[str, float]  # implausible quotes, shipped price kept


def median_newest_by_zone(quotes: Iterable[SpotQuote]) -> dict[str, float]:
    """Median over zones of each zone's newest quote, per instance type."""
    newest: dict[tuple[str, str], SpotQuote] = {}
    for q in quotes:
        key = (q.instance_type, q.zone)
        if key not in newest or q.at > newest[key].at:
            newest[key] = q
    by_type: dict[str, list[float]] = {}
    for (itype, _), q in newest.items():
        by_type.setdefault(itype, []).append(q.price_per_hour)
    return {t: statistics.median(ps) for t, ps in by_type.items()}


def apply_quotes(catalog: Catalog, prices: Mapping[str, float]) -> SpotRefresh:
    """Merge plausible prices into the catalog; report the refused ones."""
    good: dict[str, float] = {}
    refused: dict[str, float] = {}
    for itype, price in prices.items():
        on_demand = catalog.on_demand.get(itype)
        if price <= 0 or (on_demand is not None and price < MIN_PLAUSIBLE_FRACTION * on_demand):
            refused[itype] = price
        else:
            good[itype] = price
    return SpotRefresh(catalog.with_spot_prices(good), good, refused)


def _quote(rec: Mapping[str, Any]) -> SpotQuote:
    return SpotQuote(
        instance_type=str(rec["InstanceType"]),
        zone=str(rec["AvailabilityZone"]),
        price_per_hour=float(rec["SpotPrice"]),
        at=rec["Timestamp"],
    )


async def fetch_spot_quotes(
    instance_types: Sequence[str],
    *,
    region: str,
    endpoint_url: str | None = None,
    start_time: datetime | None = None,
) -> list[SpotQuote]:
    """Every Linux spot quote for ``instance_types`` since ``start_time`` (all pages)."""
    if not instance_types:
        return []
    kwargs: dict[str, Any] = {
        "InstanceTypes": list(instance_types),
        "ProductDescriptions": [PRODUCT],
    }
    if start_time is not None:
        kwargs["StartTime"] = start_time
    quotes: list[SpotQuote] = []
    async with get_session().create_client(
        "ec2", region_name=region, endpoint_url=endpoint_url
    ) as ec2:
        paginator = ec2.get_paginator("describe_spot_price_history")
        async for page in paginator.paginate(**kwargs):
            quotes.extend(_quote(r) for r in page.get("SpotPriceHistory", []))
    wanted = set(instance_types)
    return [q for q in quotes if q.instance_type in wanted]


async def refresh_spot_prices(
    catalog: Catalog,
    instance_types: Sequence[str],
    *,
    region: str,
    endpoint_url: str | None = None,
    start_time: datetime | None = None,
) -> SpotRefresh:
    quotes = await fetch_spot_quotes(
        instance_types, region=region, endpoint_url=endpoint_url, start_time=start_time
    )
    return apply_quotes(catalog, median_newest_by_zone(quotes))
