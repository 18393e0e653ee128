"""The state store: instances, telemetry roll-ups, plans and decisions, the cost ledger,
API keys, the control state and the leader lease, the cluster's frontends."""

from mark.state.outbox import Outbox, StoreUnreachable
from mark.state.records import (
    ApiKeyRecord,
    ArrivalWindow,
    ControlStateRecord,
    Decision,
    FrontendRecord,
    InstanceEvent,
    InstanceRecord,
    LatencyRollup,
    LeaseRecord,
    LedgerEntry,
    PlanRecord,
    ProfileRecord,
)
from mark.state.store import SqlStore, open_store

__all__ = [
    "ApiKeyRecord",
    "ArrivalWindow",
    "ControlStateRecord",
    "Decision",
    "FrontendRecord",
    "InstanceEvent",
    "InstanceRecord",
    "LatencyRollup",
    "LeaseRecord",
    "LedgerEntry",
    "Outbox",
    "PlanRecord",
    "ProfileRecord",
    "SqlStore",
    "StoreUnreachable",
    "open_store",
]
