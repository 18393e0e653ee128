"""How AWS bills what mark uses: pure functions, shared by ledger, simulator and report.

- EC2 Linux: per second, with a 60-second minimum each time an instance starts
  running (a launch, or a start of a stopped standby).
- EBS: per GB-month of provisioned storage, prorated by the second; a stopped
  instance bills nothing but its volume (``ebs_charge``).
- Lambda: duration rounded up to the millisecond, times the configured memory
  in GB, priced per GB-second; plus a fee per request.
- Lambda provisioned concurrency: the configured concurrency times the memory
  in GB, per GB-second for as long as it is configured, each configured period
  rounded up to 5 minutes; requests served on it pay their duration at a lower
  rate (and the same request fee). Prices: ``LambdaPrices``.

Ledger components (``LedgerEntry.component``, at most 16 characters):
``lambda`` for on-demand invocations, ``lambda-on-pc`` for invocations served
by provisioned concurrency, ``lambda-pc`` for the provisioned concurrency
itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mark.catalog import LambdaPrices
from mark.state.records import LedgerEntry
from provisioner.standby_value import HOURS_PER_MONTH

EC2_MINIMUM_S = 60.0
EBS_MONTH_S = HOURS_PER_MONTH * 3600.0  # the average month (8,760 h / 12) a GB-month spans
PROVISIONED_ROUNDING_S = 300.0  # a provisioned-concurrency period is billed in 5-minute steps
LAMBDA = "lambda"
LAMBDA_ON_PC = "lambda-on-pc"
LAMBDA_PC = "lambda-pc"
#: Components billed per request and GB-second of duration (the others: EC2, or lambda-pc).
LAMBDA_RUN_COMPONENTS = frozenset({LAMBDA, LAMBDA_ON_PC})
LAMBDA_COMPONENTS = LAMBDA_RUN_COMPONENTS | {LAMBDA_PC}


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


def ebs_charge(gb: float, gb_month_price: float, start: float, end: float) -> float:
    """Charge of ``gb`` of EBS storage held from ``start`` to ``end`` (seconds), e.g. the
    volume of an instance while it is stopped.

    AWS bills a volume per GB-month prorated by the second over the billing month (AWS
    Knowledge Center, "ebs-volume-charges": a 1 GB volume for the 744 hours of a 31-day
    month is one GB-month). The month here is a fixed 730 h, the average one (8,760 h /
    12), not the calendar month's 672 to 744 h: a simulation spans no billing month, and a
    period's cost must not depend on the date it falls on.
    """
    if end < start:
        raise ValueError(f"period ends ({end}) before it starts ({start})")
    if gb < 0 or gb_month_price < 0:
        raise ValueError("volume size and price must be non-negative")
    return gb * gb_month_price * (end - start) / EBS_MONTH_S


def lambda_charge(
    prices: LambdaPrices,
    duration_ms: float,
    memory_mb: int,
    requests: int = 1,
    arch: str = "x86_64",
    provisioned: bool = False,
) -> LambdaCharge:
    """Charge of ``requests`` invocations that together ran ``duration_ms`` (served by
    provisioned concurrency if ``provisioned``)."""
    if duration_ms < 0 or memory_mb <= 0 or requests < 0:
        raise ValueError("duration, memory and requests must be non-negative (memory positive)")
    billed_ms = math.ceil(duration_ms - 1e-9)
    gb_s = billed_ms / 1000.0 * memory_mb / 1024.0
    rate = provisioned_rates(prices, arch)[1] if provisioned else gb_second_rate(prices, arch)
    return LambdaCharge(requests, billed_ms, gb_s, gb_s * rate + requests * prices.per_request)


def provisioned_billed_s(elapsed_s: float) -> float:
    """Seconds billed for a provisioned-concurrency period that has lasted ``elapsed_s``."""
    if elapsed_s <= 0:
        return 0.0
    return PROVISIONED_ROUNDING_S * math.ceil(elapsed_s / PROVISIONED_ROUNDING_S - 1e-9)


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
    provisioned_unit_price: float = 0.0  # the same for invocations served on provisioned conc.
    _pending: dict[tuple[str, str], _ModelCharges] = field(default_factory=dict)

    def add(
        self,
        model: str,
        start: float,
        end: float,
        duration_ms: float,
        charge: LambdaCharge,
        component: str = LAMBDA,
    ) -> None:
        if component not in LAMBDA_RUN_COMPONENTS:
            raise ValueError(f"{component!r} is not a component of Lambda invocations")
        p = self._pending.setdefault((model, component), _ModelCharges(start=start, end=end))
        p.start = min(p.start, start)
        p.end = max(p.end, end)
        p.requests += charge.requests
        p.seconds += duration_ms / 1000.0
        p.billed_ms += charge.billed_ms
        p.gb_seconds += charge.gb_seconds
        p.cost += charge.cost

    def take(self) -> list[LedgerEntry]:
        """The pending charges as ledger entries, by model then component; then none."""
        out = [
            LedgerEntry(
                kind="lambda",
                model=model,
                start=p.start,
                end=p.end,
                component=component,
                unit_price=self.unit_price if component == LAMBDA else self.provisioned_unit_price,
                cost=p.cost,
                seconds=p.seconds,
                billed_seconds=p.billed_ms / 1000.0,
                requests=p.requests,
                gb_seconds=p.gb_seconds,
            )
            for (model, component), p in sorted(self._pending.items())
        ]
        self._pending.clear()
        return out


def gb_second_rate(prices: LambdaPrices, arch: str) -> float:
    return prices.per_gb_second_arm64 if arch == "arm64" else prices.per_gb_second_x86


def provisioned_rates(prices: LambdaPrices, arch: str) -> tuple[float, float]:
    """($/GB-s of configured concurrency, $/GB-s of duration served on it); x86 only,
    the one architecture whose prices ship (and the one the stack deploys)."""
    if arch != "x86_64":
        raise ValueError(f"no provisioned-concurrency prices ship for {arch}; only x86_64")
    return (
        prices.provisioned_concurrency_per_gb_second_x86,
        prices.provisioned_duration_per_gb_second_x86,
    )


@dataclass
class ProvisionedPeriod:
    """One period of provisioned concurrency, from when it was set until it is removed,
    charged as it accrues: each ``take`` prices the time since the last one.

    AWS rounds a whole period up to 5 minutes, so the seconds billed by one ``take``
    are the rounded total so far less what earlier takes billed: the pieces add up to
    exactly the period's bill, and a period just set already owes its first 5 minutes.
    The cost is split evenly over ``models`` (the function's capacity serves them all).
    """

    concurrency: int
    memory_mb: int
    rate: float  # $ per GB-second of configured concurrency
    models: tuple[str, ...]
    start: float
    end: float | None = None  # when it was removed; None while configured
    _taken_until: float = field(init=False)
    _billed_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.memory_mb <= 0 or not self.models:
            raise ValueError("a period needs concurrency >= 1, memory > 0 and a model")
        self._taken_until = self.start

    def close(self, at: float) -> None:
        self.end = max(self.start, at) if self.end is None else self.end

    @property
    def settled(self) -> bool:
        """Removed, and every second of it taken: nothing more to charge."""
        return self.end is not None and self._taken_until >= self.end

    def take(self, now: float) -> list[LedgerEntry]:
        """Ledger entries for the time since the last take (or the start) up to ``now``."""
        upto = min(now, self.end) if self.end is not None else now
        since = self._taken_until
        if upto <= since:
            return []
        billed = provisioned_billed_s(upto - self.start) - self._billed_s
        self._taken_until, self._billed_s = upto, self._billed_s + billed
        share = 1.0 / len(self.models)
        gb_s = self.concurrency * self.memory_mb / 1024.0 * billed * share
        return [
            LedgerEntry(
                kind="lambda",
                model=model,
                start=since,
                end=upto,
                component=LAMBDA_PC,
                unit_price=self.rate,
                cost=gb_s * self.rate,
                seconds=upto - since,
                billed_seconds=billed,
                gb_seconds=gb_s,
            )
            for model in sorted(self.models)
        ]


def provisioned_hourly(prices: LambdaPrices, concurrency: int, memory_mb: int) -> float:
    """$/h of keeping ``concurrency`` environments of ``memory_mb`` provisioned (x86), the
    fixed part of the spill function's bill that the cluster's spend rail counts."""
    if concurrency <= 0:
        return 0.0
    return concurrency * memory_mb / 1024.0 * provisioned_rates(prices, "x86_64")[0] * 3600.0


def ebs_per_hour(gb: float, gb_month_price: float) -> float:
    """What a volume of ``gb`` costs an hour at ``gb_month_price`` ($ per GB-month), as
    ``ebs_charge`` prorates it."""
    return gb * gb_month_price * 3600.0 / EBS_MONTH_S
