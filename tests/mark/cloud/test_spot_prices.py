"""Spot price refresh: the aggregation rule, and the real API call against moto server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mark.catalog import load_catalog
from mark.cloud.aws.spot_prices import (
    SpotQuote,
    apply_quotes,
    fetch_spot_quotes,
    median_newest_by_zone,
    refresh_spot_prices,
)


def _q(t: str, zone: str, price: float, hour: int) -> SpotQuote:
    return SpotQuote(t, zone, price, datetime(2026, 8, 1, hour, tzinfo=UTC))


def test_median_of_each_zones_newest_quote() -> None:
    quotes = [
        _q("c5.large", "a", 0.050, 1),
        _q("c5.large", "a", 0.030, 2),  # newest in a
        _q("c5.large", "b", 0.040, 1),
        _q("c5.large", "c", 0.020, 3),
        _q("m5.large", "a", 0.041, 1),
    ]
    assert median_newest_by_zone(quotes) == {"c5.large": 0.030, "m5.large": 0.041}


def test_implausible_quotes_are_refused_and_the_shipped_price_kept() -> None:
    cat = load_catalog()
    r = apply_quotes(cat, {"c5.large": 0.031, "m5.large": 0.00001})
    assert r.updated == {"c5.large": 0.031} and r.refused == {"m5.large": 0.00001}
    assert r.catalog.offering("c5.large", "spot").price_per_hour == 0.031
    assert r.catalog.offering("m5.large", "spot").price_per_hour == cat.spot["m5.large"]


async def test_fetch_reads_every_zone_from_the_ec2_api(aws_env: str) -> None:
    quotes = await fetch_spot_quotes(
        ["c5.large", "m5.large"], region="us-east-1", endpoint_url=aws_env
    )
    assert {q.instance_type for q in quotes} == {"c5.large", "m5.large"}
    assert len({q.zone for q in quotes}) >= 2
    # moto answers a constant 0.00001 $/h: the refresh must not believe it.
    r = await refresh_spot_prices(
        load_catalog(), ["c5.large"], region="us-east-1", endpoint_url=aws_env
    )
    assert r.refused == {"c5.large": pytest.approx(0.00001)}
    assert r.catalog.offering("c5.large", "spot").price_per_hour == 0.0286


async def test_no_types_means_no_call() -> None:
    assert await fetch_spot_quotes([], region="us-east-1", endpoint_url="http://127.0.0.1:1") == []
