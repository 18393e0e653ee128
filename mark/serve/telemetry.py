"""Telemetry of one model: arrivals per sample window, latency and SLO outcome per minute.

What arrives and ends here are rows (instances): a request of 16 instances is 16
arrivals, as the planner must see the load. HTTP inference requests are counted apart
(``requests``, per minute and in ``/metrics`` as ``mark_inference_requests_total``), so
a person is not told 2,055 requests where 10 calls came; ``mark_requests_total{outcome}``
keeps its name (dashboards query it) but counts rows too.

In memory and cheap on the request path (a few integer adds); the daemon
drains closed windows into the store, the empty ones too: a window with no
arrivals is a zero the forecaster must see, while a window the store does not
have (the daemon was not running) is missing data, not zero load. What is drained is
not lost to a failed flush: while the database is out the store buffers it
(``mark.state.outbox``). ``recent``
keeps the last M outcomes for the SLO monitor, and the counters feed ``/metrics``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from bouncer.miss_budget import NO_TALLY, MissTally
from mark.state.records import ArrivalWindow, LatencyRollup
from provisioner.spill_evidence import SpillCounts

OUTCOMES = ("served", "spilled", "error", "declined")
SPILL_CAUSES = ("rejected", "no-backend", "failure", "drain", "retry", "closing")
"""Why requests went to Lambda: the Bouncer rejected them, no instance could take them,
their instance failed or hung, it left the backends, the endpoint's retry of failed
rows, or the dispatcher stopped batching."""
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_EMPTY_BACKFILL_S = 3600.0
"""Empty windows are handed over for at most this long before a drain: a drain that
comes after a longer stall (a suspended machine) leaves the older ones missing."""


@dataclass
class _Minute:
    latencies_ms: list[float] = field(default_factory=list)
    requests: int = 0
    hits: int = 0
    misses: int = 0
    spilled: int = 0
    errors: int = 0


@dataclass
class Telemetry:
    model: str
    rt_max_ms: float
    sample_window_s: float = 5.0
    recent_size: int = 100
    started_at: float | None = None
    """From when windows count (empty ones included); None: from the first arrival or drain."""
    source: str = ""
    """The frontend counting (its id), stamped on what ``drain`` hands over: frontends
    sharing a database each keep their own rows, which the store's reads sum."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    latency_sum_s: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    within_slo: int = 0
    over_slo: int = 0
    spills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPILL_CAUSES, 0))
    rejects: dict[str, int] = field(default_factory=dict)
    """Bouncer rejects by instance type."""
    lambda_cost: float = 0.0
    requests: int = 0
    """Inference requests (HTTP calls) whose rows arrived: ``arrival`` calls."""
    rows: int = 0
    """Rows (instances) arrived, the sum of every ``arrival``'s ``n``."""
    _arrivals: dict[float, int] = field(default_factory=dict)
    _minutes: dict[float, _Minute] = field(default_factory=dict)
    recent: deque[bool] = field(default_factory=deque)
    _fresh: list[float] = field(default_factory=list)
    _spills: SpillCounts = field(default_factory=SpillCounts)
    monitored: list[int] = field(default_factory=lambda: [0, 0])
    """The SLO monitor's input since the start, never taken: [within RT_max, not]."""
    spills_ended: list[int] = field(default_factory=lambda: [0, 0])
    """Spilled requests ended since the start: [all, within RT_max]."""
    _next: float | None = None  # the first window not yet drained

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.recent_size)
        if self.started_at is not None:
            self._next = self._window(self.started_at)

    def _window(self, t: float) -> float:
        return math.floor(t / self.sample_window_s) * self.sample_window_s

    def arrival(self, now: float, n: int = 1) -> None:
        """One request of ``n`` rows arrived."""
        w = self._window(now)
        self.requests += 1
        self.rows += n
        self._minute(now).requests += 1
        self._arrivals[w] = self._arrivals.get(w, 0) + n
        if self._next is None:
            self._next = w

    def outcome(
        self, now: float, latency_s: float, *, ok: bool, spilled: bool, declined: bool = False
    ) -> None:
        """One request finished (or failed) ``latency_s`` after it arrived. A ``declined``
        one (``bouncer.miss_budget``) is a miss and an error to the rollups, but not the SLO
        monitor's input: the budget chose it, it is no sign of too few instances."""
        kind = (
            "declined" if declined else "error" if not ok else ("spilled" if spilled else "served")
        )
        self.counts[kind] += 1
        self.latency_sum_s += latency_s
        minute = self._minute(now)
        ms = latency_s * 1000.0
        within = ok and ms <= self.rt_max_ms
        minute.latencies_ms.append(ms)
        minute.hits += within
        minute.misses += not within
        minute.spilled += spilled
        minute.errors += not ok
        self.recent.append(within)
        self.within_slo += within
        self.over_slo += not within
        for i, edge in enumerate(LATENCY_BUCKETS_S):
            if latency_s <= edge:
                self.latency_buckets[i] += 1
        if not declined:
            self._fresh.append(latency_s if ok else math.inf)
            self.monitored[0 if within else 1] += 1
        if spilled:
            s = self._spills
            self._spills = SpillCounts(s.total + 1, s.within + within, s.cost)
            self.spills_ended[0] += 1
            self.spills_ended[1] += within

    def _minute(self, now: float) -> _Minute:
        return self._minutes.setdefault(math.floor(now / 60.0) * 60.0, _Minute())

    def spilled(self, cause: str, n: int, instance_type: str | None = None) -> None:
        """``n`` requests handed to Lambda for ``cause`` (``rejected``: by an agent of
        ``instance_type``)."""
        self.spills[cause] = self.spills.get(cause, 0) + n
        if cause == "rejected" and instance_type is not None:
            self.rejects[instance_type] = self.rejects.get(instance_type, 0) + n

    def lambda_charged(self, cost: float) -> None:
        self.lambda_cost += cost
        s = self._spills
        self._spills = SpillCounts(s.total, s.within, s.cost + cost)

    def take_spills(self) -> SpillCounts:
        """Spilled requests ended, and Lambda charges, since the last call: the spill
        evidence the planner reads (``provisioner.spill_evidence``)."""
        fresh, self._spills = self._spills, SpillCounts()
        return fresh

    def feed(self, tally: MissTally = NO_TALLY) -> dict[str, float]:
        """What this frontend has counted since it started, for the leader's SLO monitor
        and spill evidence (``mark.control.cluster_feed``), and ``tally``, its miss budget's
        arrivals and misses now."""
        return {
            "hits": self.monitored[0],
            "misses": self.monitored[1],
            "spilled": self.spills_ended[0],
            "spill_within": self.spills_ended[1],
            "spill_cost": self.lambda_cost,
            "arrived": tally.arrived,
            "missed": tally.missed,
            "period_arrived": tally.period_arrived,
            "period_missed": tally.period_missed,
        }

    def take_latencies(self) -> list[float]:
        """Latencies (inf for failures) finished since the last call: the SLO monitor's input."""
        fresh, self._fresh = self._fresh, []
        return fresh

    def drain(
        self, now: float, *, everything: bool = False
    ) -> tuple[list[ArrivalWindow], list[LatencyRollup]]:
        """Hand over windows and minutes that are closed at ``now`` (all of them on shutdown).

        Every closed window since the first one is handed over once, with a
        count of 0 when nothing arrived in it.
        """
        open_window = self._window(now)
        if self._next is None:
            self._next = open_window
        first_empty = max(self._next, open_window - MAX_EMPTY_BACKFILL_S)
        counts = dict.fromkeys(self._windows_between(first_empty, open_window), 0)
        counts.update((w, c) for w, c in self._arrivals.items() if everything or w < open_window)
        windows = [
            ArrivalWindow(self.model, w, self.sample_window_s, c, self.source)
            for w, c in sorted(counts.items())
        ]
        for w in windows:
            self._arrivals.pop(w.window_start, None)
        self._next = max(self._next, open_window)
        open_minute = math.floor(now / 60.0) * 60.0
        rollups = []
        for start in sorted(self._minutes):
            if not everything and start >= open_minute:
                continue
            m = self._minutes.pop(start)
            q = np.percentile(m.latencies_ms, [50, 95, 99]) if m.latencies_ms else [0.0] * 3
            rollups.append(
                LatencyRollup(
                    self.model,
                    start,
                    len(m.latencies_ms),
                    float(q[0]),
                    float(q[1]),
                    float(q[2]),
                    m.hits,
                    m.misses,
                    m.spilled,
                    m.errors,
                    http_requests=m.requests,
                    source=self.source,
                )
            )
        return windows, rollups

    def _windows_between(self, first: float, end: float) -> list[float]:
        """Starts of the windows in [first, end), on the window grid."""
        n = max(0, round((end - first) / self.sample_window_s))
        # Snapped to the grid the same way arrivals are, so the keys match exactly.
        return [self._window(first + (k + 0.5) * self.sample_window_s) for k in range(n)]

    def prometheus(self) -> str:
        """Counters in Prometheus text format (the /metrics endpoint joins all models)."""
        label = f'model="{self.model}"'
        lines = [
            f"mark_inference_requests_total{{{label}}} {self.requests}",
            f"mark_rows_total{{{label}}} {self.rows}",
        ]
        lines += [  # rows by outcome, under the name dashboards know
            f'mark_requests_total{{{label},outcome="{k}"}} {v}' for k, v in self.counts.items()
        ]
        total = sum(self.counts.values())
        lines += [
            f'mark_request_latency_seconds_bucket{{{label},le="{edge:g}"}} {n}'
            for edge, n in zip(LATENCY_BUCKETS_S, self.latency_buckets, strict=True)
        ]
        lines.append(f'mark_request_latency_seconds_bucket{{{label},le="+Inf"}} {total}')
        lines.append(f"mark_request_latency_seconds_sum{{{label}}} {self.latency_sum_s:.6f}")
        lines.append(f"mark_request_latency_seconds_count{{{label}}} {total}")
        ok = sum(self.recent)
        frac = ok / len(self.recent) if self.recent else 1.0
        lines.append(f"mark_recent_slo_attainment{{{label}}} {frac:.4f}")
        lines.append(f"mark_requests_within_slo_total{{{label}}} {self.within_slo}")
        lines.append(f"mark_requests_over_slo_total{{{label}}} {self.over_slo}")
        lines += [f'mark_spills_total{{{label},cause="{c}"}} {n}' for c, n in self.spills.items()]
        lines += [
            f'mark_bouncer_rejects_total{{{label},type="{t}"}} {n}'
            for t, n in sorted(self.rejects.items())
        ]
        lines.append(f"mark_lambda_cost_dollars_total{{{label}}} {self.lambda_cost:.6f}")
        return "\n".join(lines) + "\n"
