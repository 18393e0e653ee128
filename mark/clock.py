"""Clocks: the wall clock for the local and aws worlds, a manual one for tests.

Policies never read a clock; the shell reads one and passes ``now`` in. The
simulator brings its own virtual clock (``mark.sim``).
"""

from __future__ import annotations

import asyncio
import time


class WallClock:
    """Real time: seconds since the Unix epoch."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it at once.

    Lets a test drive a control-loop step at any instant without waiting.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)
