"""AWS errors as mark's error types, chosen by error *code*, and the bounded retry.

No capacity is ``InsufficientCapacity`` (the reconciler falls back to the next
offering), throttling is ``Throttled``, and anything else is an ``AwsApiError``
carrying the code. ``RetryPolicy`` is the back-off the AWS adapters retry
throttling, 5xx codes and dropped connections with (botocore's own retries are
switched off, so its bound is the one written here).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from mark.errors import CloudError, InsufficientCapacity, Throttled

#: Codes meaning "no capacity for this offering now": try another offering.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "VcpuLimitExceeded",
    }
)
#: Codes meaning "slow down": retried with back-off before raising ``Throttled``.
THROTTLE_CODES = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled"}
)

#: Server-side failures worth another try; raised as ``AwsApiError`` if they persist.
TRANSIENT_CODES = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"}
)


class AwsApiError(CloudError):
    """An AWS error mark has no specific type for; ``code`` is AWS's error code."""

    def __init__(self, operation: str, code: str, message: str) -> None:
        super().__init__(f"{operation}: {code}: {message}")
        self.operation = operation
        self.code = code


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with full-jitter exponential back-off (AWS's recommended shape)."""

    attempts: int = 5
    base_s: float = 0.2
    cap_s: float = 5.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        return self.rng.uniform(0.0, min(self.cap_s, self.base_s * 2**retry))


def map_client_error(err: ClientError, operation: str) -> CloudError:
    """The mark error type for an AWS error, chosen by its code."""
    error = err.response.get("Error", {})
    code = str(error.get("Code", "Unknown"))
    message = str(error.get("Message", ""))
    if code in CAPACITY_CODES:
        return InsufficientCapacity(f"{operation}: {code}: {message}")
    if code in THROTTLE_CODES:
        return Throttled(f"{operation}: {code}: {message}")
    return AwsApiError(operation, code, message)
