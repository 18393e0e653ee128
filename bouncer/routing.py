"""The data plane's routing rule: which instance a batch goes to, what it takes, when it goes.

Every request carries its deadline (arrival + RT_max). The oldest waiting
request opens a batch and picks the instance that would finish it soonest
(``pick``); the batch takes what is already waiting at once, then waits for
more until it holds that instance's N_batch or W_batch has passed since the
request that opened it arrived (``window_end``, ``due_at``) — a batch never
waits longer. What the instance's Bouncer rejects, and everything when there is
no instance, goes to Lambda, grouped into invocations by ``spill_chunks``.

Pure: times are arguments, nothing here reads a clock or does I/O. The
dispatcher (``mark.serve.dispatcher``) applies the rule online, on the wall
clock, to requests as they come; the simulator's engine (``mark.sim.engine``)
applies the same functions on virtual time, with the arrivals known ahead
(``fill``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from bouncer.latency import BatchLatency


class Routable(Protocol):
    """An instance as the router sees it."""

    @property
    def instance_id(self) -> str: ...

    @property
    def busy_until(self) -> float: ...

    @property
    def latency(self) -> Callable[[int], float]: ...


R = TypeVar("R", bound=Routable)


def finish_if_sent(now: float, busy_until: float, batch_time_s: float) -> float:
    """When an instance busy until ``busy_until`` finishes a batch sent ``now`` that takes
    ``batch_time_s``."""
    return (busy_until if busy_until > now else now) + batch_time_s


ALLOWANCE_RISE = 0.5
"""How far one late batch moves the allowance toward its lateness: fast, since an
allowance too small sends requests past RT_max."""
ALLOWANCE_DECAY = 0.02
"""How far one batch on time moves it back down: slowly, so a burst of on-time
batches does not forget the hop's tail."""


def allowance_after(allowance_s: float, late_s: float, cap_s: float) -> float:
    """An instance's transport allowance after one batch's result reached the frontend
    ``late_s`` after the finish its Bouncer predicted.

    The Bouncer admits a request whose batch it predicts to end by the deadline it
    is given; the result still has to travel back, and a busy machine runs a batch
    a little past its profile. So the frontend hands the Bouncer each deadline less
    this allowance: an asymmetric moving average of how late results come back
    (up fast, down slowly), between 0 and ``cap_s``. In the simulator a batch ends
    exactly when predicted, so the allowance stays 0 there.
    """
    late = min(max(late_s, 0.0), cap_s)
    rate = ALLOWANCE_RISE if late > allowance_s else ALLOWANCE_DECAY
    return allowance_s + rate * (late - allowance_s)


def pick(now: float, backends: Iterable[R]) -> R | None:
    """The instance that would finish one more request sent ``now`` soonest; a tie goes
    to the smaller instance id. ``None`` when there is none (the batch spills)."""
    best: R | None = None
    best_f = 0.0
    for b in backends:
        f = finish_if_sent(now, b.busy_until, b.latency(1))
        if best is None or f < best_f or (f == best_f and b.instance_id < best.instance_id):
            best, best_f = b, f
    return best


def window_end(first_arrival: float, w_batch_s: float) -> float:
    """When a batch is due at the latest: W_batch after its oldest request arrived."""
    return first_arrival + w_batch_s


def due_at(now: float, window_end: float) -> float:
    """When a batch still short of N_batch at ``now`` goes: at its window's end, or at
    once if that has passed. Until then it takes each request that arrives."""
    return now if now > window_end else window_end


def fill(
    arrivals: Sequence[float],
    first: int,
    end: int,
    now: float,
    n_batch: int,
    w_batch_s: float,
) -> tuple[int, float]:
    """The rule with the arrivals known ahead (sorted; ``arrivals[:end]`` known).

    Request ``first`` opens a batch at ``now`` (≥ its arrival); the batch takes
    ``arrivals[first:stop]`` and is dispatched at the returned time: when it
    holds N_batch (at the arrival of the last one, or ``now`` if all were
    waiting), else at ``due_at(now, window_end(...))``. Returns ``(stop, time)``.
    """
    last = due_at(now, window_end(arrivals[first], w_batch_s))
    stop = first + 1
    while stop < end and stop - first < n_batch and arrivals[stop] <= last:
        stop += 1
    if stop - first >= n_batch:
        a = arrivals[stop - 1]
        return stop, a if a > now else now
    return stop, last


def spill_cap(latency: BatchLatency | None) -> int:
    """The most requests one spill invocation takes: the largest batch the function's
    latency was measured at (beyond it the curve is a guess), one without a curve."""
    return 1 if latency is None else latency.points[-1][0]


def spill_chunks(
    now: float, deadlines: Sequence[float], latency: BatchLatency | None
) -> list[list[int]]:
    """The invocations that spill the requests with ``deadlines`` at ``now``: indices into
    ``deadlines``, each chunk one invocation.

    Lambda bills an invocation by its duration × memory plus a fee, so a batch costs less
    per request than its requests apart wherever the function's batch latency ``latency``
    (measured at its memory size) grows slower than the batch (INFless, ASPLOS '22). In
    deadline order, a chunk grows while the function still finishes it by its earliest
    deadline, while one more request costs it no more time than an invocation of its
    own (so a chunk is never dearer than its requests apart), and up to ``spill_cap``.
    A request that misses even alone goes alone. Without a curve every request is its
    own invocation, side by side, as Lambda scales out per concurrent request.
    """
    order = sorted(range(len(deadlines)), key=deadlines.__getitem__)
    if latency is None:
        return [[i] for i in order]
    cap = spill_cap(latency)
    alone = latency(1)
    chunks: list[list[int]] = []
    s = 0
    while s < len(order):
        due = deadlines[order[s]]
        k = 1
        while (
            k < cap
            and s + k < len(order)
            and now + latency(k + 1) <= due
            and latency(k + 1) <= latency(k) + alone
        ):
            k += 1
        chunks.append(order[s : s + k])
        s += k
    return chunks
