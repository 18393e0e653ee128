"""The dispatcher: one queue per model, batches per instance, spill to Lambda.

Every request carries its deadline (arrival + RT_max). The batcher takes the
oldest request, picks the instance that can finish it soonest, and fills a
batch for that instance until its N_batch is reached or W_batch has passed
since that request arrived — a batch never waits longer — or the next request
has another shape (a model with a variable dimension: rows batch only with rows
of their own shape; the other one starts the next batch). That rule is
``bouncer.routing``'s, which the simulator applies too; the batch goes to the
agent in ``bouncer.wire``'s protocol. The instance's Bouncer answers at once
with what it admits; what it rejects, and everything when no instance exists,
goes to the ``Serverless`` port straight away, less what the SLO's miss budget
declines (``bouncer.miss_budget``: an explicit ``DECLINED`` error at once, while the
misses of the SLO's period leave room), as the simulator's engine does. Every request ends in an
``Outcome``: an output, or an explicit error. None is lost. The deadline an
agent is given is the request's less the instance's transport allowance (how
late its results come back, ``bouncer.routing.allowance_after``), so what its
Bouncer admits reaches the client within RT_max, not a hop after it.

In flight: every batch sent is tracked per instance until it settles, so no
request waits on an instance that cannot answer. With grace = max(RT_max,
``GRACE_FLOOR_S``):

- an instance that leaves ``set_backends`` (drained: its process died, it
  fails its liveness probe) has its batches cancelled, and what they still owe
  spills at once;
- an instance the controller is about to terminate is ``retire``d first: it
  gets no new batch, and the controller waits (at most two graces) for the
  batches already on it to end, so a retirement costs no request a spill;
- a batch is hung when it has no verdict ``grace`` after it was sent, or no
  result ``grace`` after the verdict's ``finish`` (taken no earlier than the
  verdict's arrival and no later than the batch's last admitted deadline, so a
  skewed clock cannot stretch the wait): what it owes spills, and the instance
  is penalised for a grace (no batches; ``busy_until`` pushed), so the next
  batches go to another instance or to Lambda;
- an exchange that fails (refused, reset, closed early, a malformed or huge
  line, any other exception) spills what it owes and penalises the same way.

A request is handed to Lambda at most once (``_Request.spilled``): that is its
last hop. Each invocation is bounded by ``spill_timeout_s``. So a request is
dispatched by arrival + W_batch (≤ RT_max), hands off to Lambda by dispatch +
2 × grace (verdict, then result), and has its outcome by ``outcome_bound_s`` =
RT_max + 2 × grace + spill_timeout_s. The give-up, a backstop that should never
fire, comes one grace later: RT_max + 3 × grace + spill_timeout_s, at most
4 × max(RT_max, 1 s) + the spill timeout.

Closing: ``close`` is the end of a drain (``mark.daemon.stop`` first waits, up to
its bound, until the endpoint has answered everything it took). From then on
``submit`` answers at once with an explicit error, and whatever is still queued,
in the batch being formed, in flight or spilling after ``close``'s last wait is
answered with an explicit error: every request submitted gets exactly one outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from bouncer.agent_token import token_headers
from bouncer.latency import BatchLatency
from bouncer.miss_budget import DECLINED_ERROR, MissBudget
from bouncer.routing import (
    SPILL_CHUNK,
    allowance_after,
    due_at,
    finish_if_sent,
    pick,
    window_end,
)
from bouncer.wire import (
    BATCH_PATH,
    JSON_TYPE,
    LineReader,
    decode_result,
    decode_verdict,
    encode_batch,
)
from mark.ports import Serverless
from mark.serve.telemetry import Telemetry

log = logging.getLogger("mark.dispatcher")

_JSON = {"Content-Type": JSON_TYPE}

GRACE_FLOOR_S = 1.0
"""The least wait past an instance's predicted finish before its batch is hung: below a
second, a GC pause or a busy machine's scheduling would spill batches merely late."""

SHUTTING_DOWN = "mark is shutting down"
"""The error of every request the dispatcher still holds when it closes, or gets after."""

DECLINED = DECLINED_ERROR
"""The error of a request declined instead of spilled (``bouncer.miss_budget``)."""

DECLINABLE_CAUSES = frozenset({"rejected", "no-backend"})
"""The spills the miss budget may decline: those for want of capacity, as the simulator's
engine has them (its requests are one row each, as only one-row requests are declined
here). A request whose instance failed or left is owed its spill."""

