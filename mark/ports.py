"""The ports: small protocols each world (sim, local, aws) provides.

Everything AWS-specific sits behind ``Fleet`` and ``Serverless``; the control
loop only ever sees these. Records are plain frozen dataclasses so a simulator,
a moto-backed adapter and the real one are interchangeable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from mark.catalog import Market
from mark.state.records import (
    ApiKeyRecord,
    ArrivalWindow,
    Decision,
    InstanceEvent,
    InstanceRecord,
    LatencyRollup,
    LedgerEntry,
    PlanRecord,
    ProfileRecord,
)


class InstanceState(StrEnum):
    """Lifecycle of an instance; the same names as EC2's, plus ``ready`` (agent answers)."""

    PENDING = "pending"
    RUNNING = "running"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SHUTTING_DOWN = "shutting-down"
    TERMINATED = "terminated"


class InstanceRole(StrEnum):
    SERVING = "serving"  # bought by the planner
    BACKUP = "backup"  # launched by the SLO monitor
    STANDBY = "standby"  # stopped burstable, started on a spot interruption
    EXPLORE = "explore"  # the control loop measuring an unprofiled type; retired once measured
    PROFILING = "profiling"  # `mark profile --type`'s instance; no plan, pool or step claims it


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    model: str
    instance_type: str
    market: Market
    count: int = 1
    role: InstanceRole = InstanceRole.SERVING
    client_token: str | None = None
    """Same token, same launch: a fleet that honours it never buys a repeated request twice."""
    version: str | None = None
    """The model version the instances serve (tagged; their agents fetch it at boot)."""


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What a Fleet reports about one instance it owns."""

    instance_id: str
    model: str
    instance_type: str
    market: Market
    state: InstanceState
    role: InstanceRole
    launched_at: float
    address: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    version: str | None = None
    """The model version it serves, as tagged at launch (None: not tagged, any version)."""


class NoticeKind(StrEnum):
    INTERRUPTION = "interruption"  # reclaimed in about 2 minutes
    REBALANCE = "rebalance"  # elevated risk of interruption


@dataclass(frozen=True, slots=True)
class InterruptionNotice:
    instance_id: str
    kind: NoticeKind
    at: float
    action_at: float | None = None  # when the instance will be reclaimed


@dataclass(frozen=True, slots=True)
class SpillResult:
    outputs: Sequence[Any]
    duration_ms: float
    billed_ms: int
    memory_mb: int
    cold_start: bool


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch (virtual in the simulator)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        ...


class Fleet(Protocol):
    async def launch(self, request: LaunchRequest) -> list[InstanceInfo]:
        """Launch instances; raise ``InsufficientCapacity`` or ``Throttled`` on failure."""
        ...

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate instances mark owns; raise ``NotOwned`` for any other."""
        ...

    async def stop(self, instance_ids: Sequence[str]) -> None:
        """Stop (not terminate) burstable standbys."""
        ...

    async def start(self, instance_ids: Sequence[str]) -> None:
        """Start stopped standbys."""
        ...

    async def list(self) -> list[InstanceInfo]:
        """Every instance mark owns, in any state but terminated."""
        ...

    def interruptions(self) -> AsyncIterator[InterruptionNotice]:
        """Spot interruption and rebalance notices as they arrive."""
        ...

    async def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """Current spot price per hour by instance type."""
        ...


class Draining(Protocol):
    """Where requests go, told before an instance is terminated (the daemon's dispatchers,
    and through the store every other frontend's): the request path stops sending to it
    and lets its batches in flight finish, so a retirement costs no request a failed batch
    and a spill."""

    async def retire(self, instance_ids: Sequence[str]) -> None:
        """No new batch to these instances; return once their batches in flight ended
        and the other frontends have read the mark (bounded: a batch has its verdict within
        one grace or is spilled; a frontend reads within a sync or is not waited for)."""
        ...

    async def keep(self, instance_ids: Sequence[str]) -> None:
        """Serve on them again: the cloud refused to terminate them."""
        ...


SPILL_PAYLOAD_LIMIT = 6 * 1024 * 1024
"""Lambda's synchronous Invoke payload limit, request and response alike (6 MB: AWS Lambda
quotas, "Invocation payload (request and response)")."""


class Serverless(Protocol):
    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        """Run one batch on the spill function, its rows decoded as the model's ``dtype``."""
        ...

    async def warm_up(self, model: str, concurrency: int) -> None:
        """Ping the function so ``concurrency`` runtimes are warm."""
        ...


class Store(Protocol):
    """Instances, telemetry roll-ups, plans and decisions, the ledger, API keys (``SqlStore``)."""

    async def upsert_instance(self, rec: InstanceRecord, reason: str | None = None) -> None:
        """Insert or update an instance; a changed state is logged as a transition."""
        ...

    async def set_instance_state(
        self,
        instance_id: str,
        state: str,
        at: float,
        *,
        address: str | None = None,
        reason: str | None = None,
        only_from: Collection[str] | None = None,
    ) -> None:
        """Record a state transition of a known instance (only from ``only_from`` states)."""
        ...

    async def instances(
        self, *, model: str | None = None, states: Sequence[str] | None = None
    ) -> list[InstanceRecord]:
        """Instances, oldest launch first."""
        ...

    async def instance_events(self, instance_id: str) -> list[InstanceEvent]:
        """An instance's transitions in time order."""
        ...

    async def add_arrivals(self, windows: Sequence[ArrivalWindow]) -> None:
        """Record closed arrival sample windows (P_s)."""
        ...

    async def arrivals(self, model: str, since: float, until: float) -> list[ArrivalWindow]:
        """Arrival windows starting in [since, until)."""
        ...

    async def add_latency_rollup(self, r: LatencyRollup) -> None:
        """Record (or replace) one model-minute of latency and SLO outcomes."""
        ...

    async def latency_rollups(self, model: str, since: float, until: float) -> list[LatencyRollup]:
        """Roll-ups of minutes starting in [since, until)."""
        ...

    async def record_plan(self, plan: PlanRecord) -> int:
        """Store a plan with its decisions; returns its id."""
        ...

    async def record_decision(self, d: Decision) -> None:
        """Store a decision taken outside a plan."""
        ...

    async def plans(self, model: str, limit: int = 10) -> list[PlanRecord]:
        """Newest plans first."""
        ...

    async def decisions(self, since: float, until: float) -> list[Decision]:
        """Decisions taken in [since, until)."""
        ...

    async def add_charges(self, entries: Sequence[LedgerEntry]) -> None:
        """Append priced charges to the ledger."""
        ...

    async def ledger(
        self, since: float | None = None, until: float | None = None, model: str | None = None
    ) -> list[LedgerEntry]:
        """Charges starting in [since, until)."""
        ...

    async def put_profile(self, p: ProfileRecord) -> None:
        """Record a model's T_b on an instance type (one row per model, type and source)."""
        ...

    async def profiles(self, model: str) -> list[ProfileRecord]:
        """Every profile recorded for ``model``."""
        ...

    async def add_api_key(self, key: ApiKeyRecord) -> None:
        """Record a new API key (the hash of its secret, never the secret)."""
        ...

    async def api_keys(self, *, active_only: bool = False) -> list[ApiKeyRecord]:
        """API keys, oldest first; with ``active_only``, those not revoked."""
        ...

    async def revoke_api_key(self, key_id: str, at: float) -> ApiKeyRecord:
        """Revoke a key (``StoreError`` if unknown); returns it as stored."""
        ...
