"""SqlStore: the ``Store`` port on SQLAlchemy 2 async (SQLite by default, PostgreSQL by URL)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import case, delete, event, or_, select, text, update
from sqlalchemy.engine import CursorResult, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    async_sessionmaker,
    create_async_engine,
)

from mark.errors import StoreError
from mark.state import migrate
from mark.state.outbox import Outbox, StoreUnreachable, unreachable
from mark.state.records import (
    ApiKeyRecord,
    ArrivalWindow,
    ControlStateRecord,
    Decision,
    InstanceEvent,
    InstanceRecord,
    LatencyRollup,
    LeaseRecord,
    LedgerEntry,
    PlanRecord,
    ProfileRecord,
)
from mark.state.schema import (
    ApiKeyRow,
    ArrivalRow,
    Base,
    ControlLeaseRow,
    ControlStateRow,
    DecisionRow,
    InstanceEventRow,
    InstanceRow,
    LatencyRollupRow,
    LedgerRow,
    PlanRow,
    ProfileRow,
)

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


CONNECT_TIMEOUT_S = 5.0
STATEMENT_TIMEOUT_S = 10.0


def _sqlite_pragmas(busy_ms: int) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.close()

    return on_connect


def make_engine(
    url: str,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    statement_timeout_s: float = STATEMENT_TIMEOUT_S,
) -> AsyncEngine:
    """An async engine whose every wait is bounded, so a database that does not answer
    stalls no caller for long: for SQLite, the lock wait (busy timeout; the file's folder
    is created, WAL and FKs on); for PostgreSQL, connecting (and waiting for a pooled
    connection) and each statement, on the server (``statement_timeout``) and, a connect
    timeout later, in the driver (``command_timeout``: a server that stopped answering)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": statement_timeout_s})
        event.listen(
            engine.sync_engine, "connect", _sqlite_pragmas(round(statement_timeout_s * 1000))
        )
        return engine
    return create_async_engine(
        url,
        pool_pre_ping=True,
        pool_timeout=connect_timeout_s,
        connect_args={
            "timeout": connect_timeout_s,
            # The server's timeout first (it cancels cleanly), the driver's as a backstop.
            "command_timeout": statement_timeout_s + connect_timeout_s,
            "server_settings": {"statement_timeout": str(round(statement_timeout_s * 1000))},
        },
    )


