"""AWS billing rules computed by hand."""

from __future__ import annotations

import pytest

from mark.billing import (
    LAMBDA,
    LAMBDA_ON_PC,
    LAMBDA_PC,
    LambdaCharges,
    ProvisionedPeriod,
    ec2_charge,
    lambda_charge,
    provisioned_billed_s,
    provisioned_rates,
)
from mark.catalog import load_catalog


def test_ec2_bills_per_second_with_a_sixty_second_minimum() -> None:
    short = ec2_charge(0.085, 100.0, 130.0)
    assert (short.seconds, short.billed_seconds) == (30.0, 60.0)
    assert short.cost == pytest.approx(60 * 0.085 / 3600)
    long = ec2_charge(0.085, 0.0, 3600.4)
    assert long.billed_seconds == 3601.0
    assert long.cost == pytest.approx(3601 * 0.085 / 3600)
    with pytest.raises(ValueError):
        ec2_charge(0.085, 10.0, 5.0)


def test_lambda_bills_memory_times_rounded_duration_plus_requests() -> None:
    prices = load_catalog().lambda_prices
    c = lambda_charge(prices, duration_ms=1500.2, memory_mb=3072, requests=4)
    assert c.billed_ms == 1501
    assert c.gb_seconds == pytest.approx(1.501 * 3.0)
    assert c.cost == pytest.approx(1.501 * 3.0 * 0.0000166667 + 4 * 0.20 / 1e6)
    arm = lambda_charge(prices, 1000, 1024, 1, arch="arm64")
    assert arm.cost == pytest.approx(0.0000133334 + 0.2e-6)


# us-east-1 x86 list prices (aws.amazon.com/lambda/pricing), written out by hand here
PC_RATE = 0.0000041667  # $/GB-s of provisioned concurrency configured
PC_DURATION = 0.0000097222  # $/GB-s of duration served on it


def test_shipped_provisioned_concurrency_prices_are_the_list_prices() -> None:
    prices = load_catalog().lambda_prices
    assert provisioned_rates(prices, "x86_64") == (PC_RATE, PC_DURATION)
    with pytest.raises(ValueError, match="only x86_64"):
        provisioned_rates(prices, "arm64")


def test_an_invocation_on_provisioned_concurrency_pays_the_lower_duration_rate() -> None:
    prices = load_catalog().lambda_prices
    c = lambda_charge(prices, duration_ms=250.0, memory_mb=2048, requests=1, provisioned=True)
    assert c.gb_seconds == pytest.approx(0.5)
    assert c.cost == pytest.approx(0.5 * PC_DURATION + 0.2e-6)


def test_provisioned_time_is_billed_in_five_minute_steps() -> None:
    assert [provisioned_billed_s(s) for s in (0, 0.5, 300, 300.2, 899, 901)] == [
        0,
        300,
        300,
        600,
        900,
        1200,
    ]


def test_a_provisioned_period_taken_in_pieces_bills_exactly_the_whole_period() -> None:
    """5 × 2048 MB set at t=1000, read at 1040, 1400 and 1600, removed at 1750: a period
    of 750 s, billed 900 s: 5 × 2 GB × 900 s = 9000 GB-s, split over two models."""
    period = ProvisionedPeriod(5, 2048, PC_RATE, ("b", "a"), start=1000.0)
    first = period.take(1040.0)  # the first 5 minutes are owed at once
    assert [(e.model, e.component, e.billed_seconds, e.gb_seconds) for e in first] == [
        ("a", LAMBDA_PC, 300.0, 1500.0),  # 5 × 2 GB × 300 s, half each
        ("b", LAMBDA_PC, 300.0, 1500.0),
    ]
    pieces = first + period.take(1400.0) + period.take(1600.0)
    assert period.take(1600.0) == []  # nothing new since the last take
    period.close(1750.0)
    pieces += period.take(5000.0)  # past the removal: charged only up to it
    assert period.settled and period.take(6000.0) == []
    per_model = [e for e in pieces if e.model == "a"]
    assert sum(e.seconds for e in per_model) == pytest.approx(750.0)
    assert sum(e.billed_seconds for e in per_model) == 900.0
    assert sum(e.gb_seconds for e in pieces) == pytest.approx(9000.0)
    assert sum(e.cost for e in pieces) == pytest.approx(9000.0 * PC_RATE)  # 0.0375003 $
    assert pieces[-1].end == 1750.0


def test_lambda_charges_keep_on_demand_and_provisioned_invocations_apart() -> None:
    prices = load_catalog().lambda_prices
    charges = LambdaCharges(0.0000166667, PC_DURATION)
    charges.add("m", 1.0, 2.0, 100.0, lambda_charge(prices, 100.0, 1024))
    on_pc_charge = lambda_charge(prices, 100.0, 1024, provisioned=True)
    charges.add("m", 2.0, 3.0, 100.0, on_pc_charge, LAMBDA_ON_PC)
    charges.add("m", 3.0, 4.0, 100.0, on_pc_charge, LAMBDA_ON_PC)
    on_demand, on_pc = charges.take()
    assert (on_demand.component, on_demand.requests, on_demand.unit_price) == (
        LAMBDA,
        1,
        0.0000166667,
    )
    assert (on_pc.component, on_pc.requests, on_pc.unit_price) == (LAMBDA_ON_PC, 2, PC_DURATION)
    assert on_pc.cost == pytest.approx(0.2 * PC_DURATION + 2 * 0.2e-6)
    with pytest.raises(ValueError, match="not a component"):
        charges.add("m", 1.0, 2.0, 1.0, lambda_charge(prices, 1.0, 128), LAMBDA_PC)
