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
  batches already on it to end, so a retirement costs no request a spill; on
  another frontend than the leader's, the agent sync ``withhold``s it the same way
  once the store marks it retiring (``mark.control.retiring``), and ``release``s it
  if the store lists it serving again;
- a batch is hung when it has no verdict ``grace`` after it was sent, or no
  result ``grace`` after the verdict's ``finish`` (taken no earlier than the
  verdict's arrival and no later than the batch's last admitted deadline, so a
  skewed clock cannot stretch the wait): what it owes spills, and the instance
  is penalised for a grace (no batches; ``busy_until`` pushed), so the next
  batches go to another instance or to Lambda;
- an exchange that fails (refused, reset, closed early, a malformed or huge
  line, any other exception) spills what it owes and penalises the same way.

A request is handed to Lambda at most once (``Queued.spilled``): that is its
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
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import numpy as np

from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from bouncer.routing import (
    due_at,
    finish_if_sent,
    pick,
    spill_cap,
    window_end,
)
from bouncer.variants import AccuracyLedger
from bouncer.wire import (
    JSON_TYPE,
)
from mark.ports import Serverless
from mark.serve.flight import DECLINED, Backend, Flight, Group, Outcome, Queued, Row, row_shape
from mark.serve.in_flight import InFlight
from mark.serve.spilling import SHUTTING_DOWN, Spilling
from mark.serve.telemetry import Telemetry
from mark.serve.variant_routing import VariantRouting

__all__ = ["DECLINED", "SHUTTING_DOWN", "Backend", "Dispatcher", "Dispatchers", "Outcome", "Row"]

log = logging.getLogger("mark.dispatcher")

_JSON = {"Content-Type": JSON_TYPE}

GRACE_FLOOR_S = 1.0
"""The least wait past an instance's predicted finish before its batch is hung: below a
second, a GC pause or a busy machine's scheduling would spill batches merely late."""

RETIRING_KEPT_S = 600.0
"""How long a retiring instance stays marked once it has left the backends. The terminate
follows the retire within seconds, so a mark this old is of an instance that is gone (ids
are never reused): forgetting it only keeps the set from growing."""

SPILL_TIMEOUT_S = 60.0
"""How long one spill invocation may take by default: the spill function's timeout
(``AwsLambda``'s ``timeout_s``)."""


