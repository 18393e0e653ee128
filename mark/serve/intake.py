"""Whether the endpoint takes inference requests now, and how many it took and has not answered.

Three phases, in order:

- ``starting``: the daemon has not finished its first agent sync, so the dispatcher
  does not know the instances yet and would spill everything (``mark.daemon.start``
  waits for that sync, bounded by ``api.sync_wait_s``);
- ``open``: serving;
- ``draining``: the daemon is stopping (SIGTERM, Ctrl-C): readiness is false at
  once, so a load balancer stops sending, and what was taken runs to its outcome.

Outside ``open`` a new inference request is refused at once with 503 and
``Retry-After`` (never taken and then dropped), and readiness is 503. A request
counts as taken from the moment the endpoint accepts it until its handler returns
its answer, so the daemon can wait until none is left (``idle``).
"""

from __future__ import annotations

import asyncio
from enum import StrEnum


class Phase(StrEnum):
    STARTING = "starting"
    OPEN = "open"
    DRAINING = "draining"


REFUSALS = {
    Phase.STARTING: "mark is starting: its instances are not synced yet; retry shortly",
    Phase.DRAINING: "mark is shutting down and takes no new requests; retry (another replica)",
}


class Intake:
    """The endpoint's phase and the inference requests it took and has not answered."""

    def __init__(self, phase: Phase = Phase.OPEN) -> None:
        self.phase = phase
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def ready(self) -> bool:
        """Whether the endpoint serves: what readiness reports."""
        return self.phase is Phase.OPEN

    @property
    def refusal(self) -> str:
        """Why a request is refused now."""
        return REFUSALS.get(self.phase, "")

    def open(self) -> None:
        """Start serving (a draining endpoint stays draining)."""
        if self.phase is Phase.STARTING:
            self.phase = Phase.OPEN

    def drain(self) -> None:
        """Take nothing more, for good; what was taken is still answered."""
        self.phase = Phase.DRAINING

    def take(self) -> bool:
        """Take a request (``done`` when it is answered), or ``False``: refuse it."""
        if self.phase is not Phase.OPEN:
            return False
        self.in_flight += 1
        self._idle.clear()
        return True

    def done(self) -> None:
        """A request taken has its answer."""
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    async def idle(self) -> None:
        """Return once no request taken is without its answer."""
        await self._idle.wait()
