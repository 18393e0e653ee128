"""The control steps: snapshot + control state in, actions + next state out.

Each P_u the shell asks ``plan_step`` what to launch and retire for one model;
the SLO monitor's verdict and backups are ``provisioner.backup_step``; the standby
pool and spot notices are ``provisioner.standby_step``. The rules wrapped
around the planner live here, in one place and in this order:

1. the rises the forecaster foresees beside its forecast are added where their
   chance pays for buying ahead (``foreseen_rise``); the forecast is clipped to
   what the history supports (``forecast_sanity``), then, once spill is measured
   to meet RT_max and its price is known, scaled from each step's peak to the
   share of it instances should carry (``capacity_target``);
2. the planner plans over the offerings not being avoided, counting the
   model's live serving and backup instances, less those with a spot notice,
   at the capacity each has in the pool it plans (``pooling``);
3. the guards: reuse before launch, cool-down, billing minimum, fleet bound,
   and no retirement while the SLO monitor's backups are being judged;
4. the spend rails: no launch past the model's or the cluster's $/h.

After the shell has carried out the launches, ``retirements`` says whether
the plan's retirements may go ahead: not when a launch failed, since they
counted on capacity that did not come. Pure: no I/O, no clock, no await.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from provisioner.capacity_target import capacity_target
from provisioner.control_state import (
    ControlState,
    Launch,
    Member,
    Note,
    Snapshot,
    StepConfig,
    counted_members,
)
from provisioner.early_step import EARLY_WINDOWS, fleet_capacity
from provisioner.forecast_sanity import clip_forecast
from provisioner.foreseen_rise import buy_ahead_chance, with_rises
from provisioner.greedy import OptionKey, Plan, PlannerOption, RunningInstance, plan_greedy
from provisioner.guards import FleetInstance, GuardState, RawDecision, apply_guards
from provisioner.pooling import capacity_in_pool, fleet_size, plan_pooled
from provisioner.rise_headroom import planning_options, pools
from provisioner.slo_monitor import slo_at_risk
from provisioner.spend_rails import RailHit, Spend, SpendLimits, within_rails
from provisioner.spot import avoid_interrupted, record_interruption
from provisioner.warm_pool import Rating, keeps_warm, pooled, ready_at, serving_from, warm_step
from provisioner.warm_pool import cooldown_s as warm_cooldown_s


@dataclass(frozen=True)
class PlanStep:
    """What one planning step decided for one model."""

    plan: Plan
    forecast: tuple[float, ...]
    """The forecast the plan used (clipped)."""
    launches: tuple[Launch, ...]
    retire: tuple[str, ...]
    """Instances to terminate: retired and not kept warm, and the warm pool's expired."""
    held: tuple[tuple[str, str], ...]
    """(instance id, why it is not retired yet) for unwanted instances kept."""
    counted: tuple[Member, ...]
    """This model's serving and backup instances the plan counted."""
    notes: tuple[Note, ...]
    state: ControlState
    """The next state, to keep once the launches are carried out."""
    start: tuple[str, ...] = ()
    """Stopped instances of the warm pool to start instead of launching."""
    stop: tuple[str, ...] = ()
    """Retired instances to stop into the warm pool (``provisioner.warm_pool``)."""
    replaced: tuple[Launch, ...] = ()
    """The plan's launches ``start`` stands in for: launched if the starts fail."""


def rail_notes(hits: Sequence[RailHit]) -> list[Note]:
    """Each spend-rail hit as a decision: which offering, how many held back, why."""
    return [Note("spend-rail", h.explain(), h.key[0], h.key[1], h.wanted - h.allowed) for h in hits]


def fleet_bound_notes(
    dropped: Sequence[tuple[OptionKey, int]], bound: int | None, wanted_by: str = "the plan"
) -> list[Note]:
    """Each offering the fleet bound kept from launching, as a decision: the load it was
    for spills or is declined instead, and nothing else would say why."""
    return [
        Note(
            "fleet-bound",
            f"the model's fleet is at offerings.max_instances ({bound}): {n} × {key[0]} "
            f"({key[1]}) {wanted_by} wants not launched; the load they were for spills or "
            "is declined until the bound is raised",
            key[0],
            key[1],
            n,
        )
        for key, n in dropped
    ]


def price_within_rails(
    requests: Sequence[tuple[OptionKey, int, float]], spend: Spend, limits: SpendLimits
) -> tuple[dict[OptionKey, int], list[Note]]:
    """The allowed count per offering, and the rail hits as notes."""
    allowed, hits, _ = within_rails(requests, spend, limits)
    return dict(allowed), rail_notes(hits)


