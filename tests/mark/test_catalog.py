"""The catalog against the shipped price and hardware data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mark.catalog import Accelerator, Market, load_catalog
from mark.errors import UnknownOffering

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "aws"


def test_shipped_prices_match_the_shared_source_data() -> None:
    cat = load_catalog()
    if not SHARED.is_dir():
        pytest.skip("shared data not beside the checkout")
    src = json.loads((SHARED / "prices-us-east-1.json").read_text())
    for o in cat.offerings():
        table = src["on_demand_per_hour"] if o.market is Market.ON_DEMAND else src["spot_per_hour"]
        assert o.price_per_hour == table[o.type_name]


def test_inferentia_offerings_have_both_markets_at_the_documented_prices() -> None:
    inf = load_catalog().offerings().compatible(accelerator="inferentia")
    names = {o.type_name for o in inf}
    assert names == {f"inf1.{s}" for s in ("xlarge", "2xlarge", "6xlarge", "24xlarge")} | {
        f"inf2.{s}" for s in ("xlarge", "8xlarge", "24xlarge", "48xlarge")
    }
    assert {o.market for o in inf} == {Market.ON_DEMAND, Market.SPOT}
    cat = load_catalog()
    assert cat.offering("inf1.xlarge", "on-demand").price_per_hour == 0.228
    assert cat.offering("inf1.xlarge", "spot").price_per_hour == 0.0506


def test_offering_questions_read_like_english() -> None:
    cat = load_catalog()
    spot_gpus = cat.offerings().compatible(accelerator=Accelerator.GPU, market=Market.SPOT)
    assert all(o.accelerator is Accelerator.GPU and o.market is Market.SPOT for o in spot_gpus)
    cheapest = spot_gpus.cheapest()
    assert cheapest.price_per_hour == min(o.price_per_hour for o in spot_gpus)
    c5 = cat.offerings().compatible(families=["c5"], market="on-demand")
    assert c5.cheapest().name == "c5.large/on-demand"
    assert c5.cheapest().price_per_second == pytest.approx(0.085 / 3600)
    assert all(o.instance_type.burstable for o in cat.offerings().compatible(burstable=True))


def test_types_the_paper_uses_are_known() -> None:
    cat = load_catalog()
    p2 = cat.offering("p2.xlarge", "on-demand")
    assert p2.price_per_hour == 0.90 and p2.accelerator is Accelerator.GPU
    with pytest.raises(UnknownOffering, match="no spot price"):
        cat.offering("p2.xlarge", "spot")  # the spot feed has none; it is not invented


def test_unknown_types_and_unsupported_markets_raise() -> None:
    cat = load_catalog()
    with pytest.raises(UnknownOffering, match="unknown instance type"):
        cat.instance_type("c5.huge")
    with pytest.raises(UnknownOffering, match="cannot be bought as spot"):
        cat.offering("t2.nano", "spot")
    with pytest.raises(UnknownOffering):
        cat.offerings().compatible(accelerator="gpu", families=["c5"]).cheapest()


def test_refreshed_spot_prices_replace_the_shipped_ones() -> None:
    cat = load_catalog()
    fresh = cat.with_spot_prices({"c5.large": 0.031, "m5.large": 0.0})
    assert fresh.offering("c5.large", "spot").price_per_hour == 0.031
    assert fresh.offering("m5.large", "spot").price_per_hour == cat.spot["m5.large"]  # 0 ignored
    assert cat.offering("c5.large", "spot").price_per_hour == 0.0286  # original untouched
