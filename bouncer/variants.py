"""Which variant of a model serves a batch, under the model's accuracy floor.

A model may come in variants (architectures, distillations, quantizations), each with its
accuracy on the user's validation set. The user states a floor: the accuracy the model
must deliver, averaged over the requests of the SLO's period. RAMSIS (Mendoza et al.)
showed that choosing the variant per batch, the accurate one in lulls and faster ones in
bursts, meets a floor with fewer workers than switching on load alone; INFaaS (Romero et
al., ATC '21) that users state accuracy and latency, not a model.

The rule (``choose_variant``): a batch goes on the most accurate variant that may serve
it (a request's own floor, ``X-Mark-Accuracy-Floor``, rules out those below it) whenever
that finishes by the batch's earliest deadline; else on the most accurate faster one
that does, as long as the accuracy delivered over the window, this batch counted, stays
at or above the floor; else on the most accurate (its Bouncer rejects what it cannot
finish and that spills, as without variants). A pinned batch goes on its variant.

``AccuracyLedger`` keeps what was delivered: Σ accuracy × requests and the requests,
over the last ``window_s`` in buckets, like the miss budget (``bouncer.miss_budget``).
A batch counts when it is sent, so batches chosen at once cannot together take the
window below the floor; one its agent moves to the fallback, or rejects, is counted
again as it runs.
Each frontend keeps its own, counted on its own requests: if each delivers at least the
floor, so does the cluster. Pure state: times are arguments. The dispatcher keeps one
per model on the wall clock, the simulator's engine one per run on virtual time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bouncer.latency import BatchLatency
from bouncer.routing import finish_if_sent

BUCKET_S = 10.0


@dataclass(frozen=True)
class Variant:
    """One variant as the rule sees it: its name, its accuracy (0–1) and its batch
    latency on the instance at hand."""

    name: str
    accuracy: float
    latency: BatchLatency


@dataclass
class AccuracyLedger:
    """The accuracy delivered over the last ``window_s``: Σ accuracy × requests and the
    requests, in buckets of ``BUCKET_S``."""

    window_s: float = 86_400.0
    _buckets: deque[tuple[float, float, int]] = field(default_factory=deque)
    _sum: float = 0.0
    _n: int = 0

    def _drop(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] <= now - self.window_s:
            _, s, n = self._buckets.popleft()
            self._sum -= s
            self._n -= n

    def served(self, now: float, accuracy: float, requests: int) -> None:
        """``requests`` sent to (or answered by) a variant of ``accuracy``; a negative
        count takes back what was counted (a batch that ran elsewhere after all)."""
        if requests == 0:
            return
        self._drop(now)
        start = now - now % BUCKET_S
        if self._buckets and self._buckets[-1][0] == start:
            _, s, n = self._buckets.pop()
            self._buckets.append((start, s + accuracy * requests, n + requests))
        else:
            self._buckets.append((start, accuracy * requests, requests))
        self._sum += accuracy * requests
        self._n += requests

    def delivered(self, now: float) -> float | None:
        """The mean accuracy over the window; None before any request."""
        self._drop(now)
        return self._sum / self._n if self._n else None

    def allows(self, now: float, accuracy: float, requests: int, floor: float) -> bool:
        """Whether ``requests`` more at ``accuracy`` keep the window at or above ``floor``."""
        self._drop(now)
        n = self._n + requests
        return n > 0 and (self._sum + accuracy * requests) / n >= floor - 1e-12


def choose_variant(
    now: float,
    busy_until: float,
    deadlines: Sequence[float],
    variants: Sequence[Variant],
    ledger: AccuracyLedger,
    floor: float,
    *,
    pinned: str | None = None,
    request_floor: float = 0.0,
) -> Variant:
    """The variant that serves a batch with ``deadlines`` sent ``now`` to an instance busy
    until ``busy_until`` (module docstring). ``variants`` are those the instance has
    loaded, most accurate first; ``pinned`` one of them by name; ``request_floor`` the
    highest floor a request of the batch asked for (variants below it are not used)."""
    if pinned is not None:
        return next(v for v in variants if v.name == pinned)
    allowed = [v for v in variants if v.accuracy >= request_floor - 1e-12] or list(variants[:1])
    best = allowed[0]
    n = len(deadlines)
    due = min(deadlines)
    if finish_if_sent(now, busy_until, best.latency(n)) <= due:
        return best
    for v in allowed[1:]:
        if finish_if_sent(now, busy_until, v.latency(n)) <= due and ledger.allows(
            now, v.accuracy, n, floor
        ):
            return v
    return best


def fallback_for(
    now: float,
    chosen: Variant,
    variants: Sequence[Variant],
    ledger: AccuracyLedger,
    floor: float,
    requests: int,
    *,
    request_floor: float = 0.0,
) -> Variant | None:
    """The variant an agent may run a batch of ``requests`` on instead of ``chosen`` if
    that would end it late: the most accurate faster one that the batch's requests accept
    and the floor allows (``variants`` most accurate first); None if there is none."""
    for v in variants:
        if (
            v.accuracy < chosen.accuracy
            and v.accuracy >= request_floor - 1e-12
            and v.latency(requests) < chosen.latency(requests)
            and ledger.allows(now, v.accuracy, requests, floor)
        ):
            return v
    return None
