"""The state store: instances, telemetry roll-ups, plans and decisions, the cost ledger,
API keys."""

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
from mark.state.store import SqlStore, open_store

__all__ = [
    "ApiKeyRecord",
    "ArrivalWindow",
    "Decision",
    "InstanceEvent",
    "InstanceRecord",
    "LatencyRollup",
    "LedgerEntry",
    "PlanRecord",
    "ProfileRecord",
    "SqlStore",
    "open_store",
]
