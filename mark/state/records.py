"""Plain records the store takes and returns, so callers never hold ORM objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    instance_id: str
    model: str
    instance_type: str
    market: str
    role: str
    state: str
    price_per_hour: float
    launched_at: float
    updated_at: float
    address: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceEvent:
    instance_id: str
    state: str
    at: float
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ArrivalWindow:
    """Rows that arrived for ``model`` in one sample window. ``source`` is the frontend
    that counted them: frontends sharing a database each write their own count, and the
    store's reads sum them (``source`` "" there, as in rows written before sources)."""

    model: str
    window_start: float
    window_s: float
    count: int
    source: str = ""

    @property
    def rate(self) -> float:
        """Requests per second in this window."""
        return self.count / self.window_s


@dataclass(frozen=True, slots=True)
class LatencyRollup:
    """One model-minute. ``requests`` counts rows (instances) finished, the unit of load
    and of the SLO; ``http_requests`` the inference requests (HTTP calls) that arrived,
    each of one or more rows (None: not counted, a minute recorded before mark kept it).
    ``source`` is the frontend that measured the minute, as for ``ArrivalWindow``.
    """

    model: str
    minute_start: float
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    slo_hits: int
    slo_misses: int
    spilled: int = 0
    errors: int = 0
    http_requests: int | None = None
    source: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    model: str
    at: float
    action: str  # launch | retire | start-standby | stop-standby | backup | keep
    reason: str
    instance_type: str | None = None
    market: str | None = None
    count: int = 1
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class PlanRecord:
    model: str
    at: float
    planner: str
    forecast: Sequence[float]
    horizon_cost: float
    explanation: Mapping[str, Any] = field(default_factory=dict)
    decisions: Sequence[Decision] = ()
    id: int | None = None


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    kind: str  # ec2 | lambda
    model: str
    start: float
    end: float
    component: str  # on-demand | spot | standby | lambda
    unit_price: float
    cost: float
    instance_id: str | None = None
    instance_type: str | None = None
    seconds: float = 0.0
    billed_seconds: float = 0.0
    requests: int = 0
    gb_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    """T_b of one model on one instance type, and where the numbers came from.

    ``source`` is ``measured`` (an agent timed it on that type), ``shipped`` (a
    profile file in the model spec) or ``emulated`` (the local world's rule).
    """

    model: str
    instance_type: str
    source: str
    batch_latency_s: tuple[tuple[int, float], ...]
    measured_at: float
    device: str | None = None


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """An API key as the store keeps it: never the secret, only its SHA-256 (``hash``).

    ``scopes`` are what it may do (``inference``, ``metrics``, ``admin``); ``rate_rps``
    and ``max_concurrency`` are its own limits (None: the configured defaults).
    """

    id: str
    name: str
    scopes: tuple[str, ...]
    hash: str
    created_at: float
    revoked_at: float | None = None
    rate_rps: float | None = None
    max_concurrency: int | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class ControlStateRecord:
    """The control state saved for a cluster: JSON in the layout ``version`` names."""

    key: str
    version: int
    state: Mapping[str, Any]
    saved_at: float
    saved_by: str | None = None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """Who may act for a cluster: ``holder``, since ``acquired_at``, until ``expires_at``."""

    key: str
    holder: str
    acquired_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class FrontendRecord:
    """A frontend's beat: its id (``mark.identity.frontend_id``), its API's address, when
    it started and last beat, when its last agent sync read the retiring marks (every mark
    made before then is applied: ``mark.control.retiring``), and per model what it has
    counted since it started (``mark.control.cluster_feed``)."""

    id: str
    url: str
    started_at: float
    last_seen: float
    synced_at: float | None = None
    feed: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
