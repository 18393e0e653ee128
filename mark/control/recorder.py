"""What the control loop writes down: instance states, decisions, plans, the ledger.

Every decision a step takes becomes a row a user can read with ``mark plan
--explain``; every instance a step ends is billed here, once (per second, with
EC2's 60 s minimum); the spend-rail hits and forecast clips are also counted
for ``/metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from mark.billing import ec2_charge
from mark.catalog import Catalog
from mark.errors import UnknownOffering
from mark.ports import InstanceInfo, InstanceState, Store
from mark.state.records import Decision, InstanceRecord, LedgerEntry, PlanRecord
from provisioner.control_state import Note

log = logging.getLogger("mark.control")

WARN_ACTIONS = frozenset({"spend-rail", "forecast-clipped"})
"""Decisions that also go to the log as warnings: a user should look at them."""


@dataclass
class Recorder:
    store: Store
    catalog: Catalog
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(model, action) → how many, for the actions in ``WARN_ACTIONS``."""
    _billed: set[str] = field(default_factory=set)

    def price(self, instance_type: str, market: str) -> float:
        try:
            return self.catalog.offering(instance_type, market).price_per_hour
        except UnknownOffering:
            return 0.0

    def decisions(self, model: str, now: float, notes: Sequence[Note]) -> list[Decision]:
        """Notes as decision rows; the ones a user must see are logged and counted too."""
        out = []
        for n in notes:
            if n.action in WARN_ACTIONS:
                log.warning("%s: %s", model, n.reason)
                key = (model, n.action)
                self.counts[key] = self.counts.get(key, 0) + 1
            out.append(
                Decision(
                    model,
                    now,
                    n.action,
                    n.reason,
                    n.instance_type,
                    n.market,
                    n.count,
                    n.instance_id,
                )
            )
        return out

    async def record(self, model: str, now: float, notes: Sequence[Note]) -> None:
        """Notes outside a plan (backups, spot notices) go straight to the store."""
        for d in self.decisions(model, now, notes):
            await self.store.record_decision(d)

    async def plan(self, record: PlanRecord) -> int:
        return await self.store.record_plan(record)

    async def set_state(
        self, inst: InstanceInfo, state: InstanceState, now: float, why: str
    ) -> None:
        """Record an instance's state (inserting it if the store has not seen it: an
        instance adopted from the cloud, or launched by hand)."""
        await self.store.upsert_instance(
            InstanceRecord(
                inst.instance_id,
                inst.model,
                inst.instance_type,
                inst.market.value,
                inst.role.value,
                state.value,
                self.price(inst.instance_type, inst.market.value),
                inst.launched_at,
                now,
                inst.address,
            ),
            reason=why,
        )

    async def launched(self, got: Sequence[InstanceInfo], now: float, why: str) -> None:
        for inst in got:
            await self.set_state(inst, inst.state, now, why)

    async def bill_retired(
        self, model: str, retired: Sequence[str], fleet: Sequence[InstanceInfo], end: float
    ) -> None:
        """Each retired instance's run in the ledger, once: per second, 60 s minimum."""
        gone = set(retired)
        entries = []
        for inst in fleet:
            if inst.instance_id not in gone or inst.instance_id in self._billed:
                continue
            self._billed.add(inst.instance_id)
            price = self.price(inst.instance_type, inst.market.value)
            charge = ec2_charge(price, inst.launched_at, end)
            entries.append(
                LedgerEntry(
                    kind="ec2",
                    model=model,
                    start=inst.launched_at,
                    end=end,
                    component=inst.market.value,
                    unit_price=price,
                    cost=charge.cost,
                    instance_id=inst.instance_id,
                    instance_type=inst.instance_type,
                    seconds=charge.seconds,
                    billed_seconds=charge.billed_seconds,
                )
            )
            await self.set_state(inst, InstanceState.TERMINATED, end, "retired")
        if entries:
            await self.store.add_charges(entries)

    def prometheus(self) -> str:
        """Counters for ``/metrics``: spend-rail hits and forecast clips, per model."""
        names = {
            "spend-rail": "mark_spend_rail_hits_total",
            "forecast-clipped": "mark_forecast_clips_total",
        }
        return "".join(
            f'{names[action]}{{model="{model}"}} {n}\n'
            for (model, action), n in sorted(self.counts.items())
        )
