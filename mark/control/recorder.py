"""What the control loop writes down: instance states, decisions, plans, the ledger.

Every decision a step takes becomes a row a user can read with ``mark plan
--explain``; every run a step ends (a retirement, a standby's stop) is billed here,
once (per second, with EC2's 60 s minimum); the spend-rail hits and forecast clips are also counted
for ``/metrics``, and so are the volumes of stopped instances (the warm pool, the
standbys), which EBS bills while EC2 bills the instance nothing.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from mark.billing import ec2_charge
from mark.catalog import Catalog, Market
from mark.errors import UnknownOffering
from mark.ports import InstanceInfo, InstanceRole, InstanceState, Store
from mark.state.records import Decision, InstanceRecord, LedgerEntry, PlanRecord
from provisioner.control_state import Note

log = logging.getLogger("mark.control")

WARN_ACTIONS = frozenset({"spend-rail", "forecast-clipped", "fleet-bound"})
"""Decisions that also go to the log as warnings: a user should look at them."""
WARN_REPEAT_S = 600.0
"""A warning of the same model, action and offering as one logged this recently is not
logged again (still recorded and counted): a model held at its bound or rail for hours
would otherwise warn every step. Not keyed by the text: it carries this step's numbers
(the count held back, the forecast clipped), which change from step to step."""
LAUNCHES = frozenset({"launch", "backup", "launch-standby", "explore", "warm-start"})
"""Decisions that brought instances into service: launched (``Reconciler.launch``'s notes,
by role) or started out of the warm pool."""
RETIREMENTS = frozenset(
    {
        "retire",
        "replace-unhealthy",
        "retire-orphan",
        "explore-done",
        "retire-warm",
        "warm-expired",
        "retire-standby",
    }
)
"""Decisions that took an instance out of service: terminated (cool-down over, unhealthy,
orphan, measured), stopped into the warm pool, ended from it, or a stopped standby
beyond its worth ended."""
LAUNCHED = frozenset({"launch", "backup", "launch-standby", "explore"})
"""Launches ``Reconciler.launch`` logs itself, with the ids it got."""
LOGGED_ACTS = (LAUNCHES - LAUNCHED) | RETIREMENTS | {"start-standby", "stop-standby"}
"""The other acts on instances (starts, stops, terminations): logged at INFO with the
decision and its reason, as launches are, so a log says why each instance came or went."""
BILLED_STATES = frozenset({InstanceState.PENDING, InstanceState.RUNNING, InstanceState.READY})
STOPPED_STATES = frozenset({InstanceState.STOPPING, InstanceState.STOPPED})
"""States whose last run has ended (EC2 bills a stopping instance's compute no more)."""
UNBILLED = frozenset({*STOPPED_STATES, InstanceState.TERMINATED})
"""States of a record whose run is over or billed; every other one (``draining``, which
the daemon records for an agent failing its probe, and ``retiring``, the leader's mark
before it ends one, included) is a run still billed."""


def _on(n: Note) -> str:
    """What a decision acted on, for its log line: `` i-0abc (c5.large/spot)``."""
    offering = "/".join(x for x in (n.instance_type, n.market) if x)
    if n.instance_id:
        return f" {n.instance_id}" + (f" ({offering})" if offering else "")
    if offering:
        return f" {n.count}× {offering}"
    return f" {n.count}" if n.count != 1 else ""


@dataclass
class Recorder:
    store: Store
    catalog: Catalog
    volume_per_hour: float = 0.0
    """What a stopped worker's root volume costs an hour (``offerings.volume_gb`` at the
    catalog's gp3 price; ``mark.control.snapshot.volume_per_hour``)."""
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(model, action) → how many, for the actions in ``WARN_ACTIONS``."""
    _billed: set[tuple[str, float]] = field(default_factory=set)
    """Runs already in the ledger: (instance id, its launch or start)."""
    _run_start: dict[str, float] = field(default_factory=dict)
    """When a stopped instance was recorded started again: its run's start where the
    cloud's launch time is older (EC2 moves it to the start; moto and others do not)."""
    _ended: set[str] = field(default_factory=set)
    """Instances recorded as retired."""
    decided: dict[tuple[str, str], int] = field(default_factory=dict)
    """(model, action) → decisions taken, every action."""
    launches: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    retirements: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """(model, reason, type, market) → instances launched / retired."""
    ec2_cost: dict[tuple[str, str], float] = field(default_factory=dict)
    """(model, market) → $ billed for instances ended."""
    _offering: dict[str, tuple[str, str]] = field(default_factory=dict)
    """instance id → (type, market), for a retirement note that names only the instance."""
    _fleet: dict[str, tuple[str, str, str, str, float]] = field(default_factory=dict)
    """Billed instances: id → (model, type, market, role, $/h), from recorded states."""
    seen: dict[str, float] = field(default_factory=dict)
    """Instance id → the last time a step listed it live (``mark.control.vanished``)."""
    _warned: dict[tuple[str, str, str | None, str | None], float] = field(default_factory=dict)
    """(model, action, type, market) → when it was last logged as a warning."""
    _stopped: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    """Instances recorded stopped (or stopping): id → (model, type, since when)."""
    ebs_cost: dict[str, float] = field(default_factory=dict)
    """model → $ of stopped volumes, each stopped period added as it ends (a start or a
    termination), prorated by the second as ``mark.billing.ebs_charge`` does. Periods
    this daemon saw begin; ``mark report`` prices every one from the store's events."""

    def saw(self, instance_ids: Collection[str], now: float) -> None:
        """A step listed these instances live at ``now``."""
        for iid in instance_ids:
            self.seen[iid] = now

    def forget(self, instance_id: str) -> None:
        """An instance has ended outside ``set_state``: no longer seen, nor in the fleet.
        A stopped one's volume is no longer counted; when it went is not known here."""
        self.seen.pop(instance_id, None)
        self._fleet.pop(instance_id, None)
        self._stopped.pop(instance_id, None)

    def _volume_freed(self, instance_id: str, now: float) -> None:
        """A stopped instance started or ended at ``now``: its stopped period's volume."""
        was = self._stopped.pop(instance_id, None)
        if was is None:
            return
        model, _, since = was
        cost = self.volume_per_hour * max(0.0, now - since) / 3600.0
        self.ebs_cost[model] = self.ebs_cost.get(model, 0.0) + cost

    def price(self, instance_type: str, market: str) -> float:
        try:
            return self.catalog.offering(instance_type, market).price_per_hour
        except UnknownOffering:
            return 0.0

    def decisions(self, model: str, now: float, notes: Sequence[Note]) -> list[Decision]:
        """Notes as decision rows; the ones a user must see are logged and counted too,
        and every act on instances (``LOGGED_ACTS``) and every failure is logged with
        its reason."""
        out = []
        for n in notes:
            self._count(model, n)
            if n.action in LOGGED_ACTS:
                log.info("%s: %s%s: %s", model, n.action, _on(n), n.reason)
            elif n.action.endswith("-failed") or n.action == "launch-unavailable":
                log.warning("%s: %s%s: %s", model, n.action, _on(n), n.reason)
            if n.action in WARN_ACTIONS:
                said = (model, n.action, n.instance_type, n.market)
                if now - self._warned.get(said, -math.inf) >= WARN_REPEAT_S:
                    self._warned = {
                        k: t for k, t in self._warned.items() if now - t < WARN_REPEAT_S
                    }
                    self._warned[said] = now
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

    def _count(self, model: str, n: Note) -> None:
        """Every decision for ``/metrics``; launches and retirements by offering."""
        key = (model, n.action)
        self.decided[key] = self.decided.get(key, 0) + 1
        if n.action not in LAUNCHES | RETIREMENTS:
            return
        known = self._offering.get(n.instance_id or "", ("unknown", "unknown"))
        offering = (n.instance_type or known[0], n.market or known[1])
        counts = self.launches if n.action in LAUNCHES else self.retirements
        k = (model, n.action, *offering)
        counts[k] = counts.get(k, 0) + n.count

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
        price = self.price(inst.instance_type, inst.market.value)
        self._offering[inst.instance_id] = (inst.instance_type, inst.market.value)
        if state in BILLED_STATES and inst.state in STOPPED_STATES:
            self._run_start[inst.instance_id] = now
        if state in BILLED_STATES:
            what = (inst.model, inst.instance_type, inst.market.value, inst.role.value, price)
            self._fleet[inst.instance_id] = what
        else:
            self._fleet.pop(inst.instance_id, None)
        if state in STOPPED_STATES:
            self._stopped.setdefault(inst.instance_id, (inst.model, inst.instance_type, now))
        else:
            self._volume_freed(inst.instance_id, now)
        if state is InstanceState.TERMINATED:
            self.seen.pop(inst.instance_id, None)
        await self.store.upsert_instance(
            InstanceRecord(
                inst.instance_id,
                inst.model,
                inst.instance_type,
                inst.market.value,
                inst.role.value,
                state.value,
                price,
                inst.launched_at,
                now,
                inst.address,
            ),
            reason=why,
        )

    async def launched(self, got: Sequence[InstanceInfo], now: float, why: str) -> None:
        for inst in got:
            await self.set_state(inst, inst.state, now, why)

    async def _bill_runs(
        self, model: str, runs: Sequence[InstanceInfo], end: float
    ) -> list[LedgerEntry]:
        """Each instance's current run (from its launch or last start to ``end``) in the
        ledger, once: per second, 60 s minimum."""
        entries = []
        for inst in runs:
            start = max(inst.launched_at, self._run_start.get(inst.instance_id, -math.inf))
            run = (inst.instance_id, start)
            if run in self._billed:
                continue
            self._billed.add(run)
            price = self.price(inst.instance_type, inst.market.value)
            charge = ec2_charge(price, start, end)
            key = (model, inst.market.value)
            self.ec2_cost[key] = self.ec2_cost.get(key, 0.0) + charge.cost
            entries.append(
                LedgerEntry(
                    kind="ec2",
                    model=model,
                    start=start,
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
        if entries:
            await self.store.add_charges(entries)
        return entries

    async def bill_stopped(
        self, model: str, stopped: Sequence[InstanceInfo], end: float, why: str
    ) -> None:
        """Stopped instances (standbys): the run each just ended is billed, and the
        state recorded. A standby runs several times (launched, started at a notice);
        EC2 bills each run and nothing but EBS while it is stopped, so each run is
        billed when it ends, not its last start to its termination."""
        await self._bill_runs(model, [i for i in stopped if i.state in BILLED_STATES], end)
        for inst in stopped:
            await self.set_state(inst, InstanceState.STOPPED, end, why)

    async def bill_retired(
        self, model: str, retired: Sequence[str], fleet: Sequence[InstanceInfo], end: float
    ) -> None:
        """Each retired instance's run in the ledger, once: per second, 60 s minimum. An
        instance retired while stopped ran last until its stop, billed then
        (``bill_stopped``, or by the daemon before a restart)."""
        wanted = set(retired)
        gone = [i for i in fleet if i.instance_id in wanted and i.instance_id not in self._ended]
        await self._bill_runs(model, [i for i in gone if i.state not in STOPPED_STATES], end)
        for inst in gone:
            self._ended.add(inst.instance_id)
            await self.set_state(inst, InstanceState.TERMINATED, end, "retired")

    async def bill_vanished(self, rec: InstanceRecord, last_seen: float) -> LedgerEntry | None:
        """The last run of an instance the store holds as live but the cloud no longer
        lists (found at a restart), unless the ledger has it: the run a daemon that died
        between its terminate call and ``bill_retired`` never billed, or one that ended
        while no daemon ran. Billed from its launch or last start to ``last_seen``, the
        last step the old daemon took (not earlier than the record's own last change):
        a lower estimate, since the run ended at or after it, and none is nearer to hand.
        None when nothing is billed: a stopped instance (its run was billed at its stop)
        or a run already in the ledger."""
        if rec.state in UNBILLED:
            return None
        start = rec.launched_at
        events = await self.store.instance_events(rec.instance_id)
        for before, after in itertools.pairwise(events):
            if before.state in STOPPED_STATES and after.state not in UNBILLED:
                start = max(start, after.at)  # a stopped standby started again: a new run
        near = await self.store.ledger(since=start - 0.5, until=start + 0.5)
        if (rec.instance_id, start) in self._billed or any(
            e.kind == "ec2" and e.instance_id == rec.instance_id for e in near
        ):
            return None
        inst = InstanceInfo(
            rec.instance_id,
            rec.model,
            rec.instance_type,
            Market(rec.market),
            InstanceState.RUNNING,
            InstanceRole(rec.role),
            start,
        )
        billed = await self._bill_runs(rec.model, [inst], max(last_seen, rec.updated_at, start))
        return billed[0] if billed else None

    def prometheus(self) -> str:
        """``/metrics``: every decision; launches and retirements by reason and offering;
        the billed fleet and its $/h; EC2 $ billed; the stopped instances, their volumes'
        $/h and $ billed; spend-rail hits, forecast clips, launches the fleet bound left out."""
        names = {
            "spend-rail": "mark_spend_rail_hits_total",
            "forecast-clipped": "mark_forecast_clips_total",
            "fleet-bound": "mark_fleet_bound_hits_total",
        }
        lines = [
            f'{names[action]}{{model="{model}"}} {n}'
            for (model, action), n in sorted(self.counts.items())
        ]
        lines += [
            f'mark_decisions_total{{model="{m}",action="{a}"}} {n}'
            for (m, a), n in sorted(self.decided.items())
        ]
        for name, counts in (
            ("mark_launches_total", self.launches),
            ("mark_retirements_total", self.retirements),
        ):
            lines += [
                f'{name}{{model="{m}",reason="{r}",type="{t}",market="{k}"}} {n}'
                for (m, r, t, k), n in sorted(counts.items())
            ]
        fleet: dict[tuple[str, str, str, str], int] = {}
        cost: dict[tuple[str, str], float] = {}
        for model, itype, market, role, price in self._fleet.values():
            fleet[model, itype, market, role] = fleet.get((model, itype, market, role), 0) + 1
            cost[model, market] = cost.get((model, market), 0.0) + price
        lines += [
            f'mark_fleet_instances{{model="{m}",type="{t}",market="{k}",role="{r}"}} {n}'
            for (m, t, k, r), n in sorted(fleet.items())
        ]
        lines += [
            f'mark_fleet_cost_per_hour_dollars{{model="{m}",market="{k}"}} {c:.6f}'
            for (m, k), c in sorted(cost.items())
        ]
        lines += [
            f'mark_ec2_cost_dollars_total{{model="{m}",market="{k}"}} {c:.6f}'
            for (m, k), c in sorted(self.ec2_cost.items())
        ]
        stopped: dict[tuple[str, str], int] = {}
        for model, itype, _ in self._stopped.values():
            stopped[model, itype] = stopped.get((model, itype), 0) + 1
        volumes: dict[str, int] = {}
        for (model, _), n in stopped.items():
            volumes[model] = volumes.get(model, 0) + n
        lines += [
            f'mark_stopped_instances{{model="{m}",type="{t}"}} {n}'
            for (m, t), n in sorted(stopped.items())
        ]
        lines += [
            f'mark_stopped_volume_cost_per_hour_dollars{{model="{m}"}} '
            f"{n * self.volume_per_hour:.6f}"
            for m, n in sorted(volumes.items())
        ]
        lines += [
            f'mark_ebs_cost_dollars_total{{model="{m}"}} {c:.6f}'
            for m, c in sorted(self.ebs_cost.items())
        ]
        return "".join(f"{line}\n" for line in lines)