class SqlStore:
    """Instances, telemetry roll-ups, plans and decisions, the cost ledger, API keys, the
    control state and the leader lease.

    With an ``outbox`` (the daemon's), the bookkeeping writes (instance states,
    arrivals, roll-ups, plans, decisions, charges, profiles) are buffered while the
    database cannot be reached instead of raising (``mark.state.outbox``); reads, API
    keys, the control state and the lease always go to the database.
    """

    def __init__(self, engine: AsyncEngine, outbox: Outbox | None = None) -> None:
        self.engine = engine
        self.outbox = outbox
        self._session = async_sessionmaker(engine, expire_on_commit=False)

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

    async def _write(self, kind: str, rows: int, run: Callable[[], Awaitable[object]]) -> None:
        if self.outbox is None:
            await run()
        else:
            await self.outbox.write(kind, rows, run)

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

    # -- telemetry -------------------------------------------------------

    async def add_arrivals(self, windows: Sequence[ArrivalWindow]) -> None:
        """Record closed sample windows; re-recording a window replaces its count."""
        for w in windows:
            if w.window_s <= 0 or w.count < 0:
                raise StoreError(f"invalid arrival window {w}")
        fixed = tuple(windows)
        await self._write("arrivals", len(fixed), lambda: self._add_arrivals(fixed))

    async def _add_arrivals(self, windows: Sequence[ArrivalWindow]) -> None:
        by_model: dict[str, dict[float, ArrivalWindow]] = {}
        for w in windows:
            by_model.setdefault(w.model, {})[w.window_start] = w
        async with self._session.begin() as s:
            for model, fresh in by_model.items():
                existing = (
                    await s.scalars(
                        select(ArrivalRow).where(
                            ArrivalRow.model == model,
                            ArrivalRow.window_start >= min(fresh),
                            ArrivalRow.window_start <= max(fresh),
                        )
                    )
                ).all()
                for row in existing:
                    if row.window_start in fresh:
                        w = fresh.pop(row.window_start)
                        row.count, row.window_s = w.count, w.window_s
                s.add_all(ArrivalRow(**asdict(w)) for w in fresh.values())

    async def arrivals(self, model: str, since: float, until: float) -> list[ArrivalWindow]:
        q = (
            select(ArrivalRow)
            .where(
                ArrivalRow.model == model,
                ArrivalRow.window_start >= since,
                ArrivalRow.window_start < until,
            )
            .order_by(ArrivalRow.window_start)
        )
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_to_record(r, ArrivalWindow) for r in rows]

    async def add_latency_rollup(self, r: LatencyRollup) -> None:
        await self._write("rollups", 1, lambda: self._add_latency_rollup(r))

    async def _add_latency_rollup(self, r: LatencyRollup) -> None:
        async with self._session.begin() as s:
            existing = await s.scalar(
                select(LatencyRollupRow).where(
                    LatencyRollupRow.model == r.model,
                    LatencyRollupRow.minute_start == r.minute_start,
                )
            )
            if existing is None:
                s.add(LatencyRollupRow(**asdict(r)))
            else:
                for k, v in asdict(r).items():
                    setattr(existing, k, v)

    async def latency_rollups(self, model: str, since: float, until: float) -> list[LatencyRollup]:
        q = (
            select(LatencyRollupRow)
            .where(
                LatencyRollupRow.model == model,
                LatencyRollupRow.minute_start >= since,
                LatencyRollupRow.minute_start < until,
            )
            .order_by(LatencyRollupRow.minute_start)
        )
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_to_record(r, LatencyRollup) for r in rows]

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

    # -- API keys --------------------------------------------------------

    async def add_api_key(self, key: ApiKeyRecord) -> None:
        """Record a new key (its secret's hash, never the secret); an id in use is an error."""
        async with self._session.begin() as s:
            if await s.get(ApiKeyRow, key.id) is not None:
                raise StoreError(f"API key id {key.id!r} is already in use")
            s.add(
                ApiKeyRow(
                    id=key.id,
                    name=key.name,
                    scopes=",".join(key.scopes),
                    hash=key.hash,
                    created_at=key.created_at,
                    revoked_at=key.revoked_at,
                    rate_rps=key.rate_rps,
                    max_concurrency=key.max_concurrency,
                )
            )

    async def api_keys(self, *, active_only: bool = False) -> list[ApiKeyRecord]:
        """Keys, oldest first; with ``active_only``, those not revoked."""
        q = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
        if active_only:
            q = q.where(ApiKeyRow.revoked_at.is_(None))
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str, at: float) -> ApiKeyRecord:
        """Revoke a key from ``at`` on; one revoked already keeps its first revocation time."""
        async with self._session.begin() as s:
            row = await s.get(ApiKeyRow, key_id)
            if row is None:
                raise StoreError(f"unknown API key id {key_id!r}")
            if row.revoked_at is None:
                row.revoked_at = at
            return _api_key(row)

    # -- control state and leader lease ------------------------------------

    async def save_control_state(self, rec: ControlStateRecord) -> None:
        """Keep the control state of ``rec.key`` (one row per cluster, replaced)."""
        async with self._session.begin() as s:
            row = await s.get(ControlStateRow, rec.key)
            if row is None:
                s.add(
                    ControlStateRow(
                        key=rec.key,
                        version=rec.version,
                        state=dict(rec.state),
                        saved_at=rec.saved_at,
                        saved_by=rec.saved_by,
                    )
                )
            else:
                row.version, row.state = rec.version, dict(rec.state)
                row.saved_at, row.saved_by = rec.saved_at, rec.saved_by

    async def control_state(self, key: str) -> ControlStateRecord | None:
        """The control state last saved for ``key``; None if there is none."""
        async with self._session() as s:
            row = await s.get(ControlStateRow, key)
        if row is None:
            return None
        return ControlStateRecord(row.key, row.version, dict(row.state), row.saved_at, row.saved_by)

    async def acquire_lease(self, key: str, holder: str, now: float, ttl_s: float) -> LeaseRecord:
        """Take or renew the lease on ``key`` for ``holder`` until ``now + ttl_s`` if it is
        free, expired or already theirs; returns the lease as it stands (maybe another's).

        One conditional UPDATE, then an INSERT if there was no row: of two controllers
        racing, the database lets exactly one win (the other's UPDATE matches nothing once
        the winner's commit is visible, or its INSERT breaks the primary key).
        """
        until = now + ttl_s
        async with self._session.begin() as s:
            result = await s.execute(
                update(ControlLeaseRow)
                .where(
                    ControlLeaseRow.key == key,
                    or_(ControlLeaseRow.holder == holder, ControlLeaseRow.expires_at <= now),
                )
                .values(
                    acquired_at=case(
                        (ControlLeaseRow.holder == holder, ControlLeaseRow.acquired_at),
                        else_=now,
                    ),
                    holder=holder,
                    expires_at=until,
                )
            )
            taken = isinstance(result, CursorResult) and result.rowcount > 0
        if not taken:
            try:
                async with self._session.begin() as s:
                    s.add(
                        ControlLeaseRow(key=key, holder=holder, acquired_at=now, expires_at=until)
                    )
            except IntegrityError:
                pass  # another controller holds it (or just took it)
        async with self._session() as s:
            row = await s.get(ControlLeaseRow, key)
        if row is None:  # released between the two statements: nobody holds it
            return LeaseRecord(key, "", now, now)
        return LeaseRecord(row.key, row.holder, row.acquired_at, row.expires_at)

    async def release_lease(self, key: str, holder: str) -> None:
        """Give the lease up at once (a clean stop), if ``holder`` holds it."""
        async with self._session.begin() as s:
            await s.execute(
                delete(ControlLeaseRow).where(
                    ControlLeaseRow.key == key, ControlLeaseRow.holder == holder
                )
            )


def _api_key(r: ApiKeyRow) -> ApiKeyRecord:
    return ApiKeyRecord(
        r.id,
        r.name,
        tuple(x for x in r.scopes.split(",") if x),
        r.hash,
        r.created_at,
        r.revoked_at,
        r.rate_rps,
        r.max_concurrency,
    )


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
