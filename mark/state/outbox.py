"""A bounded write-behind buffer: bookkeeping the store could not take, kept and written
later, in order, when it answers again.

The daemon's bookkeeping writes (telemetry windows and roll-ups, decisions and plans,
instance states, the ledger, measured profiles) go through ``Outbox.write``. While the
database answers, a write is made at once, as before. When it cannot be reached (a
connection refused or lost, a connect or statement timeout), the write is kept here
instead of raising, so the caller (the telemetry flush, the control loop's recorder)
goes on and nothing of that round is lost; later writes queue behind it, so the store
receives them in the order they were made. The queue is retried at most every
``retry_s`` (a write while it is not yet time only queues) and drained in order once
the store answers.

Bounded by rows (``max_rows``): past it the oldest writes are dropped, counted per kind
and logged, so an outage longer than the buffer costs the oldest bookkeeping and never
the daemon's memory. A write the store refuses for another reason (an integrity error,
an unknown instance) would never succeed: when retried it is dropped, counted as
rejected and logged. What is buffered at a stop and still cannot be written is lost;
``stop`` says how much.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from mark.errors import StoreError

log = logging.getLogger("mark.state")

DEFAULT_MAX_ROWS = 10_000
"""About 14 h of one model's 5 s windows and minute roll-ups, or many hours of decisions."""
DEFAULT_RETRY_S = 2.0
UNREACHABLE_SQLSTATES = ("08", "57014", "57P")
"""PostgreSQL's codes for a lost connection (class 08), a statement cut by
``statement_timeout`` (57014), a server shutting down or starting up (57P01-57P05)."""


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached now (worth retrying later),
    rather than that it refused this write."""
    if isinstance(exc, StoreError):
        return isinstance(exc, StoreUnreachable)
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout, OSError, TimeoutError)):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    state = str(getattr(exc.orig, "sqlstate", None) or "")
    return exc.connection_invalidated or state.startswith(UNREACHABLE_SQLSTATES)


class StoreUnreachable(StoreError):
    """The database did not answer (refused, lost, timed out)."""


@dataclass
class _Write:
    kind: str
    rows: int
    run: Callable[[], Awaitable[object]]


class Outbox:
    """Writes the store could not take, oldest first, bounded by rows."""

    def __init__(
        self,
        max_rows: int = DEFAULT_MAX_ROWS,
        retry_s: float = DEFAULT_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_rows = max_rows
        self.retry_s = retry_s
        self._clock = clock
        self._pending: deque[_Write] = deque()
        self._lock = asyncio.Lock()
        self.buffered_rows = 0
        self.available = True
        """Whether the last write (or retry) reached the store."""
        self.outages = 0
        self.dropped: Counter[str] = Counter()
        """Rows dropped per kind because the buffer was full."""
        self.rejected: Counter[str] = Counter()
        """Rows dropped per kind because the store refused them when retried."""
        self._next_try = 0.0
        self.held = False
        """Keep every write, try none (a store not yet checked to be migrated)."""

    def hold(self) -> None:
        """Keep every write and try none until ``release`` (counted as an outage)."""
        self.outages += self.available
        self.held, self.available = True, False

    def release(self) -> None:
        """The store answers: writes may be tried again, at once."""
        self.held, self._next_try = False, 0.0
        self.available = self.available or not self._pending

    def __len__(self) -> int:
        return len(self._pending)

    async def write(self, kind: str, rows: int, run: Callable[[], Awaitable[object]]) -> bool:
        """Make the write now, or keep it if the store cannot be reached (or earlier
        writes wait); whether it was made now. Errors that are not an outage raise."""
        if self._pending or not self._due():
            self._keep(_Write(kind, rows, run))
            await self.retry()
            return False
        try:
            await run()
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._down(exc)
            self._keep(_Write(kind, rows, run))
            return False
        return True

    async def retry(self) -> int:
        """Write what is kept, oldest first, until the store fails again; the rows written.
        Does nothing before ``retry_s`` has passed since the last failure, or while
        another task is retrying (it takes the writes queued meanwhile too)."""
        if not self._pending or self._lock.locked() or not self._due():
            return 0
        written = 0
        async with self._lock:
            while self._pending:
                w = self._pending[0]
                try:
                    await w.run()
                except Exception as exc:
                    if unreachable(exc):
                        self._down(exc)
                        return written
                    log.warning("the store refused %d buffered %s row(s): %s", w.rows, w.kind, exc)
                    self.rejected[w.kind] += w.rows
                else:
                    written += w.rows
                # Popped only now, unless a full buffer dropped it meanwhile.
                if self._pending and self._pending[0] is w:
                    self._pending.popleft()
                    self.buffered_rows -= w.rows
            if not self.available:
                log.info("the store answers again: %d buffered row(s) written", written)
            self.available = True
        return written

    def _due(self) -> bool:
        return not self.held and (self.available or self._clock() >= self._next_try)

    def _down(self, exc: BaseException) -> None:
        if self.available:
            self.outages += 1
            log.warning(
                "the store cannot be reached (%s): buffering its writes (at most %d rows)",
                _one_line(exc),
                self.max_rows,
            )
        self.available = False
        self._next_try = self._clock() + self.retry_s

    def _keep(self, w: _Write) -> None:
        self._pending.append(w)
        self.buffered_rows += w.rows
        while self.buffered_rows > self.max_rows and self._pending:
            old = self._pending.popleft()
            self.buffered_rows -= old.rows
            if not self.dropped:
                log.warning(
                    "store buffer full (%d rows): dropping the oldest writes (counted in "
                    "mark_store_dropped_rows_total)",
                    self.max_rows,
                )
            self.dropped[old.kind] += old.rows

    def prometheus(self) -> str:
        """The buffer's state for ``/metrics``."""
        lines = [
            f"mark_store_available {int(self.available)}",
            f"mark_store_buffered_rows {self.buffered_rows}",
            f"mark_store_outages_total {self.outages}",
        ]
        for name, counts in (("dropped", self.dropped), ("rejected", self.rejected)):
            lines += [
                f'mark_store_{name}_rows_total{{kind="{k}"}} {n}' for k, n in sorted(counts.items())
            ]
        return "\n".join(lines) + "\n"


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