RETIRING_KEPT_S = 600.0
"""How long a retiring instance stays marked once it has left the backends. The terminate
follows the retire within seconds, so a mark this old is of an instance that is gone (ids
are never reused): forgetting it only keeps the set from growing."""

SPILL_TIMEOUT_S = 60.0
"""How long one spill invocation may take by default: the spill function's timeout
(``AwsLambda``'s ``timeout_s``)."""


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
    penalised_until: float = 0.0
    allowance_s: float = 0.0
    """Taken off each deadline the agent is given: how late its results come back
    (``bouncer.routing.allowance_after``)."""
    """Until then the instance gets no batches: it just hung or failed one."""

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

    @property
    def declined(self) -> bool:
        """Declined by the miss budget instead of spilled (a miss, not a failure to serve)."""
        return self.error == DECLINED


class _Group:
    """The requests of one ``submit`` call: their outcomes, and a future set when all ended."""

    __slots__ = ("done", "outcomes", "pending")

    def __init__(self, n: int, done: asyncio.Future[None]) -> None:
        self.outcomes: list[Outcome | None] = [None] * n
        self.pending = n
        self.done = done


Row = np.ndarray[Any, Any] | dict[str, np.ndarray[Any, Any]]
"""One request's instance: the one input's, or each named input's."""


def _shape(row: Row) -> tuple[Any, ...]:
    """What a batch's rows must share: each input's instance shape."""
    if isinstance(row, dict):
        return tuple(a.shape for a in row.values())
    return tuple(row.shape)


def _plain(row: Row) -> Any:
    return {n: a.tolist() for n, a in row.items()} if isinstance(row, dict) else row.tolist()


class _Request:
    __slots__ = ("arrival", "deadline", "group", "index", "row", "spilled")

    def __init__(
        self, row: Row, arrival: float, deadline: float, group: _Group, index: int
    ) -> None:
        self.row = row
        self.arrival = arrival
        self.deadline = deadline
        self.group = group
        self.index = index
        self.spilled = False  # handed to Lambda (or failed for want of it): never again

    @property
    def finished(self) -> bool:
        return self.group.outcomes[self.index] is not None

    @property
    def owed(self) -> bool:
        """Neither answered nor handed to Lambda: whoever holds it still owes an answer."""
        return not self.spilled and not self.finished


