"""AWS billing rules computed by hand."""

from __future__ import annotations

import pytest

from mark.billing import ec2_charge, lambda_charge
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
