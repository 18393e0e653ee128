"""The control state a restarted controller resumes from, and the leader lease that lets
one controller of a cluster act at a time.

Never through the outbox: a controller must know at once whether it holds the lease
and whether its state was kept.
"""

from __future__ import annotations

from sqlalchemy import case, delete, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError

from mark.state.engine import StoreBase
from mark.state.records import ControlStateRecord, LeaseRecord
from mark.state.schema import ControlLeaseRow, ControlStateRow


class ControlStore(StoreBase):
    """The control state and the leader lease of ``SqlStore``."""

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

    async def leases(self) -> list[LeaseRecord]:
        """Every cluster's lease as it stands (held or lapsed): who leads, for ``mark status``."""
        async with self._session() as s:
            rows = (await s.scalars(select(ControlLeaseRow).order_by(ControlLeaseRow.key))).all()
        return [LeaseRecord(r.key, r.holder, r.acquired_at, r.expires_at) for r in rows]

    async def release_lease(self, key: str, holder: str) -> None:
        """Give the lease up at once (a clean stop), if ``holder`` holds it."""
        async with self._session.begin() as s:
            await s.execute(
                delete(ControlLeaseRow).where(
                    ControlLeaseRow.key == key, ControlLeaseRow.holder == holder
                )
            )
