"""One model's planning step, carried out: forecast, ``plan_step``, launches (re-planning
without an offering that ran out of capacity), retirements, exploration of unprofiled
types, the standby pool, the plan recorded; and the control tasks around it: health
replacements, standby starts (on a notice, and retried when owed), the orphan sweep,
backups. The decisions are all pure steps; this is their order and their effects."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from mark.config import ModelSpec
from mark.control.history import LoadHistory
from mark.control.reconcile import LIVE, Launched, Reconciler
from mark.control.recorder import Recorder
from mark.control.snapshot import members, snapshot
from mark.errors import CloudError
from mark.ports import InstanceInfo, InstanceRole, InstanceState
from mark.state.records import PlanRecord
from provisioner.backup_step import backup_launch
from provisioner.control_state import Change, ControlState, Launch, Note, Snapshot, StepConfig
from provisioner.explore_step import Candidate, ExploreConfig, explore_step
from provisioner.greedy import NoFeasibleOption, PlannerOption
from provisioner.health_step import HealthConfig, HealthFact, health_step, with_readiness
from provisioner.orphan_step import OrphanConfig, OrphanStep, orphan_step
from provisioner.rise_headroom import rating, sizes_for_rises
from provisioner.slo_monitor import BackupLaunch, SloMonitorConfig
from provisioner.standby_step import InterruptionStep, owed_standbys_step, standby_pool_step
from provisioner.step import PlanStep, avoid_offering, plan_step, retirements
from provisioner.warm_pool import backup_starts


@dataclass(frozen=True)
class Exploration:
    """What exploring unprofiled types needs from the configuration and the catalog."""

    config: ExploreConfig
    candidates: Sequence[Candidate]


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
    started: list[str] = field(default_factory=list)
    """Stopped instances started out of the warm pool instead of launched."""
    stopped: list[str] = field(default_factory=list)
    """Retired instances stopped into the warm pool instead of terminated."""


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
    exploration: Exploration | None = None,
    early: str | None = None,
) -> tuple[StepResult, ControlState]:
    """Plan and act for one model; returns what happened and the next control state.

    ``early``: why this step runs before its P_u (``provisioner.early_step``), kept
    with the plan's decisions.

    With ``facts`` (the agents' health), an instance counts as ready only once its
    agent said so, and one failing its probe is not counted as capacity. With
    ``exploration``, an unprofiled offering type may be measured (``explore_step``).
    """
    model = spec.name
    live = [i for i in everything if i.state in LIVE]
    seen = await history.forecast(model, now, cfg.window_steps)
    rise = (
        await history.rise_to_carry(model, now, cfg, state.of(model).misses)
        if sizes_for_rises(cfg)
        else None
    )
    forecast, peak = seen.values, seen.peak
    price = recorder.price
    shape = history.window_minutes(model, now)
    recent = history.recent_rates(model, now)

    def view(
        fleet: Sequence[InstanceInfo],
        planned: Sequence[float],
        minutes: Sequence[Sequence[float]] = (),
        rises: tuple[Sequence[float], Sequence[float]] = ((), ()),
    ) -> Snapshot:
        """The model's snapshot of ``fleet`` with ``planned`` as its forecast."""
        return snapshot(
            model,
            now,
            fleet,
            price,
            options,
            planned,
            peak,
            fixed_hourly,
            minutes,
            rises=rises,
            carried_rise=rise,
            recent=recent,
        )

    # The whole fleet, stopped instances too: the warm pool is the model's stopped ones.
    snap = _ready(view(everything, forecast, shape, (seen.rise_chance, seen.rise_rate)), facts)
    launched: list[InstanceInfo] = []
    notes: list[Note] = [Note("early-step", early)] if early is not None else []
    failed = 0
    started: list[str] = []
    result: PlanStep | None = None
    # An offering out of capacity is avoided for a while and the step plans again
    # without it (what it launched before counts as running), a bounded number of times.
    for attempt in range(max_fallbacks + 1):
        try:
            result = plan_step(snap, state, cfg, spec.slo.rt_max_ms / 1000.0)
        except NoFeasibleOption as exc:
            if result is None:
                return await _nothing_serves(
                    spec,
                    now,
                    everything,
                    state,
                    cfg,
                    options,
                    fixed_hourly,
                    sources,
                    forecast,
                    str(exc),
                    notes,
                    recorder,
                    reconciler,
                    facts,
                    exploration,
                )
            failed += 1
            notes.append(Note("fallback-exhausted", str(exc)))
            break
        notes += result.notes
        state = result.state
        cold = await _warm_start(result, everything, now, recorder, reconciler, notes)
        if not cold:
            started += result.start
        done = await reconciler.launch([*result.launches, *cold], live, now)
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
        listed = await reconciler.fleet.list()
        live = [i for i in listed if i.state in LIVE]
        snap = _ready(view(listed, result.forecast, shape), facts)
    assert result is not None
    # Stops are retirements too: they wait as terminations do when a launch failed.
    going, held_note = retirements((*result.retire, *result.stop), failed)
    if held_note is not None:
        notes.append(held_note)
    retire = tuple(i for i in going if i not in result.stop)
    stop = tuple(i for i in going if i in result.stop)
    counted = {m.instance_id for m in result.counted}
    infos = {i.instance_id: i for i in everything}
    gone: set[str] = set()
    if stop:
        error = await reconciler.stop(stop, drain=True)
        if error is None:
            notes += [
                Note(
                    "retire-warm",
                    "cool-down over; stopped into the warm pool",
                    infos[i].instance_type,
                    infos[i].market.value,
                    instance_id=i,
                )
                for i in stop
            ]
            await recorder.bill_stopped(model, [infos[i] for i in stop], now, "warm pool")
            gone.update(stop)
        else:
            notes.append(Note("retire-failed", error))
    if retire:
        error = await reconciler.terminate(retire)
        if error is None:
            notes += [Note("retire", "cool-down over", instance_id=iid) for iid in retire]
            await recorder.bill_retired(model, retire, [infos[i] for i in retire], now)
            gone.update(retire)
        else:
            notes.append(Note("retire-failed", error))
    if exploration is not None:
        after = {i.instance_id: i for i in [*everything, *launched] if i.instance_id not in gone}
        explored, state, awaiting = await _explore(
            spec,
            _ready(
                snapshot(model, now, list(after.values()), price, options, (), 0.0, fixed_hourly),
                facts,
            ),
            state,
            cfg,
            exploration,
            {*sources, *(o.instance_type for o in options)},
            after,
            recorder,
            reconciler,
        )
        notes += explored
    else:
        awaiting = ()
    serving = [*(infos[i] for i in counted if i in infos), *launched]
    notes += await _standbys(
        view(everything, result.forecast),
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
                "rated": rating(snap, cfg),
                "offerings": [
                    [o.label, o.capacity_rps, sources.get(o.instance_type, "given")]
                    for o in options
                ],
                "awaiting_profile": [list(a) for a in awaiting],
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
            started=started,
            stopped=[i for i in stop if i in gone],
        ),
        state,
    )