class Dispatcher(InFlight, Spilling, VariantRouting):
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
        spill_batches: BatchLatency | None = None,
        variants: Sequence[tuple[str, float]] = (),
        accuracy_floor: float = 0.0,
        accuracy_window_s: float = 86_400.0,
    ) -> None:
        """``give_up_after_s`` defaults to ``outcome_bound_s`` + one grace (module docstring);
        ``budget``: the SLO's miss budget, asked before each spill for want of capacity
        (None: never decline); ``spill_batches``: the spill function's measured batch
        latency, which sizes its invocations (``bouncer.routing.spill_chunks``; None: one
        request each); ``variants``: the model's variants (name, accuracy), most accurate
        first, chosen per batch under ``accuracy_floor`` averaged over
        ``accuracy_window_s`` (``bouncer.variants``)."""
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
        self.spill_batches = spill_batches
        self.variants = tuple(variants)
        self.accuracy = dict(self.variants)
        self.primary = self.variants[0][0] if self.variants else None
        self.accuracy_floor = accuracy_floor
        self.ledger = AccuracyLedger(accuracy_window_s)
        self.give_up_after_s = (
            self.outcome_bound_s + self.grace_s if give_up_after_s is None else give_up_after_s
        )
        self.backends: dict[str, Backend] = {}
        self._flights: dict[str, set[Flight]] = {}  # by instance id
        # Instances sent nothing new, about to be terminated: id → when marked. Kept while
        # a sync drops the instance (its agent missed a probe) and lists it again before
        # the terminate, and forgotten only ``RETIRING_KEPT_S`` after it left the backends.
        self._retiring: dict[str, float] = {}
        # Instances the store marks retiring (the leader's, read by the agent sync): id →
        # when last read marked, forgotten as ``_retiring`` is. Apart from it, so a read
        # never undoes this frontend's own ``retire``.
        self._withheld: dict[str, float] = {}
        self._queue: asyncio.Queue[Queued] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._forming: list[Queued] = []  # the batch being filled: neither queued nor sent
        # The first request of another shape than the batch being filled: the next
        # batch's first (``_next``), so requests of one shape batch together, in order.
        self._held: Queued | None = None
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
        self._withheld = {
            i: t for i, t in self._withheld.items() if i in fresh or now - t < RETIRING_KEPT_S
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
        return frozenset(self._retiring) | frozenset(self._withheld)

    def keep(self, instance_ids: Sequence[str]) -> None:
        """Serve on these instances again: their termination was refused."""
        for i in instance_ids:
            self._retiring.pop(i, None)

    def withhold(self, instance_ids: Collection[str]) -> None:
        """Send these instances no new batch: the store marks them retiring (the leader,
        perhaps in another frontend, is about to end them). The batches already on them
        finish; nothing waits for them here (the agent sync calls it)."""
        now = self.clock()
        self._withheld.update((i, now) for i in instance_ids)

    def release(self, instance_ids: Collection[str]) -> None:
        """Send to these again if ``withhold`` held them: the store lists them serving (a
        termination refused, a stopped instance started). This frontend's own ``retire``
        stays until its ``keep``."""
        for i in instance_ids:
            self._withheld.pop(i, None)

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
        pin: str | None = None,
        floor: float = 0.0,
    ) -> list[Outcome]:
        """Queue each row as a request; wait for every one to end. ``rows``: the one
        input's array, or each named input's (rows batch, spill and come back by name).

        The caller waits on one future for the whole group, not one per row: a
        client that disconnects cancels only that wait, and its requests still
        run to an outcome that telemetry counts. ``spill_now``: the rows go straight
        to the spill function (the endpoint's one retry of rows that failed) and are
        not counted as arrivals again. Once the dispatcher is closing, every row is
        answered at once with an explicit error. ``pin``: the variant every row runs on
        (one the model has); ``floor``: the least accuracy of a variant that serves them.
        """
        now = self.clock()
        loop = asyncio.get_running_loop()
        if isinstance(rows, Mapping):
            n = int(next(iter(rows.values())).shape[0])
            each: list[Row] = [{k: a[i] for k, a in rows.items()} for i in range(n)]
        else:
            n = rows.shape[0]
            each = [rows[i] for i in range(n)]
        group = Group(n, loop.create_future(), pin, floor)
        reqs = [Queued(each[i], now, now + self.rt_max_s, group, i) for i in range(n)]
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

    # -- batching --------------------------------------------------------

    def _usable(self, b: Backend, now: float) -> bool:
        """Not penalised now, and not about to be terminated."""
        return (
            b.penalised_until <= now
            and b.instance_id not in self._retiring
            and b.instance_id not in self._withheld
        )

    def _pick(self) -> Backend | None:
        """``bouncer.routing.pick`` among the instances usable now."""
        now = self.clock()
        return pick(now, [b for b in self.backends.values() if self._usable(b, now)])

    async def _next(self) -> Queued:
        """The held request, else the queue's next."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        return await self._queue.get()

    def _joins(self, batch: list[Queued], r: Queued) -> bool:
        """Whether ``r`` joins the batch (its shape, pin and floor are the batch's); else it
        is held for the next one. A model's rows differ in shape only along a variable
        dimension."""
        head = batch[0].group
        if row_shape(r.row) == row_shape(batch[0].row) and (r.group.pin, r.group.floor) == (
            head.pin,
            head.floor,
        ):
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
                while not self._queue.empty() and len(batch) < spill_cap(self.spill_batches):
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
            variant, latency, fallback = self._variant_for(batch, backend, now)
            # Reserve the instance now so the next batch sees it busy.
            backend.busy_until = finish_if_sent(now, backend.busy_until, latency(len(batch)))
            flight = Flight(backend, batch, variant, fallback)
            if variant is not None:  # counted as sent (``bouncer.variants``)
                self.ledger.served(now, self.accuracy[variant], len(batch))
            self._flights.setdefault(backend.instance_id, set()).add(flight)
            flight.task = self._spawn(self._send(flight))
            self._arm(flight, now + self.grace_s, f"no verdict within {self.grace_s:g} s")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class OtherFrontends(Protocol):
    """The cluster's other frontends, told through the store that instances are about to
    end (``mark.control.retiring.StoreRetiring``)."""

    async def retire(self, instance_ids: Sequence[str], grace_s: float) -> None: ...

    async def keep(self, instance_ids: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class Dispatchers:
    """``mark.ports.Draining`` over every model's dispatcher (an instance serves one model,
    so the others have nothing of it to drain), and over the other frontends'."""

    each: Sequence[Dispatcher]
    others: OtherFrontends | None = None
    """Told as well, and waited for (None: this frontend alone serves)."""

    @property
    def grace_s(self) -> float:
        """The longest grace of the dispatchers: how long a batch sent may still run."""
        return max((d.grace_s for d in self.each), default=GRACE_FLOOR_S)

    async def retire(self, instance_ids: Sequence[str]) -> None:
        told = [] if self.others is None else [self.others.retire(instance_ids, self.grace_s)]
        await asyncio.gather(*(d.retire(instance_ids) for d in self.each), *told)

    async def keep(self, instance_ids: Sequence[str]) -> None:
        for d in self.each:
            d.keep(instance_ids)
        if self.others is not None:
            await self.others.keep(instance_ids)
