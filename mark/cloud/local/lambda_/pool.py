"""The local Lambda's warm pool: which runtime serves the next invocation, and who waits.

``acquire`` takes an idle (warm) runtime, the most recently used first; if none
is idle and fewer than ``max_concurrency`` exist, it starts a new one (a cold
start); otherwise it queues in FIFO order for at most ``queue_timeout_s`` and
then fails as throttled, as Lambda's concurrency limit does.

``throttle`` is a fault-injection switch for tests and drills (``tests/faults``),
never called by mark itself: for a while every invocation is refused at once as
throttled, as Lambda answers 429 when the account's concurrency is used up elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable

from mark.cloud.local.lambda_.records import Runtime
from mark.errors import SpillError, SpillThrottled


class RuntimePool:
    """Idle runtimes, the count of live ones against the limit, and the callers waiting."""

    def __init__(self, max_concurrency: int, queue_timeout_s: float) -> None:
        self.max_concurrency = max_concurrency
        self.queue_timeout_s = queue_timeout_s
        self.live = 0  # runtimes started or starting and not dead (and reserved spawns)
        self.closed = False
        self._idle: list[Runtime] = []  # a stack: reuse the most recently used runtime
        self._waiters: deque[asyncio.Future[Runtime | None]] = deque()
        self._throttled_until = 0.0  # time.monotonic(); see ``throttle``

    @property
    def busy(self) -> int:
        """Runtimes live and not idle: serving, starting, or reserved."""
        return self.live - len(self._idle)

    async def acquire(
        self, spawn: Callable[[], Awaitable[Runtime]], *, wait: bool
    ) -> Runtime | None:
        """Reserve a runtime: idle, else a new one (``spawn``) under the limit, else queue
        (if ``wait``; ``None`` if not). ``spawn`` finds its slot already counted."""
        if time.monotonic() < self._throttled_until:
            raise SpillThrottled("TooManyRequestsException: Rate Exceeded (throttle injected)")
        while self._idle:
            rt = self._idle.pop()
            if not rt.dead:
                return rt
        if self.live < self.max_concurrency:
            self.live += 1
            return await spawn()
        if not wait:
            return None
        waiter: asyncio.Future[Runtime | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                got = await waiter
        except TimeoutError:
            raise SpillThrottled(
                f"all {self.max_concurrency} runtimes busy for {self.queue_timeout_s:g} s"
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())
            else:
                waiter.cancel()
            raise
        if got is None:  # capacity freed by a dead runtime, reserved for us
            return await spawn()
        return got

    def throttle(self, seconds: float) -> None:
        """Fault injection: refuse every invocation at once as ``SpillThrottled`` (Lambda's
        429) for ``seconds`` from now; 0 ends it. Runtimes and waiters are left as they are."""
        self._throttled_until = time.monotonic() + max(0.0, seconds)

    def release(self, rt: Runtime) -> None:
        """A runtime finished its invocation: idle again, or straight to a waiter."""
        if not rt.dead and not self.closed:
            self._idle.append(rt)
            self.match()

    def free_slot(self) -> None:
        """A reserved or live runtime is gone (or never started); ``match`` hands the slot on."""
        self.live -= 1

    def discard(self, rt: Runtime) -> None:
        """A runtime died: free its slot and forget it as idle."""
        self.free_slot()
        with contextlib.suppress(ValueError):
            self._idle.remove(rt)

    def close(self) -> None:
        """Stop handing out runtimes and fail every caller still waiting."""
        self.closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(SpillError("the local Lambda was closed"))

    def match(self) -> None:
        """Give idle runtimes, then free capacity, to waiters in arrival order."""
        while self._waiters:
            waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self._idle:
                waiter.set_result(self._idle.pop())
            elif self.live < self.max_concurrency and not self.closed:
                self.live += 1
                waiter.set_result(None)
            else:
                return
            self._waiters.popleft()

    def _give_back(self, rt: Runtime | None) -> None:
        if rt is None:
            self.live -= 1
        elif not rt.dead:
            self._idle.append(rt)
        self.match()