async def run_health_step(
    model: str,
    now: float,
    everything: Sequence[InstanceInfo],
    state: ControlState,
    view: tuple[Mapping[str, HealthFact], float],
    cfg: HealthConfig,
    price: Callable[[str, str], float],
    recorder: Recorder,
    reconciler: Reconciler,
) -> tuple[bool, ControlState]:
    """Terminate what never got ready or stopped serving (the plan then replaces it);
    whether anything was terminated, and the next state."""
    facts, since = view
    # `mark profile --type`'s instance is the command's to end, whatever its health.
    mine = [i for i in everything if i.role is not InstanceRole.PROFILING]
    snap = snapshot(model, now, mine, price, ())
    change, notes, state = health_step(snap, state, facts, cfg, since)
    if change is not None:
        notes += await terminate(model, change.instance_ids, everything, now, recorder, reconciler)
    await recorder.record(model, now, notes)
    return change is not None, state


async def terminate(
    model: str,
    ids: Sequence[str],
    everything: Sequence[InstanceInfo],
    now: float,
    recorder: Recorder,
    reconciler: Reconciler,
) -> list[Note]:
    """Drain and terminate ``ids``, billing each to now; a note if the cloud refused."""
    error = await reconciler.terminate(ids)
    if error is not None:
        return [Note("retire-failed", error)]
    gone = [i for i in everything if i.instance_id in ids]
    await recorder.bill_retired(model, ids, gone, now)
    return []


