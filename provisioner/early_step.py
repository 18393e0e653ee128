"""When to plan before the next P_u: the load has left what the last plan was made for.

A control step plans every P_u (60 s) from the forecast. A rise nobody foresaw
(day 10 of the Twitter archive has two, at 00:02 and 05:02, that no past day
announces) is met by spill until instances boot, and a rise that begins just
after a step waits up to P_u more before anything is bought: on EC2's 120 s
boot that is up to a third of the time the rise is spilled. So between steps
the shell asks ``plan_early`` on each closed P_s window: once ``EARLY_WINDOWS``
windows in a row, all closed after the last plan, ran above the rate that plan
was made for (its clipped forecast with foreseen rises, for the step under
way) by more than counting noise, the shell runs the model's step at once.

The step is the ordinary one: the load history slides with ``now``
(``mark.control.history``), so its latest "minute" holds the windows that
triggered it, and the forecaster, clip, capacity target, planner, guards and
rails decide as they would at the next boundary, only earlier. Nothing is
bought on the trigger itself, and the forecast is not raised to the load just
seen: holding the steps before the next regular one at that level bought more
spot capacity in time but more on-demand p2.xlarge than the rises repaid
(Inception-v3, Twitter days 10 and 12: −1.1 % spot, +1.3 % on demand against
the early step alone; ``experiments/table5/README.md``). Each early step is
itself a plan, so the next trigger needs ``EARLY_WINDOWS`` new windows above
the new plan's rate: at most one early step per ``EARLY_WINDOWS`` windows, only
while the load keeps outrunning the forecast, and none in the window before a
regular step. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EARLY_WINDOWS = 2
"""Consecutive P_s windows above the planned rate before planning early. One window
above a forecast of the minute's *highest* window is what a forecast that is right
half the time allows; two in a row above it by ``NOISE_Z`` counting sd are not."""

NOISE_Z = 2.0
"""How far above the planned rate a window must run, in Poisson counting sd."""


@dataclass(frozen=True)
class Window:
    """One closed P_s window: when it began, how long it was, the requests per second."""

    start: float
    seconds: float
    rate: float


def above_plan(rate: float, planned_rps: float, window_s: float) -> bool:
    """Whether a window's rate exceeds the planned rate by more than counting noise:
    the count beyond ``planned·P_s + z·sqrt(planned·P_s)``."""
    expected = planned_rps * window_s
    return rate * window_s > expected + NOISE_Z * math.sqrt(max(expected, 1.0))


def plan_early(
    windows: Sequence[Window],
    planned_rps: float,
    planned_at: float,
    now: float,
    next_step_at: float = math.inf,
) -> str | None:
    """Why to plan now, or None. ``windows`` are the model's P_s windows (any order),
    ``planned_rps`` the rate the last plan was made for (``ModelControl.planned_rps``),
    ``planned_at`` when it was made, ``next_step_at`` when the control loop's next step
    is due (within a window of it, that step plans)."""
    if not math.isfinite(planned_at) or not math.isfinite(planned_rps):
        return None  # no plan yet: the first step is the control loop's
    fresh = sorted(
        (w for w in windows if w.start >= planned_at and w.start + w.seconds <= now + 1e-9),
        key=lambda w: w.start,
    )[-EARLY_WINDOWS:]
    if len(fresh) < EARLY_WINDOWS or next_step_at - now < fresh[-1].seconds:
        return None
    if not all(above_plan(w.rate, planned_rps, w.seconds) for w in fresh):
        return None
    rates = ", ".join(f"{w.rate:.1f}" for w in fresh)
    return (
        f"the last {len(fresh)} windows ran at {rates} r/s, above the "
        f"{planned_rps:.1f} r/s planned {now - planned_at:.0f} s ago"
    )
