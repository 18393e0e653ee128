"""SLO tracking of paper §4.4: react at once when the recent service level slips.

Predictive plans miss unpredictable surges, so the monitor looks at the last M
requests: if fewer than SL_min of them finished within RT_max, launch L
instances of type T (the paper's default is c5.large: small and quick to boot)
at once, outside the planner.

One miss-streak must not launch twice. After a launch the window is emptied
and, for ``holdoff_s`` (about the backups' boot time), outcomes are not
recorded at all: requests answered while the backups boot say nothing about
whether the backups are enough. The next verdict needs M fresh requests.

While the monitor is in its hold-off after a launch the SLO is known to have
been missed and whether the backups suffice is not known yet: ``slo_at_risk``
says so, and the control loop retires nothing meanwhile (the planner's model
of the fleet is what just failed, so its "not needed" is not to be trusted).

Pure: state in, (action or None, new state) out; ``now`` is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SloMonitorConfig:
    rt_max_s: float
    sl_min: float = 0.98
    window: int = 100
    launch_count: int = 1
    instance_type: str = "c5.large"
    market: str = "on-demand"
    holdoff_s: float = 120.0


@dataclass(frozen=True)
class SloMonitorState:
    outcomes: tuple[bool, ...] = ()
    """Whether each of the last (at most M) requests met RT_max, oldest first."""
    holdoff_until: float = -math.inf


@dataclass(frozen=True)
class BackupLaunch:
    instance_type: str
    market: str
    count: int
    service_level: float
    """Fraction of the window that met RT_max when the launch was decided."""


def observe_latencies(
    state: SloMonitorState,
    latencies_s: Sequence[float],
    now: float,
    config: SloMonitorConfig,
) -> tuple[BackupLaunch | None, SloMonitorState]:
    """Record the latencies of requests finished since the last call."""
    if now < state.holdoff_until:
        return None, state
    outcomes = (state.outcomes + tuple(lat <= config.rt_max_s for lat in latencies_s))[
        -config.window :
    ]
    if len(outcomes) < config.window:
        return None, SloMonitorState(outcomes, state.holdoff_until)
    level = sum(outcomes) / len(outcomes)
    if level >= config.sl_min:
        return None, SloMonitorState(outcomes, state.holdoff_until)
    action = BackupLaunch(config.instance_type, config.market, config.launch_count, level)
    return action, SloMonitorState((), now + config.holdoff_s)


def slo_at_risk(state: SloMonitorState, now: float) -> str | None:
    """Why the fleet must not shrink now (backups launched, not judged yet), or None."""
    if now < state.holdoff_until:
        return f"SLO missed: backups launched, judged again from t={state.holdoff_until:g}"
    return None
