"""How AWS bills what mark uses: pure functions, shared by ledger, simulator and report.

- EC2 Linux: per second, with a 60-second minimum each time an instance starts
  running (a launch, or a start of a stopped standby).
- Lambda: duration rounded up to the millisecond, times the configured memory
  in GB, priced per GB-second; plus a fee per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mark.catalog import LambdaPrices
from mark.state.records import LedgerEntry

EC2_MINIMUM_S = 60.0


@dataclass(frozen=True, slots=True)
class Ec2Charge:
    seconds: float
    billed_seconds: float
    cost: float


@dataclass(frozen=True, slots=True)
class LambdaCharge:
    requests: int
    billed_ms: int
    gb_seconds: float
    cost: float


def ec2_charge(
    price_per_hour: float, start: float, end: float, minimum_s: float = EC2_MINIMUM_S
) -> Ec2Charge:
    """Charge of one run of an instance from ``start`` to ``end`` (seconds)."""
    if end < start:
        raise ValueError(f"run ends ({end}) before it starts ({start})")
    seconds = end - start
    billed = max(minimum_s, float(math.ceil(seconds - 1e-9)))
    return Ec2Charge(seconds, billed, billed * price_per_hour / 3600.0)


def lambda_charge(
    prices: LambdaPrices,
    duration_ms: float,
    memory_mb: int,
    requests: int = 1,
    arch: str = "x86_64",
) -> LambdaCharge:
    """Charge of ``requests`` invocations that together ran ``duration_ms``."""
    if duration_ms < 0 or memory_mb <= 0 or requests < 0:
        raise ValueError("duration, memory and requests must be non-negative (memory positive)")
    billed_ms = math.ceil(duration_ms - 1e-9)
    gb_s = billed_ms / 1000.0 * memory_mb / 1024.0
    rate = gb_second_rate(prices, arch)
    return LambdaCharge(requests, billed_ms, gb_s, gb_s * rate + requests * prices.per_request)


@dataclass
class _ModelCharges:
    start: float
    end: float
    requests: int = 0
    seconds: float = 0.0
    billed_ms: int = 0
    gb_seconds: float = 0.0
    cost: float = 0.0


@dataclass
class LambdaCharges:
    """Lambda charges per model since the last ``take``: what each ``Serverless``
    adapter accumulates between ledger flushes (one entry per model and flush)."""

    unit_price: float  # $ per GB-second, recorded on the ledger entries
    _pending: dict[str, _ModelCharges] = field(default_factory=dict)

    def add(
        self, model: str, start: float, end: float, duration_ms: float, charge: LambdaCharge
    ) -> None:
        p = self._pending.setdefault(model, _ModelCharges(start=start, end=end))
        p.start = min(p.start, start)
        p.end = max(p.end, end)
        p.requests += charge.requests
        p.seconds += duration_ms / 1000.0
        p.billed_ms += charge.billed_ms
        p.gb_seconds += charge.gb_seconds
        p.cost += charge.cost

    def take(self) -> list[LedgerEntry]:
        """The pending charges as ledger entries, oldest model name first; then none."""
        out = [
            LedgerEntry(
                kind="lambda",
                model=model,
                start=p.start,
                end=p.end,
                component="lambda",
                unit_price=self.unit_price,
                cost=p.cost,
                seconds=p.seconds,
                billed_seconds=p.billed_ms / 1000.0,
                requests=p.requests,
                gb_seconds=p.gb_seconds,
            )
            for model, p in sorted(self._pending.items())
        ]
        self._pending.clear()
        return out


def gb_second_rate(prices: LambdaPrices, arch: str) -> float:
    return prices.per_gb_second_arm64 if arch == "arm64" else prices.per_gb_second_x86
