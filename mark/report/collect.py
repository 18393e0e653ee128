"""Read what a report needs from the store: the thin effectful edge of ``mark report``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mark.ports import Store
from mark.report.aggregate import Charge, collect_charges
from mark.state.records import ArrivalWindow, InstanceEvent, InstanceRecord, LedgerEntry


@dataclass(frozen=True)
class StoreData:
    ledger: list[LedgerEntry]
    instances: list[InstanceRecord]
    events: dict[str, list[InstanceEvent]]
    arrivals: dict[str, list[ArrivalWindow]] = field(default_factory=dict)

    def charges(
        self, since: float | None, until: float, volume_gb: float = 0.0, gb_month: float = 0.0
    ) -> list[Charge]:
        return collect_charges(
            self.ledger,
            self.instances,
            self.events,
            since=since,
            until=until,
            volume_gb=volume_gb,
            gb_month=gb_month,
        )


async def read_store(
    store: Store,
    *,
    since: float | None,
    until: float,
    model: str | None = None,
    arrival_models: Sequence[str] = (),
) -> StoreData:
    """Charges starting in [since, until), every instance (of ``model``) with its
    transitions, and the arrival windows of ``arrival_models`` in the period."""
    ledger = await store.ledger(since, until, model)
    instances = await store.instances(model=model)
    events = {i.instance_id: await store.instance_events(i.instance_id) for i in instances}
    lo = 0.0 if since is None else since
    arrivals = {m: await store.arrivals(m, lo, until) for m in arrival_models}
    return StoreData(ledger, instances, events, arrivals)
