"""The ``Store`` port in memory, for the simulator.

A simulated day writes ~17 000 arrival windows, 1 440 plans and their
decisions; through SQLite that costs more time than the whole request-level
simulation. This store keeps the same records with the same semantics as
``SqlStore`` (windows replace by key, plans newest first, ledger by start time)
in plain lists, so the controller runs unchanged. A test runs the same
scenario through both stores and compares what they return.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from dataclasses import replace

from mark.errors import StoreError
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


class MemoryStore:
    def __init__(self) -> None:
        self._instances: dict[str, InstanceRecord] = {}
        self._events: dict[str, list[InstanceEvent]] = {}
        self._arrivals: dict[str, dict[float, ArrivalWindow]] = {}
        self._arrival_keys: dict[str, list[float]] = {}
        self._rollups: dict[tuple[str, float], LatencyRollup] = {}
        self._plans: list[PlanRecord] = []
        self._decisions: list[Decision] = []
        self._ledger: list[LedgerEntry] = []
        self._profiles: dict[tuple[str, str, str], ProfileRecord] = {}
        self._api_keys: dict[str, ApiKeyRecord] = {}

    async def close(self) -> None:
        return None

    # -- instances -------------------------------------------------------

    async def upsert_instance(self, rec: InstanceRecord, reason: str | None = None) -> None:
        old = self._instances.get(rec.instance_id)
        if old is not None:  # as SqlStore: an instance's transitions never go back in time
            rec = replace(rec, updated_at=max(rec.updated_at, old.updated_at))
        self._instances[rec.instance_id] = rec
        if old is None or old.state != rec.state:
            self._events.setdefault(rec.instance_id, []).append(
                InstanceEvent(rec.instance_id, rec.state, rec.updated_at, reason)
            )

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
        old = self._instances.get(instance_id)
        if old is None:
            raise StoreError(f"unknown instance {instance_id!r}")
        if only_from is not None and old.state not in only_from:
            return
        at = max(at, old.updated_at)
        self._instances[instance_id] = replace(
            old, state=state, updated_at=at, address=address if address is not None else old.address
        )
        if old.state != state:
            self._events.setdefault(instance_id, []).append(
                InstanceEvent(instance_id, state, at, reason)
            )

    async def instances(
        self, *, model: str | None = None, states: Sequence[str] | None = None
    ) -> list[InstanceRecord]:
        out = [
            r
            for r in self._instances.values()
            if (model is None or r.model == model) and (states is None or r.state in states)
        ]
        return sorted(out, key=lambda r: (r.launched_at, r.instance_id))

    async def instance_events(self, instance_id: str) -> list[InstanceEvent]:
        return sorted(self._events.get(instance_id, []), key=lambda e: e.at)

    # -- telemetry -------------------------------------------------------

    async def add_arrivals(self, windows: Sequence[ArrivalWindow]) -> None:
        for w in windows:
            by_start = self._arrivals.setdefault(w.model, {})
            if w.window_start not in by_start:
                bisect.insort(self._arrival_keys.setdefault(w.model, []), w.window_start)
            by_start[w.window_start] = w

    async def arrivals(self, model: str, since: float, until: float) -> list[ArrivalWindow]:
        keys = self._arrival_keys.get(model, [])
        by_start = self._arrivals.get(model, {})
        lo = bisect.bisect_left(keys, since)
        hi = bisect.bisect_left(keys, until)
        return [by_start[k] for k in keys[lo:hi]]

    async def add_latency_rollup(self, r: LatencyRollup) -> None:
        self._rollups[(r.model, r.minute_start)] = r

    async def latency_rollups(self, model: str, since: float, until: float) -> list[LatencyRollup]:
        return sorted(
            (r for (m, t), r in self._rollups.items() if m == model and since <= t < until),
            key=lambda r: r.minute_start,
        )

    # -- plans and decisions ----------------------------------------------

    async def record_plan(self, plan: PlanRecord) -> int:
        pid = len(self._plans) + 1
        self._plans.append(replace(plan, id=pid, decisions=list(plan.decisions)))
        self._decisions.extend(plan.decisions)
        return pid

    async def record_decision(self, d: Decision) -> None:
        self._decisions.append(d)

    async def plans(self, model: str, limit: int = 10) -> list[PlanRecord]:
        mine = [p for p in self._plans if p.model == model]
        mine.sort(key=lambda p: (p.at, p.id or 0), reverse=True)
        return mine[:limit]

    async def decisions(self, since: float, until: float) -> list[Decision]:
        return sorted((d for d in self._decisions if since <= d.at < until), key=lambda d: d.at)

    # -- ledger ----------------------------------------------------------

    async def add_charges(self, entries: Sequence[LedgerEntry]) -> None:
        self._ledger.extend(entries)

    async def ledger(
        self, since: float | None = None, until: float | None = None, model: str | None = None
    ) -> list[LedgerEntry]:
        return sorted(
            (
                e
                for e in self._ledger
                if (since is None or e.start >= since)
                and (until is None or e.start < until)
                and (model is None or e.model == model)
            ),
            key=lambda e: e.start,
        )

    # -- profiles ----------------------------------------------------------

    async def put_profile(self, p: ProfileRecord) -> None:
        self._profiles[(p.model, p.instance_type, p.source)] = p

    async def profiles(self, model: str) -> list[ProfileRecord]:
        return [p for k, p in sorted(self._profiles.items()) if k[0] == model]

    # -- API keys (the simulator serves no API; here to satisfy the port) ------

    async def add_api_key(self, key: ApiKeyRecord) -> None:
        if key.id in self._api_keys:
            raise StoreError(f"API key id {key.id!r} is already in use")
        self._api_keys[key.id] = key

    async def api_keys(self, *, active_only: bool = False) -> list[ApiKeyRecord]:
        keys = sorted(self._api_keys.values(), key=lambda k: (k.created_at, k.id))
        return [k for k in keys if k.active or not active_only]

    async def revoke_api_key(self, key_id: str, at: float) -> ApiKeyRecord:
        key = self._api_keys.get(key_id)
        if key is None:
            raise StoreError(f"unknown API key id {key_id!r}")
        if key.revoked_at is None:
            key = self._api_keys[key_id] = replace(key, revoked_at=at)
        return key
