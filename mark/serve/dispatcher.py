"""The dispatcher: one queue per model, batches per instance, spill to Lambda.

Every request carries its deadline (arrival + RT_max). The batcher takes the
oldest request, picks the instance that can finish it soonest, and fills a
batch for that instance until its N_batch is reached or W_batch has passed
since that request arrived — a batch never waits longer. That rule is
``bouncer.routing``'s, which the simulator applies too; the batch goes to the
agent in ``bouncer.wire``'s protocol. The instance's Bouncer answers at once
with what it admits; what it rejects, and everything when no instance exists,
goes to the ``Serverless`` port straight away. Every request ends in an
``Outcome``: an output, or an explicit error. None is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from bouncer.latency import BatchLatency
from bouncer.routing import SPILL_CHUNK, due_at, finish_if_sent, pick, window_end
from bouncer.wire import BATCH_PATH, JSON_TYPE, decode_result, decode_verdict, encode_batch
from mark.errors import CloudError
from mark.ports import Serverless
from mark.serve.telemetry import Telemetry

log = logging.getLogger("mark.dispatcher")

_JSON = {"Content-Type": JSON_TYPE}


@dataclass
class Backend:
    """An instance's agent as the frontend sees it."""

    instance_id: str
    instance_type: str
    url: str
    latency: BatchLatency
    n_batch: int = 1
    w_batch_s: float = 0.0
    busy_until: float = 0.0

    def finish_if_sent(self, now: float, size: int = 1) -> float:
        return finish_if_sent(now, self.busy_until, self.latency(size))


@dataclass(frozen=True, slots=True)
class Outcome:
    output: Any | None
    error: str | None
    served_by: str  # instance id, "lambda", or "none"
    latency_s: float

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def spilled(self) -> bool:
        return self.served_by == "lambda"


class _Group:
    """The requests of one ``submit`` call: their outcomes, and a future set when all ended."""

    __slots__ = ("done", "outcomes", "pending")

    def __init__(self, n: int, done: asyncio.Future[None]) -> None:
        self.outcomes: list[Outcome | None] = [None] * n
        self.pending = n
        self.done = done


class _Request:
    __slots__ = ("arrival", "deadline", "group", "index", "row")

    def __init__(
        self, row: np.ndarray[Any, Any], arrival: float, deadline: float, group: _Group, index: int
    ) -> None:
        self.row = row
        self.arrival = arrival
        self.deadline = deadline
        self.group = group
        self.index = index

    @property
    def finished(self) -> bool:
        return self.group.outcomes[self.index] is not None


