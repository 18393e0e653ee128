"""A load run's outcomes: one record per request, and their summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bouncer.miss_budget import DECLINED_MARK


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request: due at ``due_s`` into the run, sent at ``sent_s``; status 0 = no answer."""

    due_s: float
    sent_s: float
    latency_s: float
    status: int
    served_by: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def declined(self) -> bool:
        """Declined by the SLO's miss budget (``bouncer.miss_budget``): an error by design."""
        return not self.ok and self.error is not None and DECLINED_MARK in self.error


@dataclass(frozen=True)
class Summary:
    sent: int
    ok: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    within_rt_max: float | None  # of all sent: answered OK within RT_max
    rt_max_ms: float | None
    spilled: int | None
    served_by: Mapping[str, int]
    max_send_lag_ms: float  # how far behind schedule the generator fell
    error_kinds: Mapping[str, int] = field(default_factory=dict)  # HTTP status or exception
    declined: int = 0
    """Of the errors, those the SLO's miss budget declined (a 503 by design, not a fault)."""

    def lines(self) -> list[str]:
        within = (
            f"{self.within_rt_max:.1%} within RT_max {self.rt_max_ms:g} ms"
            if self.within_rt_max is not None and self.rt_max_ms is not None
            else "RT_max unknown"
        )
        spilled = "unknown" if self.spilled is None else str(self.spilled)
        out = [
            f"sent {self.sent}, ok {self.ok}, errors {self.errors}"
            + (f" ({self.declined} declined by the SLO's miss budget)" if self.declined else "")
            + f", spilled to Lambda {spilled}",
            f"latency p50 {self.p50_ms:.1f} ms, p95 {self.p95_ms:.1f} ms, "
            f"p99 {self.p99_ms:.1f} ms; {within}",
            f"sender fell behind schedule by at most {self.max_send_lag_ms:.1f} ms",
        ]
        if self.error_kinds:
            kinds = sorted(self.error_kinds.items(), key=lambda kv: -kv[1])
            out.append("errors: " + ", ".join(f"{k} x{v}" for k, v in kinds))
        if self.served_by:
            out.append(
                "served by: " + ", ".join(f"{k} {v}" for k, v in sorted(self.served_by.items()))
            )
        return out


def summarize(
    outcomes: Sequence[RequestResult], rt_max_ms: float | None, spilled: int | None = None
) -> Summary:
    """Percentiles over answered requests; ``spilled`` from the daemon when responses are silent."""
    ok = [o for o in outcomes if o.ok]
    lat = np.array([o.latency_s * 1000.0 for o in ok]) if ok else np.zeros(1)
    p50, p95, p99 = (float(x) for x in np.percentile(lat, [50, 95, 99]))
    served = Counter(o.served_by for o in outcomes if o.served_by is not None)
    if served and spilled is None:
        spilled = served.get("lambda", 0)
    within = None
    if rt_max_ms is not None and outcomes:
        within = sum(o.latency_s * 1000.0 <= rt_max_ms for o in ok) / len(outcomes)
    lag = max((o.sent_s - o.due_s for o in outcomes), default=0.0)
    kinds = Counter(
        str(o.status) if o.status else (o.error or "?").split(":", 1)[0]
        for o in outcomes
        if not o.ok
    )
    return Summary(
        sent=len(outcomes),
        ok=len(ok),
        errors=len(outcomes) - len(ok),
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        within_rt_max=within,
        rt_max_ms=rt_max_ms,
        spilled=spilled,
        served_by=dict(served),
        max_send_lag_ms=max(0.0, lag) * 1000.0,
        error_kinds=dict(kinds),
        declined=sum(o.declined for o in outcomes),
    )
