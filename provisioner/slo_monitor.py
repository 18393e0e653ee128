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

from provisioner.greedy import PlannerOption


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
    sized_rps: float = 0.0
    """The load the backups of this hold-off were sized to (``provisioner.backup_step``);
    kept in memory only: after a restart the first top-up looks at the fleet again."""


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


def backup_offering(
    options: Sequence[PlannerOption], instance_type: str | None = None
) -> tuple[str, str] | None:
    """The backups' offering, (type, market): of the offerings that serve the model within
    the SLO (``options``: in the markets its plans may buy, less those avoided now), the
    one with the lowest hourly price; of the configured ``instance_type``'s only, if set
    (on demand if it has none). None: nothing can serve.

    A backup is bought on a miss streak of unknown size and cause, boots in minutes,
    and is retired by the next plans once the streak is over; what it costs is its
    price times the time it is kept, so the smallest commitment wins. Measured on the
    Table 5 window (Inception-v3, Twitter day 10, 8 h): backups of the type cheapest
    per request instead (p2.xlarge) took mark from $15.52 to $19.07 and mark-spot from
    $7.66 to $13.86, with Lambda's share unchanged. Where the plans may buy spot, so
    may the backups: they live minutes, and an offering out of capacity is avoided and
    the next one taken (``Controller.check_slo``). Measured with spot backups
    (mark-spot, seed 0, 8 h): NASNet on the ``mmpp`` trace $108.82 -> $95.68 at the same
    98.25 % within RT_max, Inception-v3 on ``mmpp`` $10.90 -> $10.47.
    """
    serving = [o for o in options if o.capacity_rps > 0]
    if instance_type is not None:
        mine = [o for o in serving if o.instance_type == instance_type]
        if not mine:
            return instance_type, "on-demand"
        serving = mine
    if not serving:
        return None
    best = min(serving, key=lambda o: (o.price_per_hour, o.market != "on-demand", o.instance_type))
    return best.key


def backup_count(shortfall_rps: float, backup_rps: float, at_least: int) -> int:
    """How many backups to launch: enough to carry ``shortfall_rps``, the load measured
    above what the fleet carries, at ``backup_rps`` each, and at least ``at_least`` (the
    configured L). The fleet bound is applied after (``backup_step.backup_launch``).

    The paper's L is fixed (one c5.large). Where spill answers within RT_max that is
    enough: the shortfall is paid at Lambda's price until the planner's early step buys
    for it (``provisioner.early_step``). Where it does not (NASNet, OpenNMT-ende), a
    shortfall is misses and nothing else reacts before the forecast does; one backup
    per hold-off against a burst of 2.4× the fleet (NASNet on the ``mmpp`` trace) kept a
    third of five minutes' requests missing. So there the count is the shortfall's.
    """
    need = at_least
    if shortfall_rps > 0 and backup_rps > 0:
        need = max(at_least, math.ceil(shortfall_rps / backup_rps - 1e-9))
    return need


def slo_at_risk(state: SloMonitorState, now: float) -> str | None:
    """Why the fleet must not shrink now (backups launched, not judged yet), or None."""
    if now < state.holdoff_until:
        return f"SLO missed: backups launched, judged again from t={state.holdoff_until:g}"
    return None
