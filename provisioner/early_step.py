"""When to plan before the next P_u: the load has left what the last plan was made for.

A control step plans every P_u (60 s) from the forecast. A rise nobody foresaw
(day 10 of the Twitter archive has two, at 00:02 and 05:02, that no past day
announces) is met by spill until instances boot, and a rise that begins just
after a step waits up to P_u more before anything is bought: on EC2's 120 s
boot that is up to a third of the time the rise is spilled. So between steps
the shell asks ``plan_early`` on each closed P_s window: once ``EARLY_WINDOWS``
windows in a row, all begun since the last plan, ran above the rate that plan
was made for (its clipped forecast with foreseen rises, for the step under
way) and above what the fleet carries, booting instances included, by more
than counting noise, the shell runs the model's step at once.

Only while the model's spill is measured to answer within RT_max: then a
shortfall is spilled requests, each paid at Lambda's price, and planning early
saves them. Where spill misses RT_max (NASNet's and OpenNMT-ende's spill takes
2.2 s and 3.1 s), a shortfall is misses, and the SLO monitor launches backups
within seconds of them; early steps there cost 0.2–0.7 % more on Table 5's
windows for no saving the SLO needed (NASNet, Twitter days 10 and 12, seed 0:
+0.7 % and +0.5 %, 99.97 % within RT_max on day 12 either way; OpenNMT-ende
+0.2 %; git history of experiments/table5/README.md, 2026-11-26).

The step is the ordinary one: the load history slides with ``now``
(``mark.control.history``), so its latest "minute" holds the windows that
triggered it, and the forecaster, clip, capacity target, planner, guards and
rails decide as they would at the next boundary, only earlier. Nothing is
bought on the trigger itself, and the forecast is not raised to the load just
seen: holding the steps before the next regular one at that level bought more
spot capacity in time but more on-demand p2.xlarge than the rises repaid
(Inception-v3, Twitter days 10 and 12: −1.1 % spot, +1.3 % on demand against
the early step alone; git history of experiments/table5/README.md, 2026-11-26).
Each early step is itself a plan, so the next trigger
needs ``EARLY_WINDOWS`` new windows above the new plan's rate: at most one early
step per ``EARLY_WINDOWS`` windows, only while the load keeps outrunning the
forecast, and none in the window before a regular step. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from provisioner.control_state import ControlState, Snapshot, StepConfig, counted_members
from provisioner.pooling import capacity_in_pool
from provisioner.rise_headroom import planning_options, pools

EARLY_WINDOWS = 2
"""Consecutive P_s windows above the planned rate before planning early. One window
above a forecast of the minute's *highest* window is what a forecast that is right
half the time allows; two in a row above it by ``NOISE_Z`` counting sd are not."""

NOISE_Z = 2.0
"""How far above the planned rate a window must run, in Poisson counting sd."""


@dataclass(frozen=True)
class Window:
    """One P_s window: when it began, how long it was, the requests per second. Only
    windows closed by ``now`` and begun since the last plan (which saw none of them)
    count."""

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
    capacity_rps: float = 0.0,
    spill_in_time: bool = True,
) -> str | None:
    """Why to plan now, or None. ``windows`` are the model's P_s windows (any order),
    ``planned_rps`` the rate the last plan was made for (``ModelControl.planned_rps``),
    ``planned_at`` when it was made, ``next_step_at`` when the control loop's next step
    is due (within a window of it, that step plans), ``capacity_rps`` what the fleet
    carries (``fleet_capacity``; 0: not known yet): the load must outrun both;
    ``spill_in_time``: the model's spill is measured to answer within RT_max
    (``SpillEvidence.in_time``)."""
    if not spill_in_time:
        return None  # a shortfall is misses: the SLO monitor's to answer, within seconds
    if not math.isfinite(planned_at) or not math.isfinite(planned_rps):
        return None  # no plan yet: the first step is the control loop's
    fresh = sorted(
        (w for w in windows if w.start >= planned_at and w.start + w.seconds <= now + 1e-9),
        key=lambda w: w.start,
    )[-EARLY_WINDOWS:]
    if len(fresh) < EARLY_WINDOWS or next_step_at - now < fresh[-1].seconds:
        return None
    if not all(above_plan(w.rate, max(planned_rps, capacity_rps), w.seconds) for w in fresh):
        return None
    rates = ", ".join(f"{w.rate:.1f}" for w in fresh)
    return (
        f"the last {len(fresh)} windows ran at {rates} r/s, above the "
        f"{planned_rps:.1f} r/s planned {now - planned_at:.0f} s ago"
        + (f" and the fleet's {capacity_rps:.1f} r/s" if capacity_rps > 0 else "")
    )


def fleet_capacity(snap: Snapshot, state: ControlState, cfg: StepConfig) -> float:
    """What the model's live serving and backup instances carry as the planner rates
    them, booting ones included (the last plan counted on them), less those with a spot
    notice and those failing their probe."""
    by_key = {o.key: o for o in planning_options(snap, cfg)}
    serving = [m for m in counted_members(snap, state) if m.key in by_key]
    n = len(serving)
    pooled = pools(snap, cfg)
    return sum(
        capacity_in_pool(by_key[m.key], n) if pooled else by_key[m.key].capacity_rps
        for m in serving
    )
