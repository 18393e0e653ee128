"""The request-level serving engine: the daemon's dispatcher and Bouncer on virtual time.

It replays the dispatcher's batching rule (``mark.dispatcher``) request by
request: the oldest request picks the instance that would finish it soonest;
a batch for that instance fills until N_batch or until W_batch has passed
since that request arrived; the instance's Bouncer (``bouncer.admission.admit``,
the very function the agent calls) admits what it can finish by the deadline;
the rest spill at once to the simulated Lambda in chunks of ``SPILL_CHUNK``.
Without a Bouncer (SageMaker-style serving, the no-Lambda ablation) an
instance queues everything it is sent.

The loop is written for speed (5.5 M requests a day): arrivals are read in
slices, instances of one type sit in a heap by when they are free, and
results go to two numpy arrays (latency, and where each request was served).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bouncer.admission import admit
from bouncer.latency import BatchLatency
from mark.dispatcher import SPILL_CHUNK
from mark.sim.serverless import SimLambda

UNSERVED, INSTANCE, LAMBDA, FAILED = 0, 1, 2, 3


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
    busy_until: float = 0.0
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


class Engine:
    def __init__(
        self,
        arrivals: NDArray[np.float64],
        rt_max_s: float,
        lam: SimLambda | None,
        lambda_latency: Callable[[int], float],
        *,
        bouncer: bool = True,
    ) -> None:
        self.arr = arrivals
        self.rt = rt_max_s
        self.lam = lam
        self.lambda_latency = lambda_latency
        self.bouncer = bouncer
        self.lat = np.full(arrivals.shape[0], np.nan)
        self.where = np.zeros(arrivals.shape[0], dtype=np.int8)
        self.i = 0
        self.t_free = -math.inf
        self._heaps: list[tuple[float, list[tuple[float, int, Server]]]] = []
        self._max_w = 0.0
        self._seq = 0

    def set_servers(self, servers: Iterable[Server]) -> None:
        """The instances that serve from now on (booted, not stopped or reclaimed)."""
        by_type: dict[str, list[tuple[float, int, Server]]] = {}
        for s in servers:
            self._seq += 1
            by_type.setdefault(s.itype, []).append((s.busy_until, self._seq, s))
        self._heaps = []
        self._max_w = 0.0
        for heap in by_type.values():
            heapq.heapify(heap)
            srv = heap[0][2]
            self._heaps.append((srv.latency(1), heap))
            self._max_w = max(self._max_w, srv.w_batch_s)

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
        heaps = self._heaps
        bouncer = self.bouncer
        t_free = self.t_free
        k = 0
        while k < n_first:
            a = seg[k]
            now = a if a > t_free else t_free
            # The instance that would finish one more request soonest.
            best_f = math.inf
            best_heap: list[tuple[float, int, Server]] | None = None
            for t1, heap in heaps:
                b = heap[0][0]
                f = (b if b > now else now) + t1
                if f < best_f:
                    best_f, best_heap = f, heap
            if best_heap is None:
                m = k + 1
                while m < n_seg and m - k < SPILL_CHUNK and seg[m] <= now:
                    m += 1
                self._spill(now, seg, range(k, m), lat, where)
                t_free = now
                k = m
                continue
            srv = best_heap[0][2]
            nb = srv.n_batch
            m = k + 1
            if nb > 1:
                wend = a + srv.w_batch_s
                lim = now if now > wend else wend
                while m < n_seg and m - k < nb and seg[m] <= lim:
                    m += 1
                if m - k == nb:
                    last = seg[m - 1]
                    disp = last if last > now else now
                else:
                    disp = lim
            else:
                disp = now
            t_free = disp
            size = m - k
            latency = srv.latency
            if srv.burstable:
                factor = srv.speed_factor(disp, latency(size))
                if factor != 1.0:
                    latency = latency.scaled(factor)
            if bouncer:
                adm = admit(disp, srv.busy_until, [seg[x] + rt for x in range(k, m)], latency)
                if adm.admitted:
                    fin = adm.finish
                    srv.busy_until = fin
                    srv.batches += 1
                    srv.served += len(adm.admitted)
                    for x in adm.admitted:
                        lat[k + x] = fin - seg[k + x]
                        where[k + x] = INSTANCE
                if adm.rejected:
                    self._spill(disp, seg, [k + x for x in adm.rejected], lat, where)
            else:
                start = srv.busy_until if srv.busy_until > disp else disp
                fin = start + latency(size)
                srv.busy_until = fin
                srv.batches += 1
                srv.served += size
                for x in range(k, m):
                    lat[x] = fin - seg[x]
                    where[x] = INSTANCE
            heapq.heapreplace(best_heap, (srv.busy_until, best_heap[0][1], srv))
            k = m
        self.lat[i : i + k] = lat[:k]
        self.where[i : i + k] = where[:k]
        self.i = i + k
        self.t_free = t_free

    def _spill(
        self,
        now: float,
        seg: list[float],
        idx: Iterable[int],
        lat: list[float],
        where: list[int],
    ) -> None:
        todo = list(idx)
        for c in range(0, len(todo), SPILL_CHUNK):
            chunk = todo[c : c + SPILL_CHUNK]
            end = (
                None
                if self.lam is None
                else self.lam.invoke(now, len(chunk), self.lambda_latency(len(chunk)))
            )
            for x in chunk:
                if end is None:
                    lat[x] = math.inf
                    where[x] = FAILED
                else:
                    lat[x] = end - seg[x]
                    where[x] = LAMBDA

    def latencies_since(self, start: int) -> NDArray[np.float64]:
        """Latencies of the requests dispatched since index ``start`` (inf = failed)."""
        return self.lat[start : self.i]