async def start_standbys(
    res: InterruptionStep,
    victim: InstanceInfo,
    fleet: Sequence[InstanceInfo],
    now: float,
    recorder: Recorder,
    reconciler: Reconciler,
) -> tuple[list[str], ControlState]:
    """Carry out a spot notice's step: start the standbys, record, bill the victim to its
    reclaim. The standbys started and the next state: if the start failed, the notice is
    remembered all the same and the start is owed (the next notice or step retries)."""
    started, ok = await _start(res.start, victim.model, fleet, now, recorder, reconciler)
    await recorder.record(victim.model, now, res.notes)
    await recorder.bill_retired(victim.model, [victim.instance_id], [victim], res.reclaim_at)
    return started, res.state if ok else res.if_start_fails


async def retry_standby_starts(
    snap: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    fleet: Sequence[InstanceInfo],
    recorder: Recorder,
    reconciler: Reconciler,
) -> tuple[list[str], ControlState]:
    """Start the standbys earlier notices of ``snap.model`` still owe (``owed_standbys_step``);
    the standbys started and the next state."""
    res = owed_standbys_step(snap, state, cfg)
    if res is None:
        return [], state
    started, ok = await _start(res.start, snap.model, fleet, snap.now, recorder, reconciler)
    await recorder.record(snap.model, snap.now, res.notes)
    return started, res.state if ok else res.if_start_fails


async def _start(
    change: Change | None,
    model: str,
    fleet: Sequence[InstanceInfo],
    now: float,
    recorder: Recorder,
    reconciler: Reconciler,
) -> tuple[list[str], bool]:
    """Start the standbys of ``change``; the ids started, and whether the cloud agreed."""
    ids = list(change.instance_ids) if change is not None else []
    if not ids:
        return [], True
    try:
        await reconciler.start(ids)
    except CloudError as exc:
        why = f"starting standbys {ids} failed: {exc}; tried again at the next notice or step"
        await recorder.record(model, now, [Note("start-standby-failed", why)])
        return [], False
    by_id = {i.instance_id: i for i in fleet}
    for iid in ids:
        await recorder.set_state(by_id[iid], InstanceState.PENDING, now, "standby started")
    return ids, True


async def sweep_orphans(
    fleet: Sequence[InstanceInfo],
    now: float,
    state: ControlState,
    cfg: OrphanConfig,
    recorder: Recorder,
    reconciler: Reconciler,
) -> tuple[OrphanStep, ControlState]:
    """The orphan sweep over every instance the cluster lists: each orphan recorded (a
    decision under its own model), those ``orphan_step`` says terminated and billed."""
    res = orphan_step(members(fleet, recorder.price), now, state, cfg)
    state = res.state
    notes: dict[str, list[Note]] = {}
    for model, note in res.notes:
        notes.setdefault(model, []).append(note)
    infos = {i.instance_id: i for i in fleet}
    for change in res.terminate:
        error = await reconciler.terminate(change.instance_ids)
        if error is not None:
            # Still orphans, reported as such: the next step tries again (clocks kept).
            failed = f"; terminating it failed ({error}), tried again at the next step"
            notes[change.model] = [
                replace(n, action="orphan", reason=n.reason + failed)
                if n.instance_id in change.instance_ids
                else n
                for n in notes[change.model]
            ]
            continue
        gone = [infos[i] for i in change.instance_ids]
        await recorder.bill_retired(change.model, change.instance_ids, gone, now)
        state = replace(
            state,
            orphans={i: t for i, t in state.orphans.items() if i not in change.instance_ids},
        )
    for model, ns in notes.items():
        await recorder.record(model, now, ns)
    return res, state


