"""The request-level serving engine: the daemon's dispatcher and Bouncer on virtual time.

It applies the dispatcher's routing rule (``bouncer.routing``, the functions
``mark.serve.dispatcher`` calls) request by request: the oldest request picks
the instance that would finish it soonest (``pick``); a batch for that
instance fills until N_batch or until W_batch has passed since that request
arrived (``fill``); the instance's Bouncer (``bouncer.admission.Backlog``, the
queue state the agent keeps) admits what it can finish by the deadline; the
rest spill at once to the simulated Lambda in the invocations ``spill_chunks``
makes of them (one each without the function's batch curve), less
what the SLO's miss budget declines (``bouncer.miss_budget``, as the dispatcher
asks it; ``DECLINED``, latency inf).
Without a Bouncer (SageMaker-style serving, the no-Lambda ablation) an
instance queues everything it is sent. With ``timeout_s`` (SageMaker's
InvokeEndpoint gives up after 60 s) a request whose response would come later
than that after it arrived fails: latency inf, counted ``FAILED``. The instance
still spends the time on it (nothing tells a model server its client has gone).
A simulated batch takes exactly its profiled time, so it ends at the finish the
Bouncer predicted.

The loop is written for speed (5.5 M requests a day): arrivals are read in
slices, and results go to two numpy arrays (latency, and where each request
was served). Instances of one type share T_1, so ``pick`` need only see one
candidate per type: the idle one with the smallest id, else the one free
soonest; a pool per type keeps its busy instances in a heap by when they are
free and its idle ones in a heap by id.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from bouncer.admission import Admission, Backlog
from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from bouncer.routing import fill, pick, spill_cap, spill_chunks
from bouncer.variants import AccuracyLedger, Variant, choose_variant
from mark.sim.serverless import SimLambda

UNSERVED, INSTANCE, LAMBDA, FAILED, DECLINED = 0, 1, 2, 3, 4


@dataclass(eq=False, slots=True)
class Server:
    """A serving instance as the engine sees it (kept across fleet changes)."""

    iid: str
    itype: str
    market: str
    role: str
    latency: BatchLatency
    n_batch: int = 1
    w_batch_s: float = 0.0
    served: int = 0
    batches: int = 0
    # Burstable (t3) CPU credits; 1 credit = one vCPU at 100 % for a minute.
    burstable: bool = False
    vcpus: int = 2
    baseline: float = 1.0
    credits: float = math.inf
    earn_per_s: float = 0.0
    max_credits: float = math.inf
    credit_t: float = 0.0
    backlog: Backlog = field(default_factory=Backlog)
    running: deque[Admission] = field(default_factory=deque)  # admitted, not ended, in order
    variants: tuple[Variant, ...] = ()
    """The model's variants on this instance, most accurate first (its own ``latency``);
    empty: one variant, no choice (``bouncer.variants``)."""

    @property
    def instance_id(self) -> str:
        return self.iid

    @property
    def busy_until(self) -> float:
        return self.backlog.busy_until

    def end_batches(self, now: float) -> None:
        """The batches that have ended by ``now`` leave the Bouncer's queue, in order."""
        running = self.running
        while running and running[0].finish <= now:
            done = running.popleft()
            self.backlog.done(done.finish, done)

    def speed_factor(self, now: float, work_s: float) -> float:
        """1 while credits last, 1/baseline after; charges the batch's credits."""
        if not self.burstable:
            return 1.0
        self.credits = min(
            self.max_credits, self.credits + self.earn_per_s * max(0.0, now - self.credit_t)
        )
        self.credit_t = now
        if self.credits > 0:
            self.credits -= work_s * self.vcpus / 60.0
            return 1.0
        return 1.0 / self.baseline  # out of credits: the baseline share of each vCPU


