"""What the local Lambda's invocations would cost on AWS: totals and ledger charges.

Each invocation's duration (plus, on a cold start, the init duration, which AWS
bills since August 2025) is priced by ``mark.billing.lambda_charge``: rounded
up to the millisecond, times the configured memory, plus the per-request fee.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mark.billing import LambdaCharge, LambdaCharges, gb_second_rate, lambda_charge
from mark.catalog import LambdaPrices
from mark.state.records import LedgerEntry


@dataclass(frozen=True, slots=True)
class LambdaUsage:
    """What the local Lambda has run and what AWS would charge for it, since it started."""

    requests: int
    errors: int
    cold_starts: int
    duration_ms: float
    billed_ms: int
    gb_seconds: float
    cost: float


class LambdaMeter:
    """Prices each finished invocation and keeps the running totals and pending charges."""

    def __init__(self, prices: LambdaPrices, memory_mb: int, arch: str, bill_init: bool) -> None:
        self._prices = prices
        self._memory_mb = memory_mb
        self._arch = arch
        self._bill_init = bill_init
        self._requests = 0
        self._errors = 0
        self._duration_ms = 0.0
        self._billed_ms = 0
        self._gb_seconds = 0.0
        self._cost = 0.0
        self._charges = LambdaCharges(gb_second_rate(prices, arch))

    def bill(
        self, model: str, started_at: float, duration_ms: float, init_ms: float, *, failed: bool
    ) -> LambdaCharge:
        """Charge one invocation that ran ``duration_ms`` (after ``init_ms`` of init if cold)."""
        billable = duration_ms + (init_ms if self._bill_init else 0.0)
        charge = lambda_charge(self._prices, billable, self._memory_mb, 1, self._arch)
        self._requests += charge.requests
        self._errors += int(failed)
        self._duration_ms += duration_ms
        self._billed_ms += charge.billed_ms
        self._gb_seconds += charge.gb_seconds
        self._cost += charge.cost
        self._charges.add(model, started_at, time.time(), duration_ms, charge)
        return charge

    def usage(self, cold_starts: int) -> LambdaUsage:
        return LambdaUsage(
            requests=self._requests,
            errors=self._errors,
            cold_starts=cold_starts,
            duration_ms=self._duration_ms,
            billed_ms=self._billed_ms,
            gb_seconds=self._gb_seconds,
            cost=self._cost,
        )

    def take_charges(self) -> list[LedgerEntry]:
        """Charges since the last call, one ledger entry per model."""
        return self._charges.take()
