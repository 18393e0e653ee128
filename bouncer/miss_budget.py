"""The SLO's miss budget, spent where it saves the most: decline rather than pay Lambda.

An SLO of SL_min within RT_max allows ``1 − SL_min`` of the requests to miss. The
requests the instances cannot finish in time go to Lambda, the dearest capacity
mark buys (Inception-v3: about 4× a fully used p2.xlarge per request), and the
planner already buys instances wherever they are cheaper. So a request it is
cheapest to let miss is exactly one about to be spilled: declining it (an
explicit error at once, which the client may retry) saves Lambda's whole price
and costs one miss. Everything else about serving is unchanged.

The rule keeps the misses of the SLO's period, the last ``window_s`` (every miss:
declined, late or failed), within the allowance ``A = (1 − SL_min)·arrived`` on the
requests that arrived in it, less a reserve for the misses nobody chooses (a batch that
overruns, a cold Lambda past RT_max): one more request may be declined while
``missed + 1 ≤ A − max((1 − share)·A, involuntary)``, ``involuntary`` being the window's
misses that were not declines. The reserve is a fixed part of the allowance, or as many
misses again as nobody chose so far, whichever is more: those are counted only once
they happen (after a window's last decline, they push it over), and where they are
many, more are likely. Over any run cut into windows, each window's declines keep that
window within the allowance less its reserve, so the whole run is too, plus the
involuntary misses that came after a window's last decline.

Pure state, like ``bouncer.admission.Backlog``: times are arguments. The
dispatcher keeps one per model on the wall clock, the simulator's engine one per
run on virtual time, and both ask ``declinable`` before each spill.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

DECLINED_MARK = "declined:"
"""How a declined request's error starts, wherever it is reported (a client can match it)."""

DECLINED_ERROR = (
    f"{DECLINED_MARK} no instance could answer within RT_max, and the SLO's miss budget "
    "(slo.decline_share) covers this request; retry"
)
"""The explicit error a declined request is answered with."""

BUCKET_S = 10.0
"""The counts are kept in buckets of this many seconds; the window drops whole buckets."""

DEFAULT_SHARE = 0.0
"""Declines are opt-in: a user who asked for 98 % of requests within RT_max did not ask
to have any refused, and no baseline refuses one. A model that sets ``slo.decline_share``
(0.9: nine tenths of the allowance, a tenth or the involuntary misses again kept for the
misses nobody chooses) trades refused requests for Lambda charges; what that saves and
how many it refuses is measured in ``experiments/windows``."""

DEFAULT_PERIOD_S = 86_400.0
"""The SLO's period, over which SL_min is kept (``slo.period_s``): a day by default.

A rise that outruns the instances booting for it comes a few times a day, and each
spills a few minutes of load: with an hourly period each could decline only 1.5 % of
its own hour, and the rest went to Lambda at about four times an instance's price,
while the day's misses stayed well inside the allowance (Inception-v3 on Twitter
day 10: 98.8 % within RT_max where 98 % is asked; with a day's period mark cost $13.06
there instead of $13.20; git history of experiments/table5/README.md, 2026-11-26).
A day is still far shorter than the 28–30 days SLOs are usually kept over; a user
whose dashboard reads an hour sets ``period_s: 3600``."""

RECENT_S = 3600.0
"""What ``tally`` reports: the last hour's misses, what the planner may still leave to
miss in the rises it plans for (``provisioner.rise_headroom``), whatever the period."""


class MissTally(NamedTuple):
    """The arrivals and misses the planner is told of (``MissBudget.count``): the last
    hour's (``RECENT_S``), and the SLO's period's, on which SL_min is judged."""

    arrived: int
    missed: int
    period_arrived: int = 0
    period_missed: int = 0

    def merged(self, other: MissTally) -> MissTally:
        """Two frontends' tallies together (each counts the requests it took)."""
        return MissTally(*(a + b for a, b in zip(self, other, strict=True)))


NO_TALLY = MissTally(0, 0)
"""Nothing measured yet."""


def declinable(arrived: int, missed: int, sl_min: float, share: float, *, involuntary: int) -> int:
    """How many more requests may be declined with ``arrived`` requests and ``missed``
    misses counted, ``involuntary`` of them not declines:
    ``⌊A − max((1 − share)·A, involuntary)⌋ − missed`` with ``A = (1 − SL_min)·arrived``,
    at least 0."""
    if share <= 0.0 or arrived <= 0:
        return 0
    allowance = (1.0 - sl_min) * arrived
    reserve = max((1.0 - share) * allowance, float(involuntary))
    return max(0, math.floor(allowance - reserve + 1e-9) - missed)


@dataclass(slots=True)
class MissBudget:
    """The arrivals and misses of the last ``window_s``, and how many may be declined now."""

    sl_min: float
    share: float
    window_s: float = DEFAULT_PERIOD_S
    arrived: int = 0
    missed: int = 0
    declined: int = 0  # of ``missed``, the window's declines
    declined_total: int = 0
    # One per BUCKET_S, oldest first: [start, arrived, missed, declined].
    _buckets: deque[list[float]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be within [0, 1], got {self.share}")
        if not 0.0 < self.sl_min <= 1.0:
            raise ValueError(f"sl_min must be within (0, 1], got {self.sl_min}")

    def _bucket(self, now: float) -> list[float]:
        start = now - now % BUCKET_S
        b = self._buckets
        if not b or b[-1][0] < start:
            b.append([start, 0.0, 0.0, 0.0])
        horizon = now - self.window_s
        while b and b[0][0] + BUCKET_S <= horizon:
            _, a, m, d = b.popleft()
            self.arrived -= int(a)
            self.missed -= int(m)
            self.declined -= int(d)
        return b[-1]

    def arrive(self, now: float, n: int = 1) -> None:
        """``n`` requests arrived at ``now``."""
        self._bucket(now)[1] += n
        self.arrived += n

    def miss(self, now: float, n: int = 1) -> None:
        """``n`` requests missed RT_max (late or failed), known at ``now``."""
        self._bucket(now)[2] += n
        self.missed += n

    def declinable(self, now: float) -> int:
        """How many requests may be declined at ``now``."""
        self._bucket(now)
        return declinable(
            self.arrived,
            self.missed,
            self.sl_min,
            self.share,
            involuntary=self.missed - self.declined,
        )

    def tally(self, now: float, span_s: float = RECENT_S) -> tuple[int, int]:
        """(arrived, missed) over the last ``span_s`` (at most the period) ending at ``now``:
        what the planner may still leave to miss (``provisioner.rise_headroom.rise_allowance``)."""
        self._bucket(now)
        if span_s >= self.window_s:
            return self.arrived, self.missed
        arrived = missed = 0.0
        horizon = now - span_s
        for start, a, m, _ in reversed(self._buckets):
            if start + BUCKET_S <= horizon:
                break
            arrived += a
            missed += m
        return int(arrived), int(missed)

    def count(self, now: float) -> MissTally:
        """The last hour's ``tally`` and the period's: what the planner is told."""
        hour = self.tally(now)
        return MissTally(hour[0], hour[1], self.arrived, self.missed)

    def decline(self, now: float, wanted: int) -> int:
        """Decline up to ``wanted`` requests at ``now``; returns how many: each is a miss."""
        n = min(wanted, self.declinable(now))
        if n > 0:
            self.miss(now, n)
            self._buckets[-1][3] += n
            self.declined += n
            self.declined_total += n
        return n