def _outrun_by(snap: Snapshot, state: ControlState, cfg: StepConfig) -> float | None:
    """How far the load has outrun the fleet (r/s), None where it has not: the last
    ``EARLY_WINDOWS`` P_s windows ran above what it carries, booting instances included
    (``early_step.fleet_capacity``; one window above it can be a burst of seconds, over
    before a start), by the least of them. Only then is a start's speed worth another
    type's granularity (``warm_pool.substitute``), and only such starts spare spill
    (``WarmState.outrun_share``)."""
    recent = snap.recent_rates[:EARLY_WINDOWS]
    if len(recent) < EARLY_WINDOWS:
        return None
    above = min(recent) - fleet_capacity(snap, state, cfg)
    return above if above > 0.0 else None


def _spare_rps(
    above: float | None, launches: Sequence[Launch], rated: Mapping[OptionKey, Rating] | None
) -> float:
    """The load waiting beyond the fleet and the step's launches (``warm_pool.substitute``)."""
    if above is None or rated is None:
        return 0.0
    coming = sum(a.count * rated[a.key].capacity_rps for a in launches if a.key in rated)
    return max(0.0, above - coming)


def _rated(options: Sequence[PlannerOption], pool: int) -> dict[OptionKey, Rating]:
    """Each offering's price and per-instance capacity as a plan of ``pool`` instances
    counts it (``pooling.capacity_in_pool``; stand-alone for a pool of one)."""
    return {o.key: Rating(o.price_per_hour, capacity_in_pool(o, pool)) for o in options}


def plan_step(snap: Snapshot, state: ControlState, cfg: StepConfig, rt_max_s: float) -> PlanStep:
    """Plan, guard and rail one model's fleet; raises ``NoFeasibleOption`` if nothing can serve."""
    now = snap.now
    control = state.of(snap.model)
    offered = planning_options(snap, cfg)
    by_key = {o.key: o for o in offered}
    options = avoid_interrupted(list(offered), state.avoid, now)
    ahead, rise = foreseen_rises(snap, cfg, options)
    forecast, clip = clip_forecast(ahead, snap.observed_peak, cfg.bounds)
    notes = [n for n in (rise,) if n is not None]
    notes += [Note("forecast-clipped", clip.why)] if clip is not None else []
    mine = counted_members(snap, state)
    running = [_running(m, by_key[m.key], now, cfg, state) for m in mine if m.key in by_key]
    planner = plan_pooled if pools(snap, cfg) else plan_greedy
    target, _ = capacity_target(forecast, snap.window_minutes, cfg.spill_cost_per_request, options)
    plan = planner(
        target,
        running,
        options,
        slo_s=rt_max_s,
        step_s=cfg.step_s,
        tau_steps=lead_steps(snap, cfg, target, mine, options),
    )
    decision, guards = apply_guards(
        RawDecision.from_plan(plan),
        [_guarded(m, cfg, state) for m in mine],
        GuardState(control.last_wanted),
        now,
        cfg.guard,
        hold=slo_at_risk(control.slo, now),
    )
    notes += fleet_bound_notes(decision.dropped, cfg.guard.max_fleet)
    allowed, hits = price_within_rails(
        [(key, n, by_key[key].price_per_hour) for key, n in decision.launch],
        snap.spend(gone=frozenset(decision.retire)),
        cfg.limits,
    )
    notes += hits
    why = {it.option.key: it.explain() for it in plan.launch_items()}
    launches = tuple(
        Launch(snap.model, key[0], key[1], n, "serving", why.get(key, ""))
        for key, n in allowed.items()
    )
    ours = snap.mine()
    above = _outrun_by(snap, state, cfg) if cfg.warm is not None else None
    rated = (
        _rated(options, fleet_size(plan) if planner is plan_pooled else 1)
        if above is not None
        else None
    )
    warm = warm_step(
        ours,
        now,
        launches,
        decision.retire,
        cfg.boot_s,
        cfg.warm,
        state.warm,
        rated,
        above is not None,
        _spare_rps(above, launches, rated),
    )
    notes += warm.notes
    known = {m.instance_id for m in ours}
    others = state.warm
    state = replace(
        state,
        warm=replace(
            warm.state,
            stopped_at={
                **{i: t for i, t in others.stopped_at.items() if i not in known},
                **warm.state.stopped_at,
            },
            started_at={
                **{i: t for i, t in others.started_at.items() if i not in known},
                **warm.state.started_at,
            },
        ),
    )
    return PlanStep(
        plan,
        tuple(forecast),
        warm.launches,
        warm.terminate,
        decision.held,
        tuple(mine),
        tuple(notes),
        state.with_model(
            snap.model,
            replace(
                control,
                last_wanted=dict(guards.last_wanted),
                planned_rps=forecast[0] if forecast else 0.0,
                planned_at=now,
            ),
        ),
        warm.start,
        warm.stop,
        warm.replaced,
    )


