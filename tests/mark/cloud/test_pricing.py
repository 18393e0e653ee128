"""On-demand prices from the Pricing API (stand-in), and the shipped table when it fails."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from mark.catalog import load_catalog
from mark.cloud.aws.pricing import hourly_usd, refresh_on_demand_prices
from mark.cloud.standins.pricing_api import PricingApi

# A GetProducts item as AWS returns it (trimmed to the fields mark reads and a few more).
AWS_ITEM = json.dumps(
    {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {"instanceType": "c5.large", "regionCode": "us-east-1"},
            "sku": "2WTMTR9HDDT7AA73",
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                "2WTMTR9HDDT7AA73.JRTCKXETXF": {
                    "priceDimensions": {
                        "2WTMTR9HDDT7AA73.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": "$0.085 per On Demand Linux c5.large Instance Hour",
                            "appliesTo": [],
                            "rateCode": "2WTMTR9HDDT7AA73.JRTCKXETXF.6YS6EN2CT7",
                            "beginRange": "0",
                            "pricePerUnit": {"USD": "0.0850000000"},
                        }
                    },
                    "sku": "2WTMTR9HDDT7AA73",
                    "effectiveDate": "2025-12-01T00:00:00Z",
                    "offerTermCode": "JRTCKXETXF",
                    "termAttributes": {},
                }
            }
        },
    }
)


def test_the_hourly_price_is_read_from_the_on_demand_term() -> None:
    assert hourly_usd(AWS_ITEM) == 0.085
    doc = json.loads(AWS_ITEM)
    (term,) = doc["terms"]["OnDemand"].values()
    (dim,) = term["priceDimensions"].values()
    dim["unit"] = "Quantity"
    with pytest.raises(ValueError, match="not hours"):
        hourly_usd(doc)


@pytest.fixture
async def pricing() -> AsyncIterator[PricingApi]:
    shipped = load_catalog().on_demand
    api = PricingApi({t: round(p * 1.1, 6) for t, p in shipped.items() if t != "m5.large"})
    await api.start()
    try:
        yield api
    finally:
        await api.close()


async def test_prices_come_from_the_api_and_the_table_fills_the_gaps(
    aws_env: str, pricing: PricingApi
) -> None:
    catalog = load_catalog()
    got = await refresh_on_demand_prices(
        catalog, ["c5.large", "g4dn.xlarge", "m5.large"], endpoint_url=pricing.url
    )
    assert got.updated == {
        "c5.large": round(catalog.on_demand["c5.large"] * 1.1, 6),
        "g4dn.xlarge": round(catalog.on_demand["g4dn.xlarge"] * 1.1, 6),
    }
    assert set(got.kept) == {"m5.large"}  # the API has no such product: shipped price
    assert got.catalog.on_demand["m5.large"] == catalog.on_demand["m5.large"]
    assert got.catalog.offering("c5.large", "on-demand").price_per_hour == got.updated["c5.large"]
    assert got.catalog.spot == catalog.spot


async def test_an_unreachable_pricing_api_keeps_the_shipped_prices(aws_env: str) -> None:
    catalog = load_catalog()
    # moto has no Pricing backend (it answers 500): every price stays as shipped.
    got = await refresh_on_demand_prices(catalog, ["c5.large"], endpoint_url=aws_env)
    assert got.updated == {} and set(got.kept) == {"c5.large"}
    assert got.catalog.on_demand == catalog.on_demand
