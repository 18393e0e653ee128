"""The Bouncer's admission decision (paper §4.1): admit only what finishes by its deadline.

Pure: the instance's queue state and the profiled batch latency go in, the
decision comes out. The agent calls it for every batch it is offered; the
simulator calls the very same function.
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