class _Pool:
    """The instances of one type: busy ones by when they are free, idle ones by id."""

    __slots__ = ("busy", "idle")

    def __init__(self) -> None:
        self.busy: list[tuple[float, str, Server]] = []
        self.idle: list[tuple[str, Server]] = []

    def candidate(self, now: float) -> Server:
        """The instance of this type that ``pick`` would choose among them at ``now``."""
        busy, idle = self.busy, self.idle
        while busy and busy[0][0] <= now:
            _, iid, srv = heapq.heappop(busy)
            heapq.heappush(idle, (iid, srv))
        return idle[0][1] if idle else busy[0][2]

    def take(self, srv: Server) -> None:
        """``srv`` (the last candidate) was sent a batch: file it by its new queue state."""
        idle = self.idle
        if idle and idle[0][1] is srv:
            heapq.heappop(idle)
        else:
            heapq.heappop(self.busy)
        heapq.heappush(self.busy, (srv.busy_until, srv.iid, srv))


class Engine:
    def __init__(
        self,
        arrivals: NDArray[np.float64],
        rt_max_s: float,
        lam: SimLambda | None,
        lambda_latency: Callable[[int], float],
        *,
        bouncer: bool = True,
        timeout_s: float | None = None,
        budget: MissBudget | None = None,
        spill_batches: BatchLatency | None = None,
        accuracy_floor: float = 0.0,
        accuracy_window_s: float = 86_400.0,
    ) -> None:
        """``timeout_s``: a response later than this after arrival fails (None: never);
        ``budget``: the SLO's miss budget, spent declining what would spill
        (``bouncer.miss_budget``; None: never decline); ``spill_batches``: the spill
        function's batch latency, which sizes its invocations (``spill_chunks``; None:
        one request each); ``accuracy_floor``: what the variants of servers that have them
        must deliver on average over ``accuracy_window_s`` (``bouncer.variants``)."""
        self.arr = arrivals
        self.rt = rt_max_s
        self.lam = lam
        self.lambda_latency = lambda_latency
        self.spill_batches = spill_batches
        self.accuracy_floor = accuracy_floor
        self.ledger = AccuracyLedger(accuracy_window_s)
        self.primary_accuracy: float | None = None  # set by the first server with variants
        # Per request, the accuracy of the variant that answered it (nan: none did, or
        # the model has no variants).
        self.acc = np.full(arrivals.shape[0], np.nan)
        self._spill_take = spill_cap(spill_batches)
        self.bouncer = bouncer
        self.timeout = math.inf if timeout_s is None else timeout_s
        self.lat = np.full(arrivals.shape[0], np.nan)
        self.where = np.zeros(arrivals.shape[0], dtype=np.int8)
        self.i = 0
        self.t_free = -math.inf
        self._pools: dict[str, _Pool] = {}
        self._max_w = 0.0
        self.budget = budget
        self._counted = 0  # arrivals the budget has been told of

    def set_servers(self, servers: Iterable[Server]) -> None:
        """The instances that serve from now on (booted, not stopped or reclaimed)."""
        self._pools = {}
        self._max_w = 0.0
        for s in servers:
            self._pools.setdefault(s.itype, _Pool()).busy.append((s.busy_until, s.iid, s))
            self._max_w = max(self._max_w, s.w_batch_s)
        for pool in self._pools.values():
            heapq.heapify(pool.busy)

    def servers(self) -> list[Server]:
        """The instances serving now (``set_servers``)."""
        return [s for pool in self._pools.values() for _, _, s in pool.busy]

    def serve_until(self, t_end: float) -> None:
        """Dispatch every request that arrives before ``t_end`` (Unix seconds)."""
        arr = self.arr
        i = self.i
        n_first = int(np.searchsorted(arr, t_end, "left")) - i
        if n_first <= 0:
            return
        j_ext = int(np.searchsorted(arr, t_end + self._max_w + 1e-9, "right"))
        seg: list[float] = arr[i:j_ext].tolist()
        n_seg = len(seg)
        lat: list[float] = [math.nan] * n_seg
        where: list[int] = [UNSERVED] * n_seg
        rt = self.rt
        pools = self._pools
        bouncer = self.bouncer
        timeout = self.timeout
        t_free = self.t_free
        k = 0
        while k < n_first:
            a = seg[k]
            now = a if a > t_free else t_free
            # The instance that would finish one more request soonest.
            srv = pick(now, [pool.candidate(now) for pool in pools.values()])
            if srv is None:
                m = k + 1
                while m < n_seg and m - k < self._spill_take and seg[m] <= now:
                    m += 1
                self._spill(now, seg, range(k, m), lat, where)
                t_free = now
                k = m
                continue
            m, disp = fill(seg, k, n_seg, now, srv.n_batch, srv.w_batch_s)
            t_free = disp
            size = m - k
            latency = srv.latency
            accuracy = math.nan
            if srv.variants:
                if srv.running and srv.running[0].finish <= disp:
                    srv.end_batches(disp)
                chosen = choose_variant(
                    disp,
                    srv.busy_until,
                    [seg[x] + rt for x in range(k, m)],
                    srv.variants,
                    self.ledger,
                    self.accuracy_floor,
                )
                latency, accuracy = chosen.latency, chosen.accuracy
                self.primary_accuracy = srv.variants[0].accuracy
            if srv.burstable:
                factor = srv.speed_factor(disp, latency(size))
                if factor != 1.0:
                    latency = latency.scaled(factor)
            if srv.running and srv.running[0].finish <= disp:
                srv.end_batches(disp)
            if bouncer:
                adm = srv.backlog.offer(disp, [seg[x] + rt for x in range(k, m)], latency)
            else:
                adm = srv.backlog.take(disp, size, latency)
            if adm.admitted:
                fin = adm.finish
                srv.running.append(adm)
                srv.batches += 1
                srv.served += len(adm.admitted)
                late = 0
                for x in adm.admitted:
                    took = fin - seg[k + x]
                    if took > timeout:
                        lat[k + x] = math.inf
                        where[k + x] = FAILED
                        late += 1
                    else:
                        lat[k + x] = took
                        where[k + x] = INSTANCE
                        late += took > rt
                if late and self.budget is not None:
                    self.budget.miss(disp, late)
                if srv.variants:
                    self.ledger.served(disp, accuracy, len(adm.admitted))
                    for x in adm.admitted:
                        self.acc[i + k + x] = accuracy
            if adm.rejected:
                self._spill(disp, seg, [k + x for x in adm.rejected], lat, where)
            pools[srv.itype].take(srv)
            k = m
        self.lat[i : i + k] = lat[:k]
        self.where[i : i + k] = where[:k]
        self.i = i + k
        self.t_free = t_free
        if self.budget is not None:
            self._count_arrivals(i + k, t_end)

    def _count_arrivals(self, upto: int, now: float) -> None:
        """Tell the budget of the arrivals before index ``upto`` not yet counted."""
        if upto > self._counted and self.budget is not None:
            self.budget.arrive(now, upto - self._counted)
            self._counted = upto

    def _spill(
        self,
        now: float,
        seg: list[float],
        idx: Iterable[int],
        lat: list[float],
        where: list[int],
    ) -> None:
        """Spill the requests ``idx`` of ``seg`` at ``now``, less those the miss budget
        declines."""
        todo = list(idx)
        budget = self.budget
        if budget is not None and todo:
            # Every request that has arrived by now counts, as the daemon counts on submit.
            self._count_arrivals(int(np.searchsorted(self.arr, now, "right")), now)
            n = budget.decline(now, len(todo))
            for x in todo[:n]:
                lat[x] = math.inf
                where[x] = DECLINED
            todo = todo[n:]
        missed = 0
        rt = self.rt
        parts = spill_chunks(now, [seg[x] + rt for x in todo], self.spill_batches)
        for part in parts:
            chunk = [todo[c] for c in part]
            end = (
                None
                if self.lam is None
                else self.lam.invoke(now, len(chunk), self.lambda_latency(len(chunk)))
            )
            for x in chunk:
                if end is None:
                    lat[x] = math.inf
                    where[x] = FAILED
                    missed += 1
                else:
                    lat[x] = end - seg[x]
                    where[x] = LAMBDA
                    missed += lat[x] > rt
                    if self.primary_accuracy is not None:  # the model has variants
                        self.acc[self.i + x] = self.primary_accuracy
                        self.ledger.served(now, self.primary_accuracy, 1)
        if missed and budget is not None:
            budget.miss(now, missed)

    def latencies_since(self, start: int) -> NDArray[np.float64]:
        """Latencies of the requests dispatched since index ``start`` (inf = failed)."""
        return self.lat[start : self.i]
