"""One model's planning step, carried out: forecast, ``plan_step``, launches (re-planning
without an offering that ran out of capacity), retirements, the standby pool, the plan
recorded. The decisions are all pure steps; this is their order and their effects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mark.config import ModelSpec
from mark.control.history import LoadHistory
from mark.control.reconcile import LIVE, Reconciler
from mark.control.recorder import Recorder
from mark.control.snapshot import members, snapshot
from mark.ports import InstanceInfo, InstanceState
from mark.state.records import PlanRecord
from provisioner.control_state import ControlState, Note, Snapshot, StepConfig
from provisioner.greedy import NoFeasibleOption, PlannerOption
from provisioner.health_step import HealthFact, with_readiness
from provisioner.standby_step import standby_pool_step
from provisioner.step import PlanStep, avoid_offering, plan_step, retirements


@dataclass
class StepResult:
    model: str
    forecast: list[float]
    plan_id: int | None
    launched: list[InstanceInfo]
    retired: list[str]
    held: list[tuple[str, str]]
    shortfall: float
    error: str | None = None


async def run_plan_step(
    spec: ModelSpec,
    now: float,
    everything: Sequence[InstanceInfo],
    state: ControlState,
    cfg: StepConfig,
    options: Sequence[PlannerOption],
    fixed_hourly: float,
    sources: Mapping[str, str],
    max_fallbacks: int,
    history: LoadHistory,
    recorder: Recorder,
    reconciler: Reconciler,
    facts: Mapping[str, HealthFact] | None = None,
) -> tuple[StepResult, ControlState]:
    """Plan and act for one model; returns what happened and the next control state.

    With ``facts`` (the agents' health), an instance counts as ready only once its
    agent said so, and one failing its probe is not counted as capacity.
    """
    model = spec.name
    live = [i for i in everything if i.state in LIVE]
    forecast, peak = await history.forecast(model, now, cfg.window_steps)
    price = recorder.price
    snap = _ready(snapshot(model, now, live, price, options, forecast, peak, fixed_hourly), facts)
    launched: list[InstanceInfo] = []
    notes: list[Note] = []
    failed = 0
    result: PlanStep | None = None
    # An offering out of capacity is avoided for a while and the step plans again
    # without it (what it launched before counts as running), a bounded number of times.
    for attempt in range(max_fallbacks + 1):
        try:
            result = plan_step(snap, state, cfg, spec.slo.rt_max_ms / 1000.0)
        except NoFeasibleOption as exc:
            if result is None:
                return StepResult(model, forecast, None, [], [], [], 0.0, error=str(exc)), state
            failed += 1
            notes.append(Note("fallback-exhausted", str(exc)))
            break
        notes += result.notes
        state = result.state
        done = await reconciler.launch(result.launches, live, now)
        notes += done.notes
        failed += done.failed
        launched += done.got
        await recorder.launched(done.got, now, "planner")
        if done.out_of_capacity is None:
            break
        state = avoid_offering(state, done.out_of_capacity, now, cfg.unavailable_ttl_s)
        if attempt == max_fallbacks:
            failed += 1
            notes.append(
                Note(
                    "fallback-exhausted",
                    f"{max_fallbacks} fallback(s) in this step; the rest waits for the next step",
                )
            )
            break
        live = [i for i in await reconciler.fleet.list() if i.state in LIVE]
        snap = _ready(
            snapshot(model, now, live, price, options, result.forecast, peak, fixed_hourly), facts
        )
    assert result is not None
    retire, held_note = retirements(result.retire, failed)
    if held_note is not None:
        notes.append(held_note)
    counted = {m.instance_id for m in result.counted}
    infos = {i.instance_id: i for i in everything}
    if retire:
        error = await reconciler.terminate(retire)
        if error is None:
            notes += [Note("retire", "cool-down over", instance_id=iid) for iid in retire]
            await recorder.bill_retired(model, retire, [infos[i] for i in retire], now)
        else:
            notes.append(Note("retire-failed", error))
    serving = [*(infos[i] for i in counted if i in infos), *launched]
    notes += await _standbys(
        snapshot(model, now, everything, price, options, result.forecast, peak, fixed_hourly),
        state,
        cfg,
        serving,
        result.forecast[0] if result.forecast else 0.0,
        infos,
        recorder,
        reconciler,
    )
    plan_id = await recorder.plan(
        PlanRecord(
            model=model,
            at=now,
            planner="greedy",
            forecast=list(result.forecast),
            horizon_cost=result.plan.cost_per_hour,
            explanation={
                "lines": result.plan.explain(),
                "held": [list(h) for h in result.held],
                "shortfall": [list(x) for x in result.plan.shortfall],
                "offerings": [
                    [o.label, o.capacity_rps, sources.get(o.instance_type, "given")]
                    for o in options
                ],
            },
            decisions=recorder.decisions(model, now, notes),
        )
    )
    shortfall = max((r for _, r in result.plan.shortfall), default=0.0)
    return (
        StepResult(
            model,
            list(result.forecast),
            plan_id,
            launched,
            list(retire),
            list(result.held),
            shortfall,
        ),
        state,
    )


def _ready(snap: Snapshot, facts: Mapping[str, HealthFact] | None) -> Snapshot:
    return snap if facts is None else with_readiness(snap, facts)


async def _standbys(
    snap_all: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    serving: Sequence[InstanceInfo],
    load_now: float,
    infos: dict[str, InstanceInfo],
    recorder: Recorder,
    reconciler: Reconciler,
) -> list[Note]:
    """The standby pool: launch what it lacks, stop started standbys no longer needed."""
    now = snap_all.now
    launch, stop, notes = standby_pool_step(
        snap_all, state, cfg, members(serving, recorder.price), load_now
    )
    if launch is not None:
        done = await reconciler.launch([launch], list(infos.values()), now)
        await recorder.launched(done.got, now, "standby pool")
        notes += done.notes
    if stop is not None:
        await reconciler.stop(stop.instance_ids)
        for iid in stop.instance_ids:
            await recorder.set_state(infos[iid], InstanceState.STOPPED, now, "standby idle")
        notes.append(Note("stop-standby", stop.reason, count=len(stop.instance_ids)))
    return notes
