"""Greedy + guards driven step by step over a ramp, with a virtual clock.

Launches happen ahead of the load (instances take tau to boot), no step runs
short while the forecast is right, and the fleet is retired after the ramp
only once the cool-down has passed.
"""

import numpy as np

from provisioner.greedy import PlannerOption, RunningInstance, plan_greedy
from provisioner.guards import FleetInstance, GuardConfig, GuardState, RawDecision, apply_guards

STEP_S = 60.0
TAU = 5
SMALL = PlannerOption("c5.xlarge", "on-demand", 0.17, 20.0, 0.17 * 300 / 3600)
BIG = PlannerOption("p2.xlarge", "spot", 0.30, 55.0, 0.30 * 300 / 3600)
GUARDS = GuardConfig(cooldown_s=300, billing_minimum_s=60)


def ramp() -> np.ndarray:
    up = np.linspace(0, 500, 30)
    return np.concatenate([np.zeros(10), up, np.full(20, 500.0), up[::-1], np.zeros(30)])


def test_capacity_is_ready_before_the_load_and_retired_after_cooldown() -> None:
    load = ramp()
    by_key = {o.key: o for o in (SMALL, BIG)}
    fleet: dict[str, tuple[FleetInstance, int]] = {}
    state = GuardState()
    launched = 0
    retired_at: dict[str, float] = {}
    for t in range(load.size):
        now = t * STEP_S
        horizon = load[t : t + 60]
        forecast = np.pad(horizon, (0, 60 - horizon.size), mode="edge").tolist()
        running = [
            RunningInstance(i.instance_id, by_key[i.key], max(0, ready - t))
            for i, ready in fleet.values()
        ]
        plan = plan_greedy(forecast, running, [SMALL, BIG], step_s=STEP_S, tau_steps=TAU)
        instances = [i for i, _ in fleet.values()]
        decision, state = apply_guards(RawDecision.from_plan(plan), instances, state, now, GUARDS)
        for iid in decision.retire:
            inst, _ = fleet.pop(iid)
            assert now - inst.launched_at >= GUARDS.billing_minimum_s
            retired_at[iid] = now
        for key, count in decision.launch:
            for _ in range(count):
                iid = f"i-{launched}"
                launched += 1
                fleet[iid] = (FleetInstance(iid, key, now), t + TAU)
        ready = sum(by_key[i.key].capacity_rps for i, r in fleet.values() if r <= t)
        assert ready >= load[t] - 1e-6, f"step {t}: {ready} r/s ready for {load[t]}"
    assert launched > 0 and not fleet
    # Retirements happen only after the load fell, and the last one within the
    # cool-down (plus a step of slack) of the load reaching zero.
    peak_end = int(np.flatnonzero(load == load.max())[-1])
    zero_from = (peak_end + int(np.flatnonzero(load[peak_end:] == 0)[0])) * STEP_S
    assert max(retired_at.values()) <= zero_from + GUARDS.cooldown_s + 2 * STEP_S
    assert min(retired_at.values()) > peak_end * STEP_S


def test_a_large_instance_kept_for_the_boot_retires_once_small_ones_serve() -> None:
    """After a surge: three p2.xlarge for a load a few r/s above two. The third bridges
    the boot of two c5.large, serves throughout, and retires after its cool-down once
    they serve; the plan does not keep it every minute for the rest of the window."""
    p2 = PlannerOption("p2.xlarge", "on-demand", 0.90, 52.0, 0.90 * 120 / 3600)
    c5 = PlannerOption("c5.large", "on-demand", 0.085, 2.8, 0.085 * 120 / 3600)
    by_key = {o.key: o for o in (p2, c5)}
    guards = GuardConfig(cooldown_s=120, billing_minimum_s=60)
    tau = 2
    fleet = {f"p2-{n}": (FleetInstance(f"p2-{n}", p2.key, -3600.0), 0) for n in range(3)}
    state = GuardState()
    retired_at: dict[str, int] = {}
    for t in range(20):
        forecast = [108.0] * 60
        running = [
            RunningInstance(i.instance_id, by_key[i.key], max(0, ready - t))
            for i, ready in fleet.values()
        ]
        plan = plan_greedy(forecast, running, [p2, c5], step_s=STEP_S, tau_steps=tau)
        instances = [i for i, _ in fleet.values()]
        decision, state = apply_guards(
            RawDecision.from_plan(plan), instances, state, t * STEP_S, guards
        )
        for iid in decision.retire:
            fleet.pop(iid)
            retired_at[iid] = t
        for key, count in decision.launch:
            for n in range(count):
                iid = f"{key[0]}-{t}-{n}"
                fleet[iid] = (FleetInstance(iid, key, t * STEP_S), t + tau)
        ready = sum(by_key[i.key].capacity_rps for i, r in fleet.values() if r <= t)
        assert ready >= 108.0, f"step {t}: {ready} r/s ready"
    assert sorted(i.key[0] for i, _ in fleet.values()) == ["c5.large"] * 2 + ["p2.xlarge"] * 2
    (gone,) = retired_at.values()
    assert gone <= tau + 120 / STEP_S + 1