class Dispatcher:
    def __init__(
        self,
        model: str,
        rt_max_s: float,
        dtype: str,
        clock: Callable[[], float],
        session: aiohttp.ClientSession,
        serverless: Serverless | None,
        telemetry: Telemetry | None = None,
        give_up_after_s: float = 60.0,
    ) -> None:
        self.model = model
        self.rt_max_s = rt_max_s
        self.dtype = dtype
        self.clock = clock
        self.session = session
        self.serverless = serverless
        self.telemetry = telemetry
        self.give_up_after_s = give_up_after_s
        self.backends: dict[str, Backend] = {}
        self._queue: asyncio.Queue[_Request] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._batcher(), name=f"batcher-{self.model}")

    async def close(self) -> None:
        """Stop batching; whatever is still queued is answered with an explicit error."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        while not self._queue.empty():
            self._finish(self._queue.get_nowait(), None, "mark is shutting down", "none")

    def set_backends(self, backends: Sequence[Backend]) -> None:
        """Replace the set of instances, keeping what we know of the ones that stay."""
        fresh = {}
        for b in backends:
            old = self.backends.get(b.instance_id)
            if old is not None:
                b.busy_until = old.busy_until
            fresh[b.instance_id] = b
        self.backends = fresh

    @property
    def can_serve(self) -> bool:
        """A request has somewhere to go now: an instance's agent, or the spill function."""
        return bool(self.backends) or self.serverless is not None

    # -- request path ----------------------------------------------------

    async def submit(self, rows: np.ndarray[Any, Any]) -> list[Outcome]:
        """Queue each row as a request; wait for every one to end.

        The caller waits on one future for the whole group, not one per row: a
        client that disconnects cancels only that wait, and its requests still
        run to an outcome that telemetry counts.
        """
        now = self.clock()
        loop = asyncio.get_running_loop()
        n = rows.shape[0]
        group = _Group(n, loop.create_future())
        reqs = [_Request(rows[i], now, now + self.rt_max_s, group, i) for i in range(n)]
        if self.telemetry is not None:
            self.telemetry.arrival(now, n)
        for r in reqs:
            self._queue.put_nowait(r)
        give_up = loop.call_later(self.give_up_after_s, self._give_up, reqs)
        try:
            await group.done
        finally:
            give_up.cancel()
        return [o for o in group.outcomes if o is not None]

    def _give_up(self, reqs: list[_Request]) -> None:
        for r in reqs:
            self._finish(r, None, f"no result within {self.give_up_after_s:g} s", "none")

    def _finish(self, r: _Request, output: Any, error: str | None, served_by: str) -> None:
        group = r.group
        if group.outcomes[r.index] is not None:
            return
        now = self.clock()
        outcome = Outcome(output, error, served_by, now - r.arrival)
        group.outcomes[r.index] = outcome
        group.pending -= 1
        if group.pending == 0 and not group.done.done():
            group.done.set_result(None)
        if self.telemetry is not None:
            self.telemetry.outcome(now, outcome.latency_s, ok=outcome.ok, spilled=outcome.spilled)

    # -- batching --------------------------------------------------------

    async def _batcher(self) -> None:
        while True:
            first = await self._queue.get()
            backend = pick(self.clock(), self.backends.values())
            if backend is None:
                batch = [first]
                while not self._queue.empty() and len(batch) < SPILL_CHUNK:
                    batch.append(self._queue.get_nowait())
                self._spawn(self._spill(batch))
                continue
            batch = [first]
            w_end = window_end(first.arrival, backend.w_batch_s)
            while len(batch) < backend.n_batch:
                if not self._queue.empty():  # what is waiting joins at once
                    batch.append(self._queue.get_nowait())
                    continue
                now = self.clock()
                wait = due_at(now, w_end) - now
                if wait <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), wait))
                except TimeoutError:
                    break
            # Reserve the instance now so the next batch sees it busy.
            now = self.clock()
            backend.busy_until = backend.finish_if_sent(now, len(batch))
            self._spawn(self._send(backend, batch))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, backend: Backend, batch: list[_Request]) -> None:
        body = encode_batch(
            np.stack([r.row for r in batch]), self.dtype, [r.deadline for r in batch]
        )
        try:
            async with self.session.post(
                f"{backend.url}{BATCH_PATH}", data=body, headers=_JSON
            ) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message=await resp.text()
                    )
                head = decode_verdict(await resp.content.readline())
                admitted = head.admitted
                rejected = [batch[i] for i in head.rejected]
                backend.busy_until = max(self.clock(), head.finish)
                if rejected:
                    self._spawn(self._spill(rejected))
                if admitted:
                    outputs, error = decode_result(await resp.content.readline())
                    if error is not None:
                        for i in admitted:
                            self._finish(batch[i], None, error, backend.instance_id)
                    else:
                        for i, out in zip(admitted, outputs, strict=True):
                            self._finish(batch[i], out, None, backend.instance_id)
                # Read to the end of the chunked body: a response released before its end
                # closes the connection, and the next batch would pay a new TCP handshake.
                await resp.content.read()
        except (aiohttp.ClientError, OSError, ValueError, KeyError, TimeoutError) as exc:
            # The instance failed us: whatever it did not answer goes to Lambda.
            log.warning("instance %s failed a batch: %s", backend.instance_id, exc)
            backend.busy_until = self.clock() + 1.0  # steer the next batches elsewhere
            self._spawn(self._spill([r for r in batch if not r.finished]))

    async def _spill(self, batch: list[_Request]) -> None:
        if not batch:
            return
        if self.serverless is None:
            for r in batch:
                self._finish(r, None, "no serving capacity and no spill function", "none")
            return
        serverless = self.serverless

        async def one(chunk: list[_Request]) -> None:
            try:
                result = await serverless.invoke(self.model, [r.row.tolist() for r in chunk])
                for r, out in zip(chunk, result.outputs, strict=True):
                    self._finish(r, out, None, "lambda")
            except (CloudError, ValueError) as exc:
                for r in chunk:
                    self._finish(r, None, f"spill failed: {exc}", "lambda")

        # Invocations run side by side, as Lambda scales out per concurrent request.
        await asyncio.gather(
            *(one(batch[s : s + SPILL_CHUNK]) for s in range(0, len(batch), SPILL_CHUNK))
        )