@dataclass(eq=False)
class _Flight:
    """A batch sent to an instance and not settled: the exchange's task, and the timer
    that declares the batch hung."""

    backend: Backend
    batch: list[_Request]
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None

    @property
    def instance_id(self) -> str:
        return self.backend.instance_id


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
        give_up_after_s: float | None = None,
        spill_timeout_s: float = SPILL_TIMEOUT_S,
        budget: MissBudget | None = None,
    ) -> None:
        """``give_up_after_s`` defaults to ``outcome_bound_s`` + one grace (module docstring);
        ``budget``: the SLO's miss budget, asked before each spill for want of capacity
        (None: never decline)."""
        self.model = model
        self.rt_max_s = rt_max_s
        self.dtype = dtype
        self.clock = clock
        self.session = session
        self.serverless = serverless
        self.telemetry = telemetry
        self.grace_s = max(rt_max_s, GRACE_FLOOR_S)
        self.spill_timeout_s = spill_timeout_s
        self.budget = budget
        self.give_up_after_s = (
            self.outcome_bound_s + self.grace_s if give_up_after_s is None else give_up_after_s
        )
        self.backends: dict[str, Backend] = {}
        self._flights: dict[str, set[_Flight]] = {}  # by instance id
        # Instances sent nothing new, about to be terminated: id → when marked. Kept while
        # a sync drops the instance (its agent missed a probe) and lists it again before
        # the terminate, and forgotten only ``RETIRING_KEPT_S`` after it left the backends.
        self._retiring: dict[str, float] = {}
        self._queue: asyncio.Queue[_Request] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._forming: list[_Request] = []  # the batch being filled: neither queued nor sent
        # The first request of another shape than the batch being filled: the next
        # batch's first (``_next``), so requests of one shape batch together, in order.
        self._held: _Request | None = None
        self._open = True  # False once closing: ``submit`` answers at once with an error
        self._may_spill = True  # False once close's last wait is over

    @property
    def outcome_bound_s(self) -> float:
        """By when after its arrival every request has its outcome, whatever its instance
        does: dispatched within RT_max, handed to Lambda within 2 graces, answered within
        the spill timeout."""
        return self.rt_max_s + 2 * self.grace_s + self.spill_timeout_s

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._batcher(), name=f"batcher-{self.model}")

    async def close(self, wait_s: float = 10.0) -> None:
        """Take no more requests and stop batching: what is queued or in the batch being
        formed is answered with an explicit error at once; batches in flight and spills get
        a last wait of at most ``wait_s`` (what they owe may still spill meanwhile), then
        whatever is left is answered with an explicit error too."""
        self._open = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for r in [*self._forming, *([self._held] if self._held else [])]:
            self._finish(r, None, SHUTTING_DOWN, "none")
        self._forming = []
        self._held = None
        while not self._queue.empty():
            self._finish(self._queue.get_nowait(), None, SHUTTING_DOWN, "none")
        if self._tasks and wait_s > 0:
            await asyncio.wait(self._tasks, timeout=wait_s)
        self._may_spill = False
        for flight in [f for flights in self._flights.values() for f in flights]:
            self._untrack(flight)
            for r in flight.batch:
                self._finish(r, None, SHUTTING_DOWN, "none")
        left = list(self._tasks)
        for task in left:
            task.cancel()  # a spill ends its requests with an error as it is cancelled
        if left:
            await asyncio.wait(left, timeout=1)

    def set_backends(self, backends: Sequence[Backend]) -> None:
        """Replace the set of instances, keeping what we know of the ones that stay. The
        batches in flight on one that left are abandoned: what they owe spills now."""
        fresh = {}
        for b in backends:
            old = self.backends.get(b.instance_id)
            if old is not None:
                b.busy_until = old.busy_until
                b.penalised_until = old.penalised_until
                b.allowance_s = old.allowance_s
            fresh[b.instance_id] = b
        self.backends = fresh
        now = self.clock()
        self._retiring = {
            i: t for i, t in self._retiring.items() if i in fresh or now - t < RETIRING_KEPT_S
        }
        for iid in [i for i in self._flights if i not in fresh]:
            for flight in list(self._flights.get(iid, ())):
                self._end_flight(flight, "its instance left the backends", cause="drain")

    async def retire(self, instance_ids: Sequence[str]) -> None:
        """Send these instances no new batch, and return once the batches already on
        them have ended (each has its verdict and its result within a grace of each, or
        is spilled), at most two graces: the controller terminates them next."""
        now = self.clock()
        self._retiring.update((i, now) for i in instance_ids)  # also one a sync dropped
        mine = {i for i in instance_ids if i in self.backends}
        tasks = [f.task for i in mine for f in self._flights.get(i, ()) if f.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=2 * self.grace_s)

    @property
    def retiring(self) -> frozenset[str]:
        """The instances sent nothing new: no part of their type's pool."""
        return frozenset(self._retiring)

    def keep(self, instance_ids: Sequence[str]) -> None:
        """Serve on these instances again: their termination was refused."""
        for i in instance_ids:
            self._retiring.pop(i, None)

    @property
    def can_serve(self) -> bool:
        """A request has somewhere to go now: an instance's agent, or the spill function."""
        return bool(self.backends) or self.serverless is not None

    # -- request path ----------------------------------------------------

    async def submit(
        self,
        rows: np.ndarray[Any, Any] | Mapping[str, np.ndarray[Any, Any]],
        *,
        spill_now: bool = False,
    ) -> list[Outcome]:
        """Queue each row as a request; wait for every one to end. ``rows``: the one
        input's array, or each named input's (rows batch, spill and come back by name).

        The caller waits on one future for the whole group, not one per row: a
        client that disconnects cancels only that wait, and its requests still
        run to an outcome that telemetry counts. ``spill_now``: the rows go straight
        to the spill function (the endpoint's one retry of rows that failed) and are
        not counted as arrivals again. Once the dispatcher is closing, every row is
        answered at once with an explicit error.
        """
        now = self.clock()
        loop = asyncio.get_running_loop()
        if isinstance(rows, Mapping):
            n = int(next(iter(rows.values())).shape[0])
            each: list[Row] = [{k: a[i] for k, a in rows.items()} for i in range(n)]
        else:
            n = rows.shape[0]
            each = [rows[i] for i in range(n)]
        group = _Group(n, loop.create_future())
        reqs = [_Request(each[i], now, now + self.rt_max_s, group, i) for i in range(n)]
        if self.telemetry is not None and not spill_now:
            self.telemetry.arrival(now, n)
        if self.budget is not None and not spill_now:
            self.budget.arrive(now, n)
        if not self._open:
            for r in reqs:
                self._finish(r, None, SHUTTING_DOWN, "none")
            return [o for o in group.outcomes if o is not None]
        if spill_now:
            self._spill(reqs, "retry")
        else:
            for r in reqs:
                self._queue.put_nowait(r)
        give_up = loop.call_later(self.give_up_after_s, self._give_up, reqs)
        try:
            await group.done
        finally:
            if group.pending == 0:  # a caller gone early leaves its requests the backstop
                give_up.cancel()
        return [o for o in group.outcomes if o is not None]

    def _give_up(self, reqs: list[_Request]) -> None:
        for r in reqs:
            r.spilled = True  # too late for Lambda too
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
        declined = outcome.declined
        if (
            self.budget is not None
            and not declined  # counted when declined
            and (not outcome.ok or outcome.latency_s > self.rt_max_s)
        ):
            self.budget.miss(now)
        if self.telemetry is not None:
            self.telemetry.outcome(
                now, outcome.latency_s, ok=outcome.ok, spilled=outcome.spilled, declined=declined
            )

    # -- batching --------------------------------------------------------

    def _usable(self, b: Backend, now: float) -> bool:
        """Not penalised now, and not about to be terminated."""
        return b.penalised_until <= now and b.instance_id not in self._retiring

    def _pick(self) -> Backend | None:
        """``bouncer.routing.pick`` among the instances usable now."""
        now = self.clock()
        return pick(now, [b for b in self.backends.values() if self._usable(b, now)])

    async def _next(self) -> _Request:
        """The held request, else the queue's next."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        return await self._queue.get()

    def _joins(self, batch: list[_Request], r: _Request) -> bool:
        """Whether ``r`` joins the batch (its shape is the batch's); else it is held for
        the next one. A model's rows differ in shape only along a variable dimension."""
        if _shape(r.row) == _shape(batch[0].row):
            batch.append(r)
            return True
        self._held = r
        return False

    async def _batcher(self) -> None:
        while True:
            first = await self._next()
            backend = self._pick()
            if backend is None:
                batch = [first]
                while not self._queue.empty() and len(batch) < SPILL_CHUNK:
                    batch.append(self._queue.get_nowait())
                self._spill(batch, "no-backend")
                continue
            # Held where ``close`` finds it: cancelled while it fills, the batch is
            # neither queued nor in flight, and would otherwise be lost.
            batch = self._forming = [first]
            w_end = window_end(first.arrival, backend.w_batch_s)
            while len(batch) < backend.n_batch:
                if not self._queue.empty():  # what is waiting joins at once
                    if self._joins(batch, self._queue.get_nowait()):
                        continue
                    break
                now = self.clock()
                wait = due_at(now, w_end) - now
                if wait <= 0:
                    break
                try:
                    # Not wait_for: on 3.11 a cancel racing the get can lose the request
                    # the inner task took (or swallow the cancel); under a timeout scope
                    # the queue keeps a request until get() returns it.
                    async with asyncio.timeout(wait):
                        got = await self._queue.get()
                except TimeoutError:
                    break
                if not self._joins(batch, got):
                    break
            self._forming = []
            # The instance may have left, been replaced, penalised or retired while the
            # batch filled.
            now = self.clock()
            current = self.backends.get(backend.instance_id)
            backend = current if current and self._usable(current, now) else self._pick()
            if backend is None:
                self._spill(batch, "no-backend")
                continue
            # Reserve the instance now so the next batch sees it busy.
            backend.busy_until = backend.finish_if_sent(now, len(batch))
            flight = _Flight(backend, batch)
            self._flights.setdefault(backend.instance_id, set()).add(flight)
            flight.task = self._spawn(self._send(flight))
            self._arm(flight, now + self.grace_s, f"no verdict within {self.grace_s:g} s")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- a batch in flight -----------------------------------------------

    def _arm(self, flight: _Flight, due: float, why: str) -> None:
        """Declare the flight hung at ``due`` (this clock's time) unless it settles first."""
        if flight.timer is not None:
            flight.timer.cancel()
        delay = max(0.0, due - self.clock())
        flight.timer = asyncio.get_running_loop().call_later(
            delay, self._end_flight, flight, f"hung: {why}"
        )

    def _untrack(self, flight: _Flight) -> bool:
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

    def _end_flight(self, flight: _Flight, failure: str | None, cause: str = "failure") -> None:
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
        self._spill(owed, cause)

    def _penalise(self, instance_id: str) -> None:
        """No batches to the instance for a grace, and a ``busy_until`` that says so."""
        b = self.backends.get(instance_id)
        if b is None:
            return
        until = self.clock() + self.grace_s
        b.busy_until = max(b.busy_until, until)
        b.penalised_until = max(b.penalised_until, until)

    async def _send(self, flight: _Flight) -> None:
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

    async def _exchange(self, flight: _Flight, body: bytes) -> None:
        backend, batch = flight.backend, flight.batch
        iid = backend.instance_id
        async with self.session.post(
            f"{backend.url}{BATCH_PATH}", data=body, headers={**_JSON, **token_headers()}
        ) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=await resp.text()
                )
            lines = LineReader(resp.content)
            head = decode_verdict(await lines.line(), len(batch))
            now = self.clock()
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
                        self._finish(r, out, None, iid)
            # Read to the end of the chunked body: a response released before its end
            # closes the connection, and the next batch would pay a new TCP handshake.
            await resp.content.read()

    # -- spill -----------------------------------------------------------

    def _spill(
        self, reqs: Sequence[_Request], cause: str, instance_type: str | None = None
    ) -> None:
        """Hand to Lambda each request still owed: its last hop, taken once. ``cause``
        (``telemetry.SPILL_CAUSES``) is what ``/metrics`` counts it under."""
        todo = [r for r in reqs if r.owed]
        for r in todo:
            r.spilled = True
        if not todo:
            return
        if self.budget is not None and cause in DECLINABLE_CAUSES and self._may_spill:
            # Only a request of one row: a declined row fails its whole request (a 503),
            # so declining one row of several would waste what its other rows cost.
            single = [r for r in todo if len(r.group.outcomes) == 1]
            n = self.budget.decline(self.clock(), len(single))
            if n:
                declined = set(map(id, single[:n]))
                for r in single[:n]:
                    self._finish(r, None, DECLINED, "none")
                todo = [r for r in todo if id(r) not in declined]
            if not todo:
                return
        if not self._may_spill:
            for r in todo:
                self._finish(r, None, SHUTTING_DOWN, "none")
            return
        if self.serverless is None:
            for r in todo:
                self._finish(r, None, "no serving capacity and no spill function", "none")
            return
        if self.telemetry is not None:
            self.telemetry.spilled(cause, len(todo), instance_type)
        # Invocations run side by side, as Lambda scales out per concurrent request.
        for s in range(0, len(todo), SPILL_CHUNK):
            self._spawn(self._invoke(self.serverless, todo[s : s + SPILL_CHUNK]))

    async def _invoke(self, serverless: Serverless, chunk: list[_Request]) -> None:
        """One invocation; every request in it ends, with an output or an explicit error."""
        deadline = asyncio.timeout(self.spill_timeout_s)
        try:
            async with deadline:
                rows = [_plain(r.row) for r in chunk]
                result = await serverless.invoke(self.model, rows, dtype=self.dtype)
            outputs = list(result.outputs)
            if len(outputs) != len(chunk):
                raise ValueError(f"{len(outputs)} outputs for {len(chunk)} requests")
            for r, out in zip(chunk, outputs, strict=True):
                self._finish(r, out, None, "lambda")
        except asyncio.CancelledError:
            self._fail(chunk, "spill cancelled: mark is shutting down")
            raise
        except Exception as exc:  # CloudError, a payload read error, a bad reply: never silent
            if isinstance(exc, TimeoutError) and deadline.expired():
                why = f"no answer within {self.spill_timeout_s:g} s"
            else:
                why = str(exc) or type(exc).__name__
            self._fail(chunk, f"spill failed: {why}")

    def _fail(self, reqs: Sequence[_Request], error: str) -> None:
        for r in reqs:
            self._finish(r, None, error, "lambda")


@dataclass(frozen=True)
class Dispatchers:
    """``mark.ports.Draining`` over every model's dispatcher: an instance serves one
    model, so the others have nothing of it to drain."""

    each: Sequence[Dispatcher]

    async def retire(self, instance_ids: Sequence[str]) -> None:
        await asyncio.gather(*(d.retire(instance_ids) for d in self.each))

    def keep(self, instance_ids: Sequence[str]) -> None:
        for d in self.each:
            d.keep(instance_ids)
