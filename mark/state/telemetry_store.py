"""Arrival windows and latency roll-ups: written per frontend, read summed over them.

Several daemons ("frontends") may share one database, each counting only the requests
it received. Each writes its own rows, keyed by (model, start, ``source``): a frontend
re-recording a window replaces its own count, never another's. The write is one
INSERT ... ON CONFLICT DO UPDATE, so two processes writing the same new key at once
cannot break the unique key (an integrity error the outbox would drop, not retry).
Reads add the sources' rows up per window and per minute, in SQL, so the planner sees
the cluster's load and not the last writer's share of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from sqlalchemy import Executable, func, select
from sqlalchemy.dialects import postgresql, sqlite

from mark.errors import StoreError
from mark.state.engine import StoreBase
from mark.state.records import ArrivalWindow, LatencyRollup
from mark.state.schema import ArrivalRow, Base, LatencyRollupRow


def _upsert(
    dialect: str, table: type[Base], key: Sequence[str], values: Sequence[str]
) -> Executable:
    """INSERT that, on a row with the same ``key``, sets its ``values`` instead."""
    if dialect == "postgresql":
        pg = postgresql.insert(table)
        return pg.on_conflict_do_update(
            index_elements=list(key), set_={c: pg.excluded[c] for c in values}
        )
    if dialect == "sqlite":
        lite = sqlite.insert(table)
        return lite.on_conflict_do_update(
            index_elements=list(key), set_={c: lite.excluded[c] for c in values}
        )
    raise StoreError(f"no upsert for the {dialect} database")


class TelemetryStore(StoreBase):
    """The arrivals and latency roll-ups of ``SqlStore``."""

    async def add_arrivals(self, windows: Sequence[ArrivalWindow]) -> None:
        """Record closed sample windows; re-recording a window (same source) replaces its count."""
        for w in windows:
            if w.window_s <= 0 or w.count < 0:
                raise StoreError(f"invalid arrival window {w}")
        fixed = tuple(windows)
        await self._write("arrivals", len(fixed), lambda: self._add_arrivals(fixed))

    async def _add_arrivals(self, windows: Sequence[ArrivalWindow]) -> None:
        # The last of one key wins; PostgreSQL refuses one statement touching a row twice.
        rows = {(w.model, w.window_start, w.source): asdict(w) for w in windows}
        await self._upsert(ArrivalRow, ("model", "window_start", "source"), list(rows.values()))

    async def add_latency_rollup(self, r: LatencyRollup) -> None:
        """Record one model-minute; re-recording it (same source) replaces it."""
        await self._write("rollups", 1, lambda: self._add_latency_rollup(r))

    async def _add_latency_rollup(self, r: LatencyRollup) -> None:
        await self._upsert(LatencyRollupRow, ("model", "minute_start", "source"), [asdict(r)])

    async def _upsert(
        self, table: type[Base], key: Sequence[str], rows: list[dict[str, Any]]
    ) -> None:
        if not rows:
            return
        values = [c for c in rows[0] if c not in key]
        stmt = _upsert(self.engine.dialect.name, table, key, values)
        async with self._session.begin() as s:
            await s.execute(stmt, rows)

    async def arrivals(self, model: str, since: float, until: float) -> list[ArrivalWindow]:
        """One window per start in [since, until), its count summed over the frontends
        that counted it (``source`` ""; ``window_s`` the shortest, all alike in practice)."""
        a = ArrivalRow
        q = (
            select(a.window_start, func.min(a.window_s), func.sum(a.count))
            .where(a.model == model, a.window_start >= since, a.window_start < until)
            .group_by(a.window_start)
            .order_by(a.window_start)
        )
        async with self._session() as s:
            rows = (await s.execute(q)).all()
        return [ArrivalWindow(model, float(t), float(ws), int(n)) for t, ws, n in rows]

    async def latency_rollups(self, model: str, since: float, until: float) -> list[LatencyRollup]:
        """One roll-up per minute in [since, until), over every frontend's: the counts
        summed (``http_requests`` None only when no frontend counted them) and each
        quantile the largest of the frontends'. Their quantiles cannot be merged exactly
        without the latencies, but the largest is a valid upper bound, which is what an
        SLO check needs: if each frontend has at least q of its requests at or below its
        own quantile, at least q of all of them are at or below the largest."""
        r = LatencyRollupRow
        q = (
            select(
                r.minute_start,
                func.sum(r.requests),
                func.max(r.p50_ms),
                func.max(r.p95_ms),
                func.max(r.p99_ms),
                func.sum(r.slo_hits),
                func.sum(r.slo_misses),
                func.sum(r.spilled),
                func.sum(r.errors),
                func.sum(r.http_requests),  # SQL's SUM skips nulls, null when all are
            )
            .where(r.model == model, r.minute_start >= since, r.minute_start < until)
            .group_by(r.minute_start)
            .order_by(r.minute_start)
        )
        async with self._session() as s:
            rows = (await s.execute(q)).all()
        return [
            LatencyRollup(
                model,
                float(t),
                int(n),
                float(p50),
                float(p95),
                float(p99),
                int(hits),
                int(misses),
                int(spilled),
                int(errors),
                None if http is None else int(http),
            )
            for t, n, p50, p95, p99, hits, misses, spilled, errors, http in rows
        ]