def lead_steps(
    snap: Snapshot,
    cfg: StepConfig,
    target: Sequence[float],
    counted: Sequence[Member],
    options: Sequence[PlannerOption],
) -> int:
    """τ: how many steps ahead this step buys. Where the warm pool and the fleet together
    carry the load planned up to a boot ahead, whatever is wanted comes a start after it
    is wanted, so the plan buys for the nearer forecast (``warm_tau_steps``); else some
    of it must be launched, and serves a boot after: a boot ahead (``tau_steps``)."""
    if cfg.warm_tau_steps is None:
        return cfg.tau_steps
    pool = pooled(snap.mine())
    if not pool:
        return cfg.tau_steps
    rated = {o.key: o.capacity_rps for o in options}
    carried = sum(rated.get(m.key, 0.0) for m in (*counted, *pool))
    ahead = max(target[: cfg.tau_steps + 1], default=0.0)
    return cfg.warm_tau_steps if ahead <= carried else cfg.tau_steps


def foreseen_rises(
    snap: Snapshot, cfg: StepConfig, options: Sequence[PlannerOption]
) -> tuple[list[float], Note | None]:
    """The forecast with the foreseen rises worth buying ahead for (``foreseen_rise``),
    and a note saying so when there were any."""
    if not snap.rise_chance:
        return list(snap.forecast), None
    least = buy_ahead_chance(
        cfg.spill_cost_per_request,
        options,
        lead_s=cfg.boot_s,
        react_s=cfg.boot_s + cfg.step_s,
        hold_s=max(cfg.guard.cooldown_s, cfg.guard.billing_minimum_s),
    )
    out, raised = with_rises(snap.forecast, snap.rise_chance, snap.rise_rate, least)
    if raised == 0:
        return out, None
    bought = [(c, r) for c, r in zip(snap.rise_chance, snap.rise_rate, strict=False) if c >= least]
    return out, Note(
        "rise-ahead",
        f"a rise foreseen with chance {max(bought)[0]:.0%} (buying ahead pays from "
        f"{least:.0%}): {raised} step(s) planned for up to {max(r for _, r in bought):.1f} r/s",
        count=raised,
    )


def _running(
    m: Member, option: PlannerOption, now: float, cfg: StepConfig, state: ControlState
) -> RunningInstance:
    """An instance as the planner counts it: steps until it serves (0 once ready); one
    started out of the warm pool serves a start after its start, not a boot."""
    serves_at = ready_at(m, cfg.boot_s, state.warm, cfg.warm)
    steps_left = 0 if m.state == "ready" else math.ceil((serves_at - now) / cfg.step_s)
    return RunningInstance(m.instance_id, option, max(0, steps_left))


def _guarded(m: Member, cfg: StepConfig, state: ControlState) -> FleetInstance:
    """An instance as the guards see it: its run's start, and a start's cool-down where
    retiring it stops it into the warm pool."""
    cool = warm_cooldown_s(cfg.warm) if cfg.warm and keeps_warm(m, cfg.boot_s, cfg.warm) else None
    return FleetInstance(m.instance_id, m.key, serving_from(m, state.warm), cool)


def avoid_offering(state: ControlState, key: OptionKey, now: float, ttl_s: float) -> ControlState:
    """An offering ran out of capacity: plan without it for ``ttl_s``."""
    return replace(state, avoid=record_interruption(state.avoid, key, now, ttl_s))


def retirements(retire: Sequence[str], failed_launches: int) -> tuple[tuple[str, ...], Note | None]:
    """The plan's retirements, unless a launch of this step failed.

    The plan retired instances because the launches would cover their load; if
    any did not happen, retiring now would leave the load uncovered. They wait
    for the next step, which plans with what actually runs.
    """
    if failed_launches == 0 or not retire:
        return tuple(retire), None
    return (), Note(
        "retire-held",
        f"{failed_launches} launch(es) failed in this step; {len(retire)} retirement(s) "
        "wait for the next step",
        count=len(retire),
    )
