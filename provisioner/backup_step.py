"""The SLO monitor's control step (paper §4.4): its verdict, and the backups it launches.

Beside the planner the monitor reacts at once to misses. ``slo_step`` gives its verdict
on the latencies just finished; ``backup_launch`` turns it into a launch within the
spend rails. Where the model's spill is measured to miss RT_max (``SpillEvidence.late``)
a shortfall is misses, so the count carries the load measured above the fleet:
``load_wanted`` says when the shell must read that load, ``backup_topup`` launches what
is still missing while the last backups are judged, and ``backups_sized`` remembers the
load they were sized to, so that the fleet is looked at again only when the load rises
past it (on AWS every look is a DescribeInstances, and the monitor runs every 2 s).
Pure: no I/O, no clock, no await.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from provisioner.control_state import (
    ControlState,
    Launch,
    Note,
    Snapshot,
    StepConfig,
    counted_members,
)
from provisioner.guards import within_fleet_bound
from provisioner.pooling import capacity_in_pool
from provisioner.slo_monitor import (
    BackupLaunch,
    SloMonitorConfig,
    backup_count,
    observe_latencies,
    slo_at_risk,
)
from provisioner.step import fleet_bound_notes, price_within_rails


def slo_step(
    state: ControlState,
    model: str,
    now: float,
    monitor: SloMonitorConfig,
    latencies_s: Sequence[float],
) -> tuple[BackupLaunch | None, ControlState]:
    """The SLO monitor (paper §4.4): recent latencies in; backups to launch at once if
    fewer than SL_min of the last M met RT_max (then a hold-off)."""
    control = state.of(model)
    action, slo = observe_latencies(control.slo, latencies_s, now, monitor)
    return action, state.with_model(model, replace(control, slo=slo))


def load_wanted(state: ControlState, model: str, now: float, verdict: BackupLaunch | None) -> bool:
    """Whether the backups decided now are sized to the load measured now: only where the
    model's spill is measured to miss RT_max, and only at a verdict (``verdict``) or while
    one is judged (a top-up may be due). The shell reads the load only then."""
    control = state.of(model)
    if not control.spill.late():
        return False
    return verdict is not None or slo_at_risk(control.slo, now) is not None


def backup_topup(
    state: ControlState,
    model: str,
    now: float,
    monitor: SloMonitorConfig,
    observed_rps: float | None,
) -> BackupLaunch | None:
    """A launch of no backups but those the load measured now still needs
    (``backup_launch``), while the last ones are judged and only where spill is measured
    to miss RT_max, once the load exceeds what they were sized to; else None.

    The monitor's verdict comes seconds into a burst, often before a closed P_s window
    shows its rate, and its hold-off then blocks another for the backups' boot time:
    the count sized at the verdict can be the configured L against a shortfall of dozens
    of instances. The booting backups count as carried, so a top-up only adds what is
    still missing."""
    if observed_rps is None or not load_wanted(state, model, now, None):
        return None
    if observed_rps <= state.of(model).slo.sized_rps:
        return None
    return BackupLaunch(monitor.instance_type, monitor.market, 0, math.nan)


def backups_sized(state: ControlState, model: str, observed_rps: float | None) -> ControlState:
    """``state`` remembering that the backups of this hold-off carry ``observed_rps``
    (launched, refused by the rails, or found not short); unchanged for None. A launch the
    cloud failed is not remembered, so the next check tries again."""
    if observed_rps is None:
        return state
    control = state.of(model)
    sized = max(control.slo.sized_rps, observed_rps)
    return state.with_model(model, replace(control, slo=replace(control.slo, sized_rps=sized)))


def carried_in_pool(snap: Snapshot, state: ControlState) -> tuple[float, int]:
    """What the model's counted instances carry within the SLO as the dispatcher serves
    them, one queue in front of all (``pooling.capacity_in_pool`` at the fleet's size, on
    the measured options, whatever the plan rates them at), and how many they are."""
    by_key = {o.key: o for o in snap.options}
    serving = [m for m in counted_members(snap, state) if m.key in by_key]
    n = len(serving)
    return sum(capacity_in_pool(by_key[m.key], n) for m in serving), n


def backup_launch(
    snap: Snapshot,
    cfg: StepConfig,
    monitor: SloMonitorConfig,
    action: BackupLaunch,
    price_per_hour: float,
    state: ControlState,
    observed_rps: float | None = None,
) -> tuple[Launch | None, list[Note]]:
    """The backups ``slo_step`` (or ``backup_topup``) asked for, as many as the spend
    rails allow.

    ``observed_rps``, the load measured now, is given where ``load_wanted``: then the
    count covers what the load exceeds the fleet by (``backup_count``), not only the
    configured L."""
    count = action.count
    sized = ""
    key = (action.instance_type, action.market)
    option = next((o for o in snap.options if o.key == key), None)
    if observed_rps is not None and option is not None:
        carried, n = carried_in_pool(snap, state)
        each = capacity_in_pool(option, max(n, 1))
        count = backup_count(observed_rps - carried, each, action.count)
        if count > action.count:
            sized = (
                f"; the load, {observed_rps:.1f} r/s, exceeds the {carried:.1f} r/s the "
                f"fleet carries: {count} at {each:.2f} r/s each"
            )
    # The fleet bound holds backups as it holds the plan's launches: the user's cap.
    fits, dropped = within_fleet_bound(
        [(key, count)], cfg.guard.max_fleet, len(counted_members(snap, state))
    )
    bound_notes = fleet_bound_notes(dropped, cfg.guard.max_fleet, "the SLO monitor")
    count = sum(n for _, n in fits)
    if count <= 0:
        return None, bound_notes
    allowed, notes = price_within_rails([(key, count, price_per_hour)], snap.spend(), cfg.limits)
    notes = bound_notes + notes
    count = allowed.get(key, 0)
    if count == 0:  # a top-up refused says nothing the verdict's launch did not
        return None, notes if action.count > 0 else bound_notes
    if action.count == 0:  # a top-up (``backup_topup``)
        why = "more backups while the last are judged" + sized
    else:
        why = (
            f"only {action.service_level:.1%} of the last {monitor.window} requests met "
            f"RT_max {monitor.rt_max_s * 1000:g} ms (SL_min {monitor.sl_min:.0%})" + sized
        )
    return Launch(snap.model, action.instance_type, action.market, count, "backup", why), notes
