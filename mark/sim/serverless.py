"""Simulated AWS Lambda: warm and cold execution environments, a concurrency limit, GB-s.

An invocation takes an idle environment if one was freed within
``keep_warm_s`` (most recently freed first, as Lambda reuses them), else a new
one that pays the cold start. When ``concurrency`` environments are busy the
invocation is throttled (429 TooManyRequests) and its requests fail. Billing
is the real formula (``mark.billing.lambda_charge``): duration rounded up to
the millisecond × memory, plus the per-request price. Cold-start init time
is not billed (managed runtimes), as on AWS until 2025.

``queue_timeout_s`` models the local world's stand-in (``mark.cloud.local.lambda_``),
which queues an invocation that finds every environment busy, first come first
served, for up to that long before it fails as throttled. AWS fails it at once
(0, the default, which the experiments use).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from mark.billing import lambda_charge
from mark.catalog import LambdaPrices


@dataclass
class SimLambda:
    prices: LambdaPrices
    memory_mb: int = 3072
    cold_start_s: float = 2.5
    concurrency: int = 1000
    keep_warm_s: float = 600.0
    queue_timeout_s: float = 0.0
    invocations: int = 0
    requests: int = 0
    cold_starts: int = 0
    throttled: int = 0
    throttled_requests: int = 0
    cost: float = 0.0
    gb_seconds: float = 0.0
    _busy: list[float] = field(default_factory=list)  # heap of end times
    _idle: deque[float] = field(default_factory=deque)  # freed-at times, ascending

    def invoke(self, now: float, requests: int, duration_s: float) -> float | None:
        """Run one invocation of ``requests`` at ``now``; returns when it answers, or None
        if throttled."""
        busy, idle = self._busy, self._idle
        while busy and busy[0] <= now:
            idle.append(heapq.heappop(busy))
        while idle and idle[0] < now - self.keep_warm_s:
            idle.popleft()
        if idle:
            idle.pop()
            start = now
        elif len(busy) >= self.concurrency:
            if busy[0] - now > self.queue_timeout_s:
                self.throttled += 1
                self.throttled_requests += requests
                return None
            start = heapq.heappop(busy)  # waits for the first environment to free
        else:
            self.cold_starts += 1
            start = now + self.cold_start_s
        end = start + duration_s
        heapq.heappush(busy, end)
        # Lambda bills the invocation, whatever batch of requests it carries.
        charge = lambda_charge(self.prices, duration_s * 1000.0, self.memory_mb, 1)
        self.invocations += 1
        self.requests += requests
        self.cost += charge.cost
        self.gb_seconds += charge.gb_seconds
        return end
