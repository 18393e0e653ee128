"""SqlStore: the ``Store`` port on SQLAlchemy 2 async (SQLite by default, PostgreSQL by URL)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from mark.errors import StoreError
from mark.state import migrate
from mark.state.api_key_store import ApiKeyStore
from mark.state.control_store import ControlStore
from mark.state.engine import CONNECT_TIMEOUT_S, STATEMENT_TIMEOUT_S, make_engine
from mark.state.frontend_store import FrontendStore
from mark.state.outbox import Outbox, StoreUnreachable, unreachable
from mark.state.records import (
    Decision,
    InstanceEvent,
    InstanceRecord,
    LedgerEntry,
    PlanRecord,
    ProfileRecord,
)
from mark.state.schema import (
    Base,
    DecisionRow,
    InstanceEventRow,
    InstanceRow,
    LedgerRow,
    PlanRow,
    ProfileRow,
)
from mark.state.telemetry_store import TelemetryStore

__all__ = ["CONNECT_TIMEOUT_S", "STATEMENT_TIMEOUT_S", "SqlStore", "make_engine", "open_store"]

R = TypeVar("R")


def _not_before(at: float, last: float | None) -> float:
    """An instance's transitions are stamped by whoever saw them (a control step's clock,
    the agent prober's), and a write can land after one stamped later: a transition
    recorded after another is stamped no earlier, so its events read in the order they
    happened (a stop written after an agent's "ready" does not reopen the run)."""
    return at if last is None else max(at, last)


def _to_record(row: Base, cls: type[R], drop: Iterable[str] = ("id",)) -> R:
    fields = {c.key: getattr(row, c.key) for c in row.__table__.columns if c.key not in drop}
    return cls(**fields)


class SqlStore(TelemetryStore, ApiKeyStore, ControlStore, FrontendStore):
    """Instances, telemetry roll-ups, plans and decisions, the cost ledger, API keys, the
    control state and the leader lease, the frontends. Here: instances, plans and
    decisions, profiles and the ledger; the rest by role in ``telemetry_store``,
    ``api_key_store``, ``control_store`` and ``frontend_store``, on the engine and
    sessions of ``engine.StoreBase``.

    With an ``outbox`` (the daemon's), the bookkeeping writes (instance states,
    arrivals, roll-ups, plans, decisions, charges, profiles) are buffered while the
    database cannot be reached instead of raising (``mark.state.outbox``); reads, API
    keys, the control state and the lease always go to the database.
    """

    async def close(self) -> None:
        await self.engine.dispose()

    async def ping(self) -> None:
        """Raise ``StoreUnreachable`` unless the database answers now; once it does, what
        the outbox holds is written first (so a caller that acts next writes after it)."""
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:
            if not unreachable(exc):
                raise
            raise StoreUnreachable(f"cannot reach the database: {_one_line(exc)}") from None
        if self.outbox is not None:
            await self.outbox.retry()

    async def retry_pending(self) -> int:
        """Write what the outbox holds, if the store answers; the rows written."""
        return await self.outbox.retry() if self.outbox is not None else 0

    async def check_schema(self) -> None:
        """Fail with a clear message when the database is not at the code's migration head."""
        try:
            current = await migrate.current_revision(self.engine)
        except (OperationalError, DBAPIError, OSError, TimeoutError) as exc:
            raise StoreUnreachable(f"cannot reach the database: {_one_line(exc)}") from None
        head = migrate.head_revision()
        if current != head:
            raise StoreError(
                f"database schema is at {current or 'empty'}, code expects {head}; "
                "run `mark db upgrade`"
            )

    async def prepare(self, *, upgrade: bool = False) -> None:
        """Migrate the database first when ``upgrade``, then check it is at the code's head;
        ``StoreUnreachable`` when it does not answer."""
        if upgrade:
            try:
                await migrate.upgrade(self.engine)
            except (OperationalError, DBAPIError, OSError, TimeoutError) as exc:
                kind = StoreUnreachable if unreachable(exc) else StoreError
                raise kind(f"cannot migrate the database: {_one_line(exc)}") from None
        await self.check_schema()

    # -- instances -------------------------------------------------------

    async def upsert_instance(self, rec: InstanceRecord, reason: str | None = None) -> None:
        """Insert or update an instance; a changed state is logged as a transition."""
        await self._write("instances", 1, lambda: self._upsert_instance(rec, reason))

    async def _upsert_instance(self, rec: InstanceRecord, reason: str | None) -> None:
        async with self._session.begin() as s:
            row = await s.get(InstanceRow, rec.instance_id)
            if row is None:
                s.add(InstanceRow(**asdict(rec)))
                await s.flush()  # the event's foreign key needs the row first
                s.add(self._event(rec.instance_id, rec.state, rec.updated_at, reason))
                return
            changed = row.state != rec.state
            at = _not_before(rec.updated_at, row.updated_at)
            for k, v in asdict(rec).items():
                setattr(row, k, v)
            row.updated_at = at
            if changed:
                s.add(self._event(rec.instance_id, rec.state, at, reason))

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
        """Record a state transition; with ``only_from``, only from one of those states
        (checked in the same transaction, so a concurrent stop or terminate wins)."""
        await self._write(
            "instances",
            1,
            lambda: self._set_instance_state(instance_id, state, at, address, reason, only_from),
        )

    async def _set_instance_state(
        self,
        instance_id: str,
        state: str,
        at: float,
        address: str | None,
        reason: str | None,
        only_from: Collection[str] | None,
    ) -> None:
        async with self._session.begin() as s:
            row = await s.get(InstanceRow, instance_id)
            if row is None:
                raise StoreError(f"unknown instance {instance_id!r}")
            if only_from is not None and row.state not in only_from:
                return
            if address is not None:
                row.address = address
            at = _not_before(at, row.updated_at)
            row.updated_at = at
            if row.state != state:
                row.state = state
                s.add(self._event(instance_id, state, at, reason))

    @staticmethod
    def _event(instance_id: str, state: str, at: float, reason: str | None) -> InstanceEventRow:
        return InstanceEventRow(instance_id=instance_id, state=state, at=at, reason=reason)

    async def instances(
        self, *, model: str | None = None, states: Sequence[str] | None = None
    ) -> list[InstanceRecord]:
        q = select(InstanceRow).order_by(InstanceRow.launched_at, InstanceRow.instance_id)
        if model is not None:
            q = q.where(InstanceRow.model == model)
        if states is not None:
            q = q.where(InstanceRow.state.in_(list(states)))
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_to_record(r, InstanceRecord, drop=()) for r in rows]

    async def instance_events(self, instance_id: str) -> list[InstanceEvent]:
        q = (
            select(InstanceEventRow)
            .where(InstanceEventRow.instance_id == instance_id)
            .order_by(InstanceEventRow.at, InstanceEventRow.id)
        )
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_to_record(r, InstanceEvent) for r in rows]

    # -- plans and decisions ---------------------------------------------

    async def record_plan(self, plan: PlanRecord) -> int:
        """Store a plan with its decisions; returns the plan's id (0 when it was buffered:
        ids start at 1)."""
        ids: list[int] = []

        async def run() -> None:
            ids.append(await self._record_plan(plan))

        await self._write("plans", 1 + len(plan.decisions), run)
        return ids[0] if ids else 0

    async def _record_plan(self, plan: PlanRecord) -> int:
        async with self._session.begin() as s:
            row = PlanRow(
                model=plan.model,
                at=plan.at,
                planner=plan.planner,
                forecast=[float(x) for x in plan.forecast],
                horizon_cost=plan.horizon_cost,
                explanation=dict(plan.explanation),
            )
            s.add(row)
            await s.flush()
            for d in plan.decisions:
                s.add(DecisionRow(plan_id=row.id, **asdict(d)))
            return row.id

    async def record_decision(self, d: Decision) -> None:
        """A decision taken outside a plan (SLO-monitor backup, standby start)."""
        await self._write("decisions", 1, lambda: self._record_decision(d))

    async def _record_decision(self, d: Decision) -> None:
        async with self._session.begin() as s:
            s.add(DecisionRow(plan_id=None, **asdict(d)))

    async def plans(self, model: str, limit: int = 10) -> list[PlanRecord]:
        """The newest ``limit`` plans, newest first, each with its decisions."""
        async with self._session() as s:
            rows = (
                await s.scalars(
                    select(PlanRow)
                    .where(PlanRow.model == model)
                    .order_by(PlanRow.at.desc(), PlanRow.id.desc())
                    .limit(limit)
                )
            ).all()
            out = []
            for r in rows:
                ds = (
                    await s.scalars(
                        select(DecisionRow)
                        .where(DecisionRow.plan_id == r.id)
                        .order_by(DecisionRow.id)
                    )
                ).all()
                out.append(
                    PlanRecord(
                        id=r.id,
                        model=r.model,
                        at=r.at,
                        planner=r.planner,
                        forecast=list(r.forecast),
                        horizon_cost=r.horizon_cost,
                        explanation=dict(r.explanation),
                        decisions=[_to_record(d, Decision, drop=("id", "plan_id")) for d in ds],
                    )
                )
        return out

    async def decisions(self, since: float, until: float) -> list[Decision]:
        q = (
            select(DecisionRow)
            .where(DecisionRow.at >= since, DecisionRow.at < until)
            .order_by(DecisionRow.at, DecisionRow.id)
        )
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_to_record(r, Decision, drop=("id", "plan_id")) for r in rows]

    # -- profiles --------------------------------------------------------

    async def put_profile(self, p: ProfileRecord) -> None:
        """Record a model's T_b on an instance type; a newer one of the same source replaces it."""
        await self._write("profiles", 1, lambda: self._put_profile(p))

    async def _put_profile(self, p: ProfileRecord) -> None:
        async with self._session.begin() as s:
            row = await s.scalar(
                select(ProfileRow).where(
                    ProfileRow.model == p.model,
                    ProfileRow.instance_type == p.instance_type,
                    ProfileRow.source == p.source,
                )
            )
            points = [[b, t] for b, t in p.batch_latency_s]
            if row is None:
                s.add(
                    ProfileRow(
                        model=p.model,
                        instance_type=p.instance_type,
                        source=p.source,
                        batch_latency_s=points,
                        measured_at=p.measured_at,
                        device=p.device,
                    )
                )
            else:
                row.batch_latency_s, row.measured_at, row.device = points, p.measured_at, p.device

    async def profiles(self, model: str) -> list[ProfileRecord]:
        async with self._session() as s:
            rows = (
                await s.scalars(
                    select(ProfileRow)
                    .where(ProfileRow.model == model)
                    .order_by(ProfileRow.instance_type, ProfileRow.source)
                )
            ).all()
        return [
            ProfileRecord(
                r.model,
                r.instance_type,
                r.source,
                tuple((int(b), float(t)) for b, t in r.batch_latency_s),
                r.measured_at,
                r.device,
            )
            for r in rows
        ]

    # -- ledger ----------------------------------------------------------

    async def add_charges(self, entries: Sequence[LedgerEntry]) -> None:
        fixed = tuple(entries)
        await self._write("charges", len(fixed), lambda: self._add_charges(fixed))

    async def _add_charges(self, entries: Sequence[LedgerEntry]) -> None:
        async with self._session.begin() as s:
            s.add_all(LedgerRow(**asdict(e)) for e in entries)

    async def ledger(
        self, since: float | None = None, until: float | None = None, model: str | None = None
    ) -> list[LedgerEntry]:
        """Charges whose start falls in [since, until)."""
        q = select(LedgerRow).order_by(LedgerRow.start, LedgerRow.id)
        if since is not None:
            q = q.where(LedgerRow.start >= since)
        if until is not None:
            q = q.where(LedgerRow.start < until)
        if model is not None:
            q = q.where(LedgerRow.model == model)
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_to_record(r, LedgerEntry) for r in rows]


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


async def open_store(
    url: str,
    *,
    upgrade: bool = False,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    statement_timeout_s: float = STATEMENT_TIMEOUT_S,
    outbox: Outbox | None = None,
) -> SqlStore:
    """Open the store at ``url``; migrate it first when ``upgrade``, else check it is migrated."""
    engine = make_engine(
        url, connect_timeout_s=connect_timeout_s, statement_timeout_s=statement_timeout_s
    )
    store = SqlStore(engine, outbox)
    try:
        await store.prepare(upgrade=upgrade)
    except BaseException:
        await engine.dispose()
        raise
    return store


if TYPE_CHECKING:  # mypy proves SqlStore provides the Store port
    from mark.ports import Store

    _store_port: type[Store] = SqlStore
