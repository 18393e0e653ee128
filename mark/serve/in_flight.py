"""A batch in flight, for the dispatcher (``mark.serve.dispatcher``, whose docstring
says the rules): the exchange with the agent, the timer that declares the batch hung, and
its settling, once, with what the instance still owes spilled and a failed instance
penalised for a grace."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from bouncer.agent_token import token_headers
from bouncer.routing import allowance_after
from bouncer.variants import AccuracyLedger
from bouncer.wire import (
    BATCH_PATH,
    FALLBACK_HEADER,
    JSON_TYPE,
    VARIANT_HEADER,
    LineReader,
    decode_result,
    decode_verdict,
    encode_batch,
)
from mark.serve.flight import Backend, Flight, Queued

log = logging.getLogger("mark.dispatcher")

_JSON = {"Content-Type": JSON_TYPE}


class InFlight:
    """The dispatcher's batches in flight (a part of ``Dispatcher``)."""

    clock: Callable[[], float]
    dtype: str
    rt_max_s: float
    grace_s: float
    session: aiohttp.ClientSession
    backends: dict[str, Backend]
    _flights: dict[str, set[Flight]]

    accuracy: dict[str, float]
    ledger: AccuracyLedger

    if TYPE_CHECKING:

        def _spill(
            self, reqs: Sequence[Queued], cause: str, instance_type: str | None = None
        ) -> None: ...

        def _finish(
            self,
            r: Queued,
            output: Any,
            error: str | None,
            served_by: str,
            variant: str | None = None,
        ) -> None: ...

    def _arm(self, flight: Flight, due: float, why: str) -> None:
        """Declare the flight hung at ``due`` (this clock's time) unless it settles first."""
        if flight.timer is not None:
            flight.timer.cancel()
        delay = max(0.0, due - self.clock())
        flight.timer = asyncio.get_running_loop().call_later(
            delay, self._end_flight, flight, f"hung: {why}"
        )

    def _untrack(self, flight: Flight) -> bool:
        """Forget the flight; ``False`` if it had already settled."""
        if flight.timer is not None:
            flight.timer.cancel()
            flight.timer = None
        flights = self._flights.get(flight.instance_id)
        if flights is None or flight not in flights:
            return False
        flights.discard(flight)
        if not flights:
            del self._flights[flight.instance_id]
        return True

    def _end_flight(self, flight: Flight, failure: str | None, cause: str = "failure") -> None:
        """Settle a flight once: stop its exchange and spill what the instance still owes
        (counted under ``cause``); a failure that left requests owed penalises the instance."""
        if not self._untrack(flight):
            return
        owed = [r for r in flight.batch if r.owed]
        if failure is not None and owed:
            log.warning(
                "instance %s: %s; %d requests go to Lambda", flight.instance_id, failure, len(owed)
            )
            self._penalise(flight.instance_id)
        if flight.task is not None and flight.task is not asyncio.current_task():
            flight.task.cancel()
        if flight.variant is not None and owed:  # counted as sent; their answers count anew
            self.ledger.served(self.clock(), self.accuracy[flight.variant], -len(owed))
        self._spill(owed, cause)

    def _penalise(self, instance_id: str) -> None:
        """No batches to the instance for a grace, and a ``busy_until`` that says so."""
        b = self.backends.get(instance_id)
        if b is None:
            return
        until = self.clock() + self.grace_s
        b.busy_until = max(b.busy_until, until)
        b.penalised_until = max(b.penalised_until, until)

    async def _send(self, flight: Flight) -> None:
        """The exchange with the agent; however it ends, every request is answered or spilled."""
        batch = flight.batch
        try:
            rows = [r.row for r in batch]
            arrays = [r for r in rows if not isinstance(r, dict)]
            body = encode_batch(
                np.stack(arrays) if len(arrays) == len(rows) else rows,
                self.dtype,
                [r.deadline - flight.backend.allowance_s for r in batch],
            )
        except Exception:  # rows that do not stack: not the instance's fault, no penalty
            log.exception("cannot encode a batch for %s; it goes to Lambda", flight.instance_id)
            self._end_flight(flight, None)
            return
        try:
            await self._exchange(flight, body)
        except asyncio.CancelledError:
            self._end_flight(flight, None, cause="closing")  # abandoned (settled) or closing
            raise
        except Exception as exc:  # any failure, expected or not: what is owed spills
            self._end_flight(flight, f"failed a batch: {type(exc).__name__}: {exc}")
        else:
            self._end_flight(flight, None)

    async def _exchange(self, flight: Flight, body: bytes) -> None:
        backend, batch = flight.backend, flight.batch
        iid = backend.instance_id
        named = {VARIANT_HEADER: flight.variant} if flight.variant is not None else {}
        if flight.fallback is not None:
            named[FALLBACK_HEADER] = flight.fallback
        async with self.session.post(
            f"{backend.url}{BATCH_PATH}", data=body, headers={**_JSON, **token_headers(), **named}
        ) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=await resp.text()
                )
            lines = LineReader(resp.content)
            head = decode_verdict(await lines.line(), len(batch))
            now = self.clock()
            sent = flight.variant
            if sent is not None:  # counted as sent: now as it runs, rejected rows not at all
                ran = head.variant if head.variant in self.accuracy else sent
                self.ledger.served(now, self.accuracy[sent], -len(batch))
                self.ledger.served(now, self.accuracy[ran], len(head.admitted))
                flight.variant = ran  # the agent may have taken the fallback
            current = self.backends.get(iid)
            if current is not None:
                current.busy_until = max(now, head.finish, current.penalised_until)
            # What the Bouncer rejects (or leaves out) goes to Lambda while it has time.
            taken = set(head.admitted)
            rejected = [r for i, r in enumerate(batch) if i not in taken]
            self._spill(rejected, "rejected", backend.instance_type)
            admitted = [batch[i] for i in head.admitted]
            if admitted:
                last = max(r.deadline for r in admitted)
                due = max(now, min(head.finish, last)) + self.grace_s
                self._arm(flight, due, f"no result {self.grace_s:g} s past its predicted finish")
                outputs, error = decode_result(await lines.line(), len(admitted))
                current = self.backends.get(iid)
                if current is not None:
                    current.allowance_s = allowance_after(
                        current.allowance_s, self.clock() - head.finish, self.rt_max_s / 2
                    )
                if error is not None:
                    for r in admitted:
                        self._finish(r, None, error, iid)
                else:
                    for r, out in zip(admitted, outputs, strict=True):
                        self._finish(r, out, None, iid, flight.variant)
            # Read to the end of the chunked body: a response released before its end
            # closes the connection, and the next batch would pay a new TCP handshake.
            await resp.content.read()
