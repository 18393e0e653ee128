"""The store's database engine, every wait bounded, and the base its parts share.

``SqlStore`` (``mark.state.store``) is assembled from one class per role (telemetry,
API keys, the control state and lease); each stands on ``StoreBase``: the engine, its
sessions and the outbox's write path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from mark.state.outbox import Outbox

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


class StoreBase:
    """The engine, its sessions and the outbox: what every part of ``SqlStore`` uses."""

    def __init__(self, engine: AsyncEngine, outbox: Outbox | None = None) -> None:
        self.engine = engine
        self.outbox = outbox
        self._session = async_sessionmaker(engine, expire_on_commit=False)

    async def _write(self, kind: str, rows: int, run: Callable[[], Awaitable[object]]) -> None:
        """A bookkeeping write: through the outbox when there is one (buffered while the
        database cannot be reached), else at once."""
        if self.outbox is None:
            await run()
        else:
            await self.outbox.write(kind, rows, run)
