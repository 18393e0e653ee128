"""The tables of the state store (SQLAlchemy 2 declarative).

Times are float seconds since the Unix epoch *on the world's clock*, so the
simulator's virtual time and the daemon's wall time share one schema. Money is
USD as float; every priced row keeps the unit price it used, so a report can be
re-derived without the catalog of that day.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class InstanceRow(Base):
    """One EC2 (or simulated, or local) instance mark launched or adopted."""

    __tablename__ = "instances"

    instance_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(64), index=True)
    instance_type: Mapped[str] = mapped_column(String(32))
    market: Mapped[str] = mapped_column(String(16))
    role: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    address: Mapped[str | None] = mapped_column(String(128))
    price_per_hour: Mapped[float] = mapped_column(Float)
    launched_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class InstanceEventRow(Base):
    """A state transition of an instance, with its timestamp."""

    __tablename__ = "instance_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(
        ForeignKey("instances.instance_id", ondelete="CASCADE"), index=True
    )
    state: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)


class ArrivalRow(Base):
    """Requests that arrived for a model in one sample window (P_s), as one frontend
    (``source``) counted them: frontends sharing the database each keep their own row."""

    __tablename__ = "arrivals"
    __table_args__ = (
        UniqueConstraint("model", "window_start", "source", name="uq_arrivals_window"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(64))
    window_start: Mapped[float] = mapped_column(Float)
    window_s: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)
    # The frontend that counted them; "" for rows written before 0006.
    source: Mapped[str] = mapped_column(String(128), default="", server_default="")


class LatencyRollupRow(Base):
    """Latency quantiles and SLO outcomes of one model over one minute, as one frontend
    (``source``) measured them."""

    __tablename__ = "latency_rollups"
    __table_args__ = (
        UniqueConstraint("model", "minute_start", "source", name="uq_latency_minute"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(64))
    minute_start: Mapped[float] = mapped_column(Float)
    requests: Mapped[int] = mapped_column(Integer)
    p50_ms: Mapped[float] = mapped_column(Float)
    p95_ms: Mapped[float] = mapped_column(Float)
    p99_ms: Mapped[float] = mapped_column(Float)
    slo_hits: Mapped[int] = mapped_column(Integer)
    slo_misses: Mapped[int] = mapped_column(Integer)
    spilled: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    # Inference requests (HTTP calls); ``requests`` counts rows. Null before 0005.
    http_requests: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The frontend that measured the minute; "" for rows written before 0006.
    source: Mapped[str] = mapped_column(String(128), default="", server_default="")


class PlanRow(Base):
    """What the controller decided in one step, and why."""

    __tablename__ = "plans"
    __table_args__ = (Index("ix_plans_model_at", "model", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float)
    planner: Mapped[str] = mapped_column(String(32))
    forecast: Mapped[list[float]] = mapped_column(JSON)
    horizon_cost: Mapped[float] = mapped_column(Float)
    explanation: Mapped[dict[str, Any]] = mapped_column(JSON)


class DecisionRow(Base):
    """One action taken (launch, retire, start standby, ...) with its reason."""

    __tablename__ = "decisions"
    __table_args__ = (Index("ix_decisions_at", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id", ondelete="SET NULL"))
    model: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float)
    action: Mapped[str] = mapped_column(String(32))
    instance_type: Mapped[str | None] = mapped_column(String(32))
    market: Mapped[str | None] = mapped_column(String(16))
    count: Mapped[int] = mapped_column(Integer, default=1)
    instance_id: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)


class LedgerRow(Base):
    """A priced charge: an EC2 run (per second, 60 s minimum) or Lambda invocations."""

    __tablename__ = "ledger"
    __table_args__ = (Index("ix_ledger_start", "start"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # ec2 | lambda
    model: Mapped[str] = mapped_column(String(64))
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float)
    component: Mapped[str] = mapped_column(String(16))  # on-demand | spot | standby | lambda
    instance_id: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str | None] = mapped_column(String(32))
    unit_price: Mapped[float] = mapped_column(Float)  # per hour (ec2) or per GB-s (lambda)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    billed_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    gb_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float)


class ProfileRow(Base):
    """T_b of a model on an instance type: the planner rates that offering from it."""

    __tablename__ = "profiles"
    __table_args__ = (
        UniqueConstraint("model", "instance_type", "source", name="uq_profiles_model_type"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16))  # measured | shipped | emulated
    batch_latency_s: Mapped[Any] = mapped_column(JSON)  # [[batch, seconds], ...]
    measured_at: Mapped[float] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(32))


class ApiKeyRow(Base):
    """An API key: its public id, the SHA-256 of its secret, its scopes and limits."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    scopes: Mapped[str] = mapped_column(String(64))  # comma-separated: inference,metrics,admin
    hash: Mapped[str] = mapped_column(String(64))  # SHA-256 of the secret, hex
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)
    rate_rps: Mapped[float | None] = mapped_column(Float)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)


class ControlStateRow(Base):
    """The control state a restarted controller needs (doomed instances, standby holds and
    starts owed, the SLO hold-off, avoided offerings, orphan clocks), as versioned JSON."""

    __tablename__ = "control_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # the cluster
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    saved_at: Mapped[float] = mapped_column(Float)
    saved_by: Mapped[str | None] = mapped_column(String(200))


class ControlLeaseRow(Base):
    """Which controller may act for a cluster, until when (renewed every step)."""

    __tablename__ = "control_lease"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # the cluster
    holder: Mapped[str] = mapped_column(String(200))
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class FrontendRow(Base):
    """One frontend (daemon process) of the cluster: when it last beat, when its last agent
    sync read the retiring marks, and its cumulative counts the leader's SLO monitor,
    spill evidence and miss tally read (``mark.control.cluster_feed``)."""

    __tablename__ = "frontends"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    url: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float, index=True)
    synced_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    feed: Mapped[dict[str, Any]] = mapped_column(JSON)
