"""On-demand prices from the AWS Price List Query API (``pricing:GetProducts``).

The shipped table (``mark/catalog/data``) is a snapshot; the Pricing API is
the current list. For each instance type we ask for the one product that is
what mark launches — Linux, shared tenancy, no pre-installed software, no
licence, capacity "Used" (not reservations) in the catalog's region — and read
its OnDemand hourly USD price. Any failure (no permission, throttling, an
unknown type, an answer we cannot parse) keeps the shipped price for that
type: a daemon must start even where the Pricing API is out of reach. The API
lives in a few regions only; ``us-east-1`` serves every region's prices.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from mark.catalog import Catalog

log = logging.getLogger("mark.aws.pricing")

PRICING_REGION = "us-east-1"
#: The product mark launches, as Price List attributes.
LINUX_ON_DEMAND: Mapping[str, str] = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}


@dataclass(frozen=True, slots=True)
class OnDemandRefresh:
    catalog: Catalog
    updated: Mapping[str, float]
    kept: Mapping[str, str]  # type -> why the shipped price stayed


def hourly_usd(price_item: str | Mapping[str, Any]) -> float:
    """The OnDemand price per hour in USD of one Price List item (a JSON document)."""
    doc: Any = json.loads(price_item) if isinstance(price_item, str) else price_item
    terms = doc["terms"]["OnDemand"]
    if len(terms) != 1:
        raise ValueError(f"expected one OnDemand term, found {len(terms)}")
    (term,) = terms.values()
    (dim,) = term["priceDimensions"].values()
    if dim.get("unit") not in ("Hrs", "Hours"):
        raise ValueError(f"price unit is {dim.get('unit')!r}, not hours")
    return float(dim["pricePerUnit"]["USD"])


def _filters(instance_type: str, region: str) -> list[dict[str, str]]:
    wanted = {"instanceType": instance_type, "regionCode": region, **LINUX_ON_DEMAND}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


async def fetch_on_demand_prices(
    instance_types: Sequence[str],
    *,
    region: str,
    endpoint_url: str | None = None,
) -> tuple[dict[str, float], dict[str, str]]:
    """Prices found per type, and why each other type has none."""
    found: dict[str, float] = {}
    missing: dict[str, str] = {}
    # A start-up nicety, not a dependency: few retries, short timeouts.
    config = AioConfig(
        retries={"mode": "standard", "total_max_attempts": 2}, connect_timeout=5, read_timeout=10
    )
    async with get_session().create_client(
        "pricing", region_name=PRICING_REGION, endpoint_url=endpoint_url, config=config
    ) as client:
        for itype in instance_types:
            try:
                resp = await client.get_products(
                    ServiceCode="AmazonEC2",
                    Filters=_filters(itype, region),
                    FormatVersion="aws_v1",
                    MaxResults=10,
                )
                items = resp.get("PriceList", [])
                prices = {hourly_usd(item) for item in items}
                if len(prices) != 1:
                    missing[itype] = f"{len(items)} products, {len(prices)} prices"
                    continue
                (price,) = prices
                if price <= 0:
                    missing[itype] = f"price {price}"
                    continue
                found[itype] = price
            except (ClientError, BotoCoreError, ValueError, KeyError, TypeError) as exc:
                missing[itype] = f"{type(exc).__name__}: {exc}"
    return found, missing


async def refresh_on_demand_prices(
    catalog: Catalog,
    instance_types: Sequence[str],
    *,
    endpoint_url: str | None = None,
) -> OnDemandRefresh:
    """The catalog with the Pricing API's on-demand prices; the shipped ones where it fails."""
    try:
        found, missing = await fetch_on_demand_prices(
            instance_types, region=catalog.region, endpoint_url=endpoint_url
        )
    except (ClientError, BotoCoreError, OSError) as exc:  # the client itself failed
        found, missing = {}, {t: f"{type(exc).__name__}: {exc}" for t in instance_types}
    if missing:
        log.warning("shipped on-demand prices kept for %s", missing)
    merged = {**catalog.on_demand, **found}
    return OnDemandRefresh(replace(catalog, on_demand=merged), found, missing)