async def launch_backups(
    snap: Snapshot,
    fleet: Sequence[InstanceInfo],
    cfg: StepConfig,
    monitor: SloMonitorConfig,
    action: BackupLaunch,
    price_per_hour: float,
    recorder: Recorder,
    reconciler: Reconciler,
    state: ControlState,
    observed_rps: float | None = None,
) -> tuple[Launched, ControlState]:
    """The SLO monitor's backups, as many as the spend rails allow (and, given the load
    ``observed_rps``, as many as it exceeds the fleet by), started out of the warm pool
    where it holds their type; what the cloud did (nothing launched and nothing failed
    when none were wanted or the rails refused), and the next state."""
    launch, notes = backup_launch(snap, cfg, monitor, action, price_per_hour, state, observed_rps)
    done = Launched()
    if launch is not None:
        start, launch, taken, warm = backup_starts(
            snap.mine(), snap.now, launch, cfg.boot_s, cfg.warm, state.warm
        )
        if start:
            infos = {i.instance_id: i for i in fleet}
            try:
                await reconciler.start(start)
            except CloudError as exc:  # launched instead, as many
                notes.append(Note("warm-start-failed", f"{exc}; backups launched instead"))
                n = len(start) + (launch.count if launch is not None else 0)
                launch = Launch(
                    snap.model,
                    action.instance_type,
                    action.market,
                    n,
                    "backup",
                    "warm start failed",
                )
            else:
                notes += taken
                state = replace(state, warm=warm)
                for iid in start:
                    await recorder.set_state(
                        infos[iid], InstanceState.PENDING, snap.now, "backup from the warm pool"
                    )
                done.got.extend(infos[i] for i in start)
        if launch is not None:
            more = await reconciler.launch([launch], fleet, snap.now)
            await recorder.launched(more.got, snap.now, "SLO monitor")
            done = replace(more, got=[*done.got, *more.got])
    await recorder.record(snap.model, snap.now, [*notes, *done.notes])
    return done, state


async def _explore(
    spec: ModelSpec,
    snap: Snapshot,
    state: ControlState,
    cfg: StepConfig,
    exploration: Exploration,
    profiled: set[str],
    infos: Mapping[str, InstanceInfo],
    recorder: Recorder,
    reconciler: Reconciler,
    *,
    unplannable: bool = False,
) -> tuple[list[Note], ControlState, tuple[tuple[str, bool], ...]]:
    """Retire exploring instances that measured their type; launch one for an unprofiled
    type when ``explore_step`` says so. Also returns the types awaiting a profile, each
    with whether it is explored now (the plan's explanation shows them)."""
    now = snap.now
    step = explore_step(
        snap,
        state,
        cfg,
        exploration.config,
        exploration.candidates,
        profiled,
        spec.neuron_artifact is not None,
        unplannable=unplannable,
    )
    notes, state, awaiting = list(step.notes), step.state, step.awaiting
    if step.retire is not None:
        ids = step.retire.instance_ids
        error = await reconciler.terminate(ids)
        if error is None:
            await recorder.bill_retired(spec.name, ids, [infos[i] for i in ids], now)
        else:
            notes = [n for n in notes if n.action != "explore-done"]
            notes.append(Note("retire-failed", error))
    if step.launch is not None:
        done = await reconciler.launch([step.launch], list(infos.values()), now)
        await recorder.launched(done.got, now, "explore")
        notes += done.notes
        if done.out_of_capacity is not None:
            state = avoid_offering(state, done.out_of_capacity, now, cfg.unavailable_ttl_s)
        if not done.got:  # not launched (a type explored already is never picked)
            picked = step.launch.instance_type
            awaiting = tuple((t, on and t != picked) for t, on in awaiting)
    return notes, state, awaiting


