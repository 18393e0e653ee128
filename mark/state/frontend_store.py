"""The cluster's frontends: each daemon process beats its row every second or two, and
the rows of the live ones are what ``mark status`` lists, what per-key limits are shared
by, and what the leader's SLO monitor reads the other frontends' outcomes from.

Never through the outbox: a beat is current or worthless, so one the database does not
take is dropped, and the next one replaces it.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from mark.state.engine import StoreBase
from mark.state.records import FrontendRecord
from mark.state.schema import FrontendRow

BEAT_S = 2.0
"""How often a frontend writes its row: the SLO monitor's round."""
LIVE_S = 3 * BEAT_S
"""A frontend whose last beat is older than this is not live (three beats missed)."""
FORGET_AFTER_S = 86_400.0
"""A frontend not seen for this long is forgotten (its row deleted) at another's beat."""


class FrontendStore(StoreBase):
    """The frontends of ``SqlStore``."""

    async def beat(self, rec: FrontendRecord) -> None:
        """Write this frontend's row (one per id, replaced), and forget the long gone."""
        async with self._session.begin() as s:
            row = await s.get(FrontendRow, rec.id)
            feed = {m: dict(v) for m, v in rec.feed.items()}
            if row is None:
                s.add(
                    FrontendRow(
                        id=rec.id,
                        url=rec.url,
                        started_at=rec.started_at,
                        last_seen=rec.last_seen,
                        synced_at=rec.synced_at,
                        feed=feed,
                    )
                )
            else:
                row.url, row.last_seen, row.synced_at, row.feed = (
                    rec.url,
                    rec.last_seen,
                    rec.synced_at,
                    feed,
                )
            await s.execute(
                delete(FrontendRow).where(FrontendRow.last_seen < rec.last_seen - FORGET_AFTER_S)
            )

    async def frontends(self, since: float) -> list[FrontendRecord]:
        """The frontends that beat at or after ``since``, oldest first."""
        q = (
            select(FrontendRow)
            .where(FrontendRow.last_seen >= since)
            .order_by(FrontendRow.started_at, FrontendRow.id)
        )
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [
            FrontendRecord(r.id, r.url, r.started_at, r.last_seen, r.synced_at, dict(r.feed))
            for r in rows
        ]
