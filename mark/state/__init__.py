"""The state store: instances, telemetry roll-ups, plans and decisions, the cost ledger."""

from mark.state.records import (
    ArrivalWindow,
    Decision,
    InstanceEvent,
    InstanceRecord,
    LatencyRollup,
    LedgerEntry,
    PlanRecord,
)
from mark.state.store import SqlStore, open_store

__all__ = [
    "ArrivalWindow",
    "Decision",
    "InstanceEvent",
    "InstanceRecord",
    "LatencyRollup",
    "LedgerEntry",
    "PlanRecord",
    "SqlStore",
    "open_store",
]
