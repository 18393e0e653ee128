"""The Bouncer's admission decision (paper §4.1): admit only what finishes by its deadline.

Pure: the instance's queue state and the profiled batch latency go in, the
decision comes out; times are arguments. The agent calls it for every batch it
is offered, through ``Backlog``, the queue state it keeps; the simulator keeps
the very same ``Backlog`` per instance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: tuple[int, ...]  # indices into the offered deadlines, in the order given
    rejected: tuple[int, ...]
    start: float  # when the admitted batch will start
    finish: float  # when it is expected to finish

    @property
    def size(self) -> int:
        return len(self.admitted)


def admit(
    now: float,
    busy_until: float,
    deadlines: Sequence[float],
    batch_latency: Callable[[int], float],
) -> Admission:
    """Admit the largest set of requests that, run as one batch after the queue, all make it.

    ``busy_until`` is when the work already accepted will be done; ``batch_latency(b)``
    is the profiled T_b. A batch of k finishes at ``start + T_k``; the k requests
    with the latest deadlines are the ones most able to wait, so the answer is
    the largest k whose k-th latest deadline is still ≥ that finish time.
    Rejected requests go to Lambda at once, while they still have time.
    """
    start = max(now, busy_until)
    order = sorted(range(len(deadlines)), key=lambda i: deadlines[i], reverse=True)
    for k in range(len(order), 0, -1):
        finish = start + batch_latency(k)
        if deadlines[order[k - 1]] >= finish:
            chosen = set(order[:k])
            return Admission(
                admitted=tuple(i for i in range(len(deadlines)) if i in chosen),
                rejected=tuple(i for i in range(len(deadlines)) if i not in chosen),
                start=start,
                finish=finish,
            )
    return Admission((), tuple(range(len(deadlines))), start, start)


@dataclass(slots=True)
class Backlog:
    """The Bouncer's queue state on one instance: the batches admitted and not finished.

    ``busy_until`` is a prediction. An admitted batch moves it to the batch's
    predicted finish; when a batch ends it is set again to that moment plus the
    profiled time of the batches still queued, so a batch that overran pushes
    back the queue behind it and later offers are judged against when the
    instance will really be free. (In the simulator a batch takes exactly its
    profiled time, so ending it there changes nothing.)
    """

    busy_until: float = 0.0
    depth: int = 0  # requests admitted and not finished
    queued_s: float = 0.0  # profiled time of the admitted batches not finished

    def offer(
        self, now: float, deadlines: Sequence[float], batch_latency: Callable[[int], float]
    ) -> Admission:
        """The Bouncer's verdict on a batch offered ``now``; what it admits joins the queue."""
        decision = admit(now, self.busy_until, deadlines, batch_latency)
        if decision.admitted:
            self._queue(decision)
        return decision

    def take(self, now: float, size: int, batch_latency: Callable[[int], float]) -> Admission:
        """Queue a whole batch without asking the Bouncer (an instance that has none)."""
        start = max(now, self.busy_until)
        decision = Admission(tuple(range(size)), (), start, start + batch_latency(size))
        self._queue(decision)
        return decision

    def _queue(self, decision: Admission) -> None:
        self.busy_until = decision.finish
        self.depth += len(decision.admitted)
        self.queued_s += decision.finish - decision.start

    def done(self, now: float, decision: Admission) -> None:
        """An admitted batch ended at ``now``: the queue behind it is as late (or early) as it."""
        self.depth -= len(decision.admitted)
        self.queued_s -= decision.finish - decision.start
        if self.depth == 0:
            self.queued_s = 0.0
        self.busy_until = now + self.queued_s