async def _nothing_serves(
    spec: ModelSpec,
    now: float,
    everything: Sequence[InstanceInfo],
    state: ControlState,
    cfg: StepConfig,
    options: Sequence[PlannerOption],
    fixed_hourly: float,
    sources: Mapping[str, str],
    forecast: list[float],
    why: str,
    notes: list[Note],
    recorder: Recorder,
    reconciler: Reconciler,
    facts: Mapping[str, HealthFact] | None,
    exploration: Exploration | None,
) -> tuple[StepResult, ControlState]:
    """No rated offering can serve the model (in the aws world, a new model before any
    profile): every request spills. Exploration then measures a type at once, without
    waiting for its interval, and the step records a plan saying so, so that
    ``mark plan --explain`` shows what is awaited rather than nothing."""
    model = spec.name
    awaiting: tuple[tuple[str, bool], ...] = ()
    if exploration is not None:
        after = {i.instance_id: i for i in everything}
        snap = snapshot(model, now, everything, recorder.price, options, (), 0.0, fixed_hourly)
        explored, state, awaiting = await _explore(
            spec,
            _ready(snap, facts),
            state,
            cfg,
            exploration,
            {*sources, *(o.instance_type for o in options)},
            after,
            recorder,
            reconciler,
            unplannable=True,
        )
        notes = [*notes, *explored]
    plan_id = await recorder.plan(
        PlanRecord(
            model=model,
            at=now,
            planner="greedy",
            forecast=list(forecast),
            horizon_cost=0.0,
            explanation={
                "lines": [f"nothing planned: {why}; every request spills to Lambda"],
                "offerings": [
                    [o.label, o.capacity_rps, sources.get(o.instance_type, "given")]
                    for o in options
                ],
                "awaiting_profile": [list(a) for a in awaiting],
            },
            decisions=recorder.decisions(model, now, notes),
        )
    )
    return StepResult(model, forecast, plan_id, [], [], [], 0.0, error=why), state


async def _warm_start(
    result: PlanStep,
    everything: Sequence[InstanceInfo],
    now: float,
    recorder: Recorder,
    reconciler: Reconciler,
    notes: list[Note],
) -> list[Launch]:
    """Start the stopped instances the step takes out of the warm pool; if the cloud
    refuses, the plan's launches they stood in for are launched instead (returned), so
    the plan's capacity still comes, of the type the plan chose."""
    if not result.start:
        return []
    infos = {i.instance_id: i for i in everything}
    try:
        await reconciler.start(result.start)
    except CloudError as exc:
        notes.append(Note("warm-start-failed", f"{exc}; the plan's launches made instead"))
        return [replace(a, reason="the warm start failed") for a in result.replaced]
    for iid in result.start:
        await recorder.set_state(
            infos[iid], InstanceState.PENDING, now, "started from the warm pool"
        )
    return []


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
    """The standby pool: launch what it lacks, terminate stopped standbys beyond their
    worth, stop started standbys no longer needed."""
    now = snap_all.now
    pool = standby_pool_step(snap_all, state, cfg, members(serving, recorder.price), load_now)
    launch, stop, end, notes = pool.launch, pool.stop, pool.end, list(pool.notes)
    if end is not None:
        error = await reconciler.terminate(end.instance_ids)
        if error is None:
            gone = [infos[iid] for iid in end.instance_ids]
            await recorder.bill_retired(snap_all.model, end.instance_ids, gone, now)
            notes += [Note("retire-standby", end.reason, instance_id=i) for i in end.instance_ids]
        else:
            notes.append(Note("retire-failed", error))
    if launch is not None:
        done = await reconciler.launch([launch], list(infos.values()), now)
        await recorder.launched(done.got, now, "standby pool")
        notes += done.notes
    if stop is not None:
        await reconciler.stop(stop.instance_ids)
        stopped = [infos[iid] for iid in stop.instance_ids]
        await recorder.bill_stopped(snap_all.model, stopped, now, "standby idle")
        notes.append(Note("stop-standby", stop.reason, count=len(stop.instance_ids)))
    return notes
