"""The controller: one writer of the control state, driving snapshot → step → reconcile.

Three tasks ask it for decisions: the periodic step (every P_u), the SLO
monitor (every few seconds; after each check it also asks whether the load has
left what the last plan was made for, and if so plans at once: ``react``) and
spot notices. Each takes the same lock, so no
two steps interleave across an ``await``: an instance cannot be retired or
billed twice by a step and a notice racing each other. The decisions are the
pure steps of ``provisioner.step``, ``standby_step`` and ``orphan_step``; this
class reads their inputs from the ports and carries their outputs back out.

What a restart needs of the control state is saved in the store after every
task and restored when the controller takes over (``adopt``); only the
controller holding the cluster's lease in the database acts
(``mark.control.durable``).

While the store cannot be reached (``SqlStore.ping`` before each step), the controller
holds the fleet: no step plans on a history it cannot read, and the SLO monitor
launches no backup until a step finds the store back; a spot notice still starts
standbys (the cloud's view of the fleet is fresh) but its re-plan waits for that step.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from sqlalchemy.exc import SQLAlchemyError

from bouncer.miss_budget import MissTally
from mark.catalog import Catalog, Market, load_catalog
from mark.config import ModelSpec, Settings
from mark.control.adopt import adopt_fleet
from mark.control.durable import ControlStore, Durable
from mark.control.history import LoadHistory, cold_start_forecaster
from mark.control.reconcile import LIVE, Reconciler
from mark.control.recorder import Recorder
from mark.control.rollouts import Rollouts
from mark.control.snapshot import (
    explore_candidates,
    explore_config,
    health_config,
    monitor_config,
    orphan_config,
    snapshot,
    step_config,
    volume_per_hour,
)
from mark.control.step_runner import (
    Exploration,
    StepResult,
    launch_backups,
    retry_standby_starts,
    run_health_step,
    run_plan_step,
    start_standbys,
    sweep_orphans,
)
from mark.control.vanished import end_vanished
from mark.errors import StoreError
from mark.identity import frontend_id
from mark.ports import Clock, Draining, Fleet, InstanceInfo, InterruptionNotice, Store
from predictor.base import Forecaster
from predictor.online import OnlinePredictor
from provisioner.backup_step import backup_topup, backups_sized, load_wanted, slo_step
from provisioner.control_state import ControlState, Note, Rise, Snapshot, StepConfig, forget_gone
from provisioner.early_step import EARLY_WINDOWS, Window, fleet_capacity, plan_early
from provisioner.greedy import PlannerOption
from provisioner.health_step import HealthFact, with_readiness
from provisioner.rise_headroom import sizes_for_rises
from provisioner.spill_evidence import SpillCounts
from provisioner.spot import UNAVAILABLE_OFFERING_TTL_S, avoid_interrupted
from provisioner.standby_step import interruption_step
from provisioner.step import avoid_offering

log = logging.getLogger("mark.control")


@runtime_checkable
class Pingable(Protocol):
    """A store that can say whether it answers (``SqlStore``)."""

    async def ping(self) -> None: ...


@dataclass
class _Parts:
    history: LoadHistory
    recorder: Recorder
    reconciler: Reconciler


class Controller:
    """The control loop of one cluster: ``step``, ``check_slo``, ``on_interruption``."""

    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        store: Store,
        options: Mapping[str, Sequence[PlannerOption]],
        *,
        forecast: Forecaster | None = None,
        predictors: Mapping[str, OnlinePredictor] | None = None,
        boot_s: float = 90.0,
        catalog: Catalog | None = None,
        standby_capacity: Mapping[str, float] | None = None,
        standby_loss_fraction: float = 0.25,
        max_fallbacks: int = 3,
        unavailable_ttl_s: float = UNAVAILABLE_OFFERING_TTL_S,
        fixed_hourly: float = 0.0,
        profile_sources: Mapping[str, Mapping[str, str]] | None = None,
        cluster: str | None = None,
        holder: str | None = None,
    ) -> None:
        """``cluster``: the ownership tag's value (default: the fleet's ``cluster``, as
        ``AwsFleet`` has it; None: no instance is provably ours, so no orphan sweep, and
        no saved state or lease, which are per cluster). ``holder``: this controller's
        lease holder id (default: this process's ``frontend_id``)."""
        self.settings = settings
        self.fleet = fleet
        self.store = store
        self.options = dict(options)
        self.profile_sources = {m: dict(v) for m, v in (profile_sources or {}).items()}
        self.boot_s = boot_s
        self.catalog = catalog if catalog is not None else load_catalog()
        self.standby_capacity = dict(standby_capacity or {})
        self.standby_loss_fraction = standby_loss_fraction
        self.max_fallbacks = max_fallbacks
        self.unavailable_ttl_s = unavailable_ttl_s
        self.fixed_hourly = fixed_hourly
        self.state = ControlState()
        self.cluster = cluster if cluster is not None else getattr(fleet, "cluster", None)
        ctl = settings.control
        # Saved state and lease are per cluster: without its name (the simulator's fleet),
        # nothing is saved and no lease is needed.
        durable = store if isinstance(store, ControlStore) and self.cluster is not None else None
        self._durable = Durable(
            durable,
            self.cluster or "",
            holder if holder is not None else frontend_id(),
            ctl.lease_ttl_s if ctl.leader_lease else None,
        )
        self._timer = False
        """Whether ``hold_lease`` renews the lease: then acting between steps asks no database."""
        self._leading = False
        self._looked = False
        """Whether this controller acted at its last look at the lease, and has looked."""
        self.exploration = Exploration(
            explore_config(settings), explore_candidates(settings, self.catalog)
        )
        t = settings.timings
        self._parts = _Parts(
            LoadHistory(
                store,
                settings.predictor.history_minutes,
                t.update_period_s,
                dict(predictors or {}),
                forecast if forecast is not None else cold_start_forecaster(),
                settings.predictor.fit_history_minutes,
            ),
            Recorder(store, self.catalog, volume_per_hour(settings, self.catalog.ebs_gb_month)),
            Reconciler(fleet, t.update_period_s, unavailable_ttl_s),
        )
        self._lock = asyncio.Lock()
        self._store_up = True
        self._next_step_at = math.inf
        """When the control loop's next step is due (``react`` leaves the window before it)."""
        self.health: Callable[[], tuple[Mapping[str, HealthFact], float] | None] | None = None
        """Agents' health as the daemon sees it; None (the simulator): no health rules."""
        self.rollouts = Rollouts()
        """Models rolling to a new version (``roll_to``), and how to turn each back."""
        self._parts.reconciler.versions.update({m.name: m.version for m in settings.models})

    def roll_to(self, spec: ModelSpec, now: float) -> None:
        """Serve ``spec``'s version of its model from now on: the plan buys instances of it,
        and once they are ready the other versions' instances drain and end; if one never
        gets ready, the roll turns back (``rollouts.on_version``)."""
        old = next(m for m in self.settings.models if m.name == spec.name)
        self._use(spec)
        self.rollouts.start(old, spec, now)

    async def add_model(
        self,
        spec: ModelSpec,
        options: Sequence[PlannerOption],
        sources: Mapping[str, str],
        standby_capacity_rps: float,
        predictor: OnlinePredictor,
    ) -> None:
        """Serve a model added while mark runs: the next step plans it."""
        async with self._lock:
            models = (*[m for m in self.settings.models if m.name != spec.name], spec)
            self.settings = self.settings.model_copy(update={"models": models})
            self.options[spec.name] = list(options)
            self.profile_sources[spec.name] = dict(sources)
            self.standby_capacity[spec.name] = standby_capacity_rps
            history = self._parts.history
            history.predictors = {**history.predictors, spec.name: predictor}
            self._parts.reconciler.versions[spec.name] = spec.version

    async def remove_model(self, name: str) -> None:
        """Stop planning a model removed while mark runs: its instances are then the orphan
        sweep's (``removed-model``), ended after ``control.orphan_grace_s``."""
        async with self._lock:
            models = tuple(m for m in self.settings.models if m.name != name)
            self.settings = self.settings.model_copy(update={"models": models})
            for table in (self.options, self.profile_sources, self.standby_capacity):
                table.pop(name, None)
            self._parts.reconciler.versions.pop(name, None)
            self.rollouts.under_way.pop(name, None)
            self.rollouts.rolled_from.pop(name, None)

    async def note(self, model: str, now: float, notes: Sequence[Note]) -> None:
        """Record decisions taken outside a step (a version refused, a roll started)."""
        await self._parts.recorder.record(model, now, notes)

    def _use(self, spec: ModelSpec) -> None:
        models = tuple(spec if m.name == spec.name else m for m in self.settings.models)
        self.settings = self.settings.model_copy(update={"models": models})
        self._parts.reconciler.versions[spec.name] = spec.version

    @property
    def forecast(self) -> Forecaster:
        """The forecaster for models without a configured predictor."""
        return self._parts.history.fallback

    @forecast.setter
    def forecast(self, value: Forecaster) -> None:
        self._parts.history.fallback = value

    @property
    def draining(self) -> Draining | None:
        """Told before each termination: the daemon's dispatchers (``Draining``)."""
        return self._parts.reconciler.draining

    @draining.setter
    def draining(self, value: Draining | None) -> None:
        self._parts.reconciler.draining = value

    def price(self, instance_type: str, market: str) -> float:
        return self._parts.recorder.price(instance_type, market)

    def config_for(self, spec: ModelSpec) -> StepConfig:
        return step_config(
            self.settings,
            spec,
            boot_s=self.boot_s,
            price=self.price,
            standby_capacity_rps=self.standby_capacity.get(spec.name, 0.0),
            standby_loss_fraction=self.standby_loss_fraction,
            unavailable_ttl_s=self.unavailable_ttl_s,
            spill=self.state.of(spec.name).spill,
            ebs_gb_month=self.catalog.ebs_gb_month,
            options=self.options.get(spec.name, ()),
            interruptions=self.state.interruptions,
        )

    async def set_options(
        self,
        model: str,
        options: Sequence[PlannerOption],
        sources: Mapping[str, str],
        standby_capacity_rps: float,
    ) -> None:
        """New ratings of a model's offerings and of its standby type (a profile was
        measured); the next step uses them, as a restarted daemon would from the store."""
        async with self._lock:
            self.options[model] = list(options)
            self.profile_sources[model] = dict(sources)
            self.standby_capacity[model] = standby_capacity_rps

    def prometheus(self) -> str:
        """The control loop's counters for ``/metrics``."""
        return self._parts.recorder.prometheus()

    async def forecast_for(self, model: str, now: float, steps: int) -> list[float]:
        """The forecast for the next ``steps`` control steps, as the planner gets it unclipped."""
        return (await self._parts.history.forecast(model, now, steps)).values

    async def step(self, now: float, *, taking_over: bool = False) -> list[StepResult]:
        """One planning step for every model, then the orphan sweep; nothing (an empty
        list) while another controller holds the lease. ``taking_over``: only if this
        controller has not acted on the lease yet (``hold_lease`` saw it taken)."""
        async with self._lock:
            if taking_over and self._leading:
                return []
            self._next_step_at = now + self.settings.timings.update_period_s
            if not await self._store_answers(now) or not await self._lead(now):
                return []
            out = await self._step(now)
            await self._durable.save(self.state, now, evidence=True)
            return out

    async def react(self, now: float) -> list[StepResult]:
        """Between steps: plan at once for each model whose load has left what its last
        plan was made for (``provisioner.early_step``); nothing (an empty list) otherwise.

        Called after each SLO check, in the daemon and the simulator alike, once the
        P_s windows that closed have been written to the store."""
        if not self.settings.timings.early_steps:
            return []
        async with self._lock:
            if not self._store_up or not await self._may_act(now):
                return []
            early: dict[str, str] = {}
            for spec in self.settings.models:
                control = self.state.of(spec.name)
                in_time = control.spill.in_time()
                if not math.isfinite(control.planned_at) or not in_time:
                    continue  # (no early step without in-time spill: spare the store the read)
                try:
                    stored = await self.store.arrivals(spec.name, control.planned_at, now)
                except (StoreError, SQLAlchemyError, OSError) as exc:
                    log.debug("no early step: the store did not answer: %s", exc)
                    return []  # the next step finds out whether the store is back
                windows = [Window(w.window_start, w.window_s, w.rate) for w in stored]
                at = (control.planned_rps, control.planned_at, now, self._next_step_at)
                if plan_early(windows, *at, spill_in_time=in_time) is None:
                    continue
                # The load outran the plan: does it outrun the fleet too? (Listed only now.)
                snap = self._snapshot(spec.name, now, await self.fleet.list())
                view = self.health() if self.health is not None else None
                if view is not None:
                    snap = with_readiness(snap, view[0])
                capacity = fleet_capacity(snap, self.state, self.config_for(spec))
                due = plan_early(windows, *at, capacity_rps=capacity, spill_in_time=in_time)
                if due is not None:
                    early[spec.name] = due
            if not early:
                return []
            log.info("planning early: %s", "; ".join(f"{m}: {why}" for m, why in early.items()))
            out = await self._step(now, early)
            await self._durable.save(self.state, now, evidence=True)
            return out

    async def _step(self, now: float, early: Mapping[str, str] | None = None) -> list[StepResult]:
        """Every model's step (``early``: only these, each with why it runs early)."""
        out = []
        listed = await self.fleet.list()
        await end_vanished(self.store, self._parts.recorder, listed, now)
        configured = {m.name for m in self.settings.models}
        self.state = forget_gone(self.state, {i.instance_id for i in listed}, configured)
        self.state = replace(
            self.state,
            interruptions=self.state.interruptions.ran(
                sum(i.market is Market.SPOT and i.state in LIVE for i in listed),
                now,
                2 * self.settings.timings.update_period_s,
            ),
        )
        for spec in self.settings.models:
            if early is not None and spec.name not in early:
                continue
            # Listed again per model: the cluster's spend rail sees what earlier models bought.
            everything = await self.fleet.list()
            if any(p.model == spec.name for p in self.state.pending_starts.values()):
                started, self.state = await retry_standby_starts(
                    self._snapshot(spec.name, now, everything),
                    self.state,
                    self.config_for(spec),
                    everything,
                    self._parts.recorder,
                    self._parts.reconciler,
                )
                if started:
                    everything = await self.fleet.list()
            view = self.health() if self.health is not None else None
            facts = view[0] if view is not None else None
            everything, rolled = await self.rollouts.step(
                spec,
                now,
                everything,
                facts,
                self.price,
                health_config(self.settings, self.boot_s, self.unavailable_ttl_s).boot_deadline_s,
                self.settings.timings.update_period_s,
                self._parts.recorder,
                self._parts.reconciler,
            )
            if rolled is not spec:  # turned back to the version it rolled from
                self._use(rolled)
                spec = rolled
            if view is not None:
                replaced, self.state = await run_health_step(
                    spec.name,
                    now,
                    everything,
                    self.state,
                    view,
                    health_config(self.settings, self.boot_s, self.unavailable_ttl_s),
                    self.price,
                    self._parts.recorder,
                    self._parts.reconciler,
                )
                if replaced:
                    everything = await self.fleet.list()
            result, self.state = await run_plan_step(
                spec,
                now,
                everything,
                self.state,
                self.config_for(spec),
                self.options.get(spec.name, ()),
                self.fixed_hourly,
                self.profile_sources.get(spec.name, {}),
                self.max_fallbacks,
                self._parts.history,
                self._parts.recorder,
                self._parts.reconciler,
                facts,
                self.exploration,
                early=early.get(spec.name) if early is not None else None,
            )
            out.append(result)
        if early is None:
            await self._sweep(now)
        return out

    async def _sweep(self, now: float) -> None:
        """The orphan sweep over everything the cluster lists after this step's actions
        (none without a cluster name: nothing is provably ours)."""
        if self.cluster is None:
            return
        _, self.state = await sweep_orphans(
            await self.fleet.list(),
            now,
            self.state,
            orphan_config(
                self.settings,
                self.cluster,
                self.options,
                self.standby_capacity,
                self.standby_loss_fraction,
                boot_s=self.boot_s,
                ebs_gb_month=self.catalog.ebs_gb_month,
                interruptions=self.state.interruptions,
            ),
            self._parts.recorder,
            self._parts.reconciler,
        )

    def _snapshot(
        self,
        model: str,
        now: float,
        fleet: Sequence[InstanceInfo],
        carried_rise: Rise | None = None,
    ) -> Snapshot:
        return snapshot(
            model,
            now,
            fleet,
            self.price,
            self.options.get(model, ()),
            fixed_hourly=self.fixed_hourly,
            carried_rise=carried_rise,
        )

    async def _carried_rise(self, spec: ModelSpec, now: float, cfg: StepConfig) -> Rise | None:
        """The rise the plan's pool carries (``rise_headroom``), so a task outside the step
        rates the fleet as the plan does; None (stand-alone) while the store does not
        answer."""
        try:
            return await self._parts.history.rise_to_carry(
                spec.name, now, cfg, self.state.of(spec.name).misses
            )
        except (StoreError, SQLAlchemyError, OSError):
            return None

    async def record_spills(self, spills: Mapping[str, SpillCounts]) -> None:
        """Spilled requests that ended since the last call, per model: how many, how many
        within RT_max, what they were billed. They decide pooled capacity and the
        capacity target (``provisioner.spill_evidence``), in the daemon from its
        telemetry and in the simulator from its Lambda."""
        async with self._lock:
            for model, c in spills.items():
                if c.total > 0:
                    mine = self.state.of(model)
                    seen = mine.spill.observe(c.within, c.total, c.cost)
                    self.state = self.state.with_model(model, replace(mine, spill=seen))

    async def record_misses(self, tallies: Mapping[str, MissTally]) -> None:
        """Per model, the last hour's and the SLO period's arrivals and misses as just
        counted (``bouncer.miss_budget.MissBudget.count``): what a pool sized for rises may
        still leave to miss (``provisioner.rise_headroom``), in the daemon from its
        dispatchers and in the simulator from its engine."""
        async with self._lock:
            for model, tally in tallies.items():
                mine = self.state.of(model)
                self.state = self.state.with_model(model, replace(mine, misses=tally))

    async def check_slo(self, now: float, latencies: Mapping[str, Sequence[float]]) -> list[str]:
        """The SLO monitor (§4.4): launch backups at once when recent requests miss RT_max.

        ``latencies`` holds, per model, the latencies finished since the last call
        (inf for failures). Returns the ids of the backups launched. An offering out of
        capacity is avoided and the backups asked of the next one, as a plan step does.
        """
        async with self._lock:
            if not self._store_up or not await self._may_act(now):
                return []
            launched: list[str] = []
            for spec in self.settings.models:
                launched += await self._check_model_slo(spec, now, latencies.get(spec.name, ()))
            await self._durable.save(self.state, now)  # writes only when the hold-off changed
            return launched

    async def _check_model_slo(
        self, spec: ModelSpec, now: float, latencies: Sequence[float]
    ) -> list[str]:
        name = spec.name
        options = self.options.get(name, ())
        monitor = monitor_config(self.settings, spec, options, self._usable(options, now))
        if monitor is None:
            return []
        action, self.state = slo_step(self.state, name, now, monitor, latencies)
        wanted = load_wanted(self.state, name, now, action)
        observed = await self._recent_rate(name, now) if wanted else None
        if action is None:
            action = backup_topup(self.state, name, now, monitor, observed)
        launched: list[str] = []
        for _ in range(self.max_fallbacks + 1):
            if action is None:
                break
            fleet = await self.fleet.list()
            snap = self._snapshot(name, now, fleet)
            view = self.health() if self.health is not None else None
            if view is not None:
                snap = with_readiness(snap, view[0])
            done, self.state = await launch_backups(
                snap,
                fleet,
                self.config_for(spec),
                monitor,
                action,
                self.price(action.instance_type, action.market),
                self._parts.recorder,
                self._parts.reconciler,
                self.state,
                observed,
            )
            launched += [i.instance_id for i in done.got]
            if done.out_of_capacity is None:
                if done.failed == 0:
                    self.state = backups_sized(self.state, name, observed)
                break
            self.state = avoid_offering(
                self.state, done.out_of_capacity, now, self.unavailable_ttl_s
            )
            nxt = monitor_config(self.settings, spec, options, self._usable(options, now))
            if nxt is None or (nxt.instance_type, nxt.market) == done.out_of_capacity:
                break
            monitor = nxt
            action = replace(action, instance_type=nxt.instance_type, market=nxt.market)
        return launched

    def _usable(self, options: Sequence[PlannerOption], now: float) -> list[PlannerOption]:
        return avoid_interrupted(list(options), self.state.avoid, now)

    async def _recent_rate(self, model: str, now: float) -> float | None:
        """The model's load now: the higher rate of the last two P_s windows closed by
        ``now`` (as ``early_step`` reads them); None if none is stored or the store does
        not answer (the backups are then the configured L)."""
        span = self.settings.timings.sample_window_s
        try:
            stored = await self.store.arrivals(model, now - 3 * span, now)
        except (StoreError, SQLAlchemyError, OSError) as exc:
            log.debug("backups not sized: the store did not answer: %s", exc)
            return None
        closed = sorted(
            (w for w in stored if w.window_start + w.window_s <= now + 1e-9),
            key=lambda w: w.window_start,
        )[-EARLY_WINDOWS:]
        return max((w.rate for w in closed), default=None)

    async def on_interruption(self, notice: InterruptionNotice, now: float) -> list[str]:
        """A spot instance will be reclaimed (§4.5): start standbys at once, then re-plan.

        Returns the standbys started. Notices for instances mark does not own (or of a
        model no longer configured: the orphan sweep's), and repeated notices, change
        nothing, except that a start the cloud refused is tried again: the notice is
        remembered (the instance doomed, its offering avoided) and the start owed, so a
        repeated notice, or else the next step, retries it.
        """
        async with self._lock:
            if not await self._may_act(now):
                return []
            fleet = await self.fleet.list()
            inst = next((i for i in fleet if i.instance_id == notice.instance_id), None)
            if inst is None or notice.kind != "interruption":
                return []
            if inst.model not in {m.name for m in self.settings.models}:
                return []
            spec = self.settings.model(inst.model)
            cfg = self.config_for(spec)
            rise = await self._carried_rise(spec, now, cfg) if sizes_for_rises(cfg) else None
            snap = self._snapshot(inst.model, now, fleet, rise)
            res = interruption_step(snap, self.state, cfg, inst.instance_id, notice.action_at)
            if res is None:  # a repeat: only what an earlier notice still owes
                started, self.state = await retry_standby_starts(
                    snap, self.state, cfg, fleet, self._parts.recorder, self._parts.reconciler
                )
            else:
                started, self.state = await start_standbys(
                    res, inst, fleet, now, self._parts.recorder, self._parts.reconciler
                )
                if await self._store_answers(now):  # else the first step after the outage
                    await self._step(now)  # replacements now, avoiding the interrupted offering
            await self._durable.save(self.state, now)
            return started

    async def adopt(self, now: float) -> list[InstanceInfo]:
        """Take over, after a (re)start, what the cloud's tags say this cluster owns
        (``mark.control.adopt``) and the control state saved before; nothing is launched.
        While another controller holds the lease, nothing (the step takes over later)."""
        async with self._lock:
            if not await self._lead(now):
                return []
            return await self._take_over(now)

    async def resign(self) -> None:
        """Give the lease up at once (a clean stop), so a standby controller takes over
        at its next step instead of after the lease runs out."""
        async with self._lock:
            await self._durable.resign()
            self._leading = False

    async def _store_answers(self, now: float) -> bool:
        """Whether the store answers; the first failure and the recovery are logged and
        recorded (``store-unavailable``, ``store-back``: written once it answers)."""
        if not isinstance(self.store, Pingable):
            return True
        try:
            await self.store.ping()
        except StoreError as exc:
            if self._store_up:
                log.warning("%s: holding the fleet, planning nothing until it answers", exc)
                await self._note_store("store-unavailable", f"{exc}; fleet held", now)
            self._store_up = False
            return False
        if not self._store_up:
            log.info("the store answers again: planning resumes")
            await self._note_store("store-back", "the store answers again; planning resumes", now)
        self._store_up = True
        return True

    async def _note_store(self, action: str, why: str, now: float) -> None:
        for spec in self.settings.models:
            try:  # buffered by the store's outbox; without one, only the log has it
                await self._parts.recorder.record(spec.name, now, [Note(action, why)])
            except (StoreError, SQLAlchemyError, OSError) as exc:
                log.warning("cannot record %s: %s", action, exc)

    async def _may_act(self, now: float) -> bool:
        """Whether to act between steps: the lease last taken still lasts, or (without
        ``hold_lease``'s timer, which takes it over by itself) it can be taken now."""
        return self._durable.leading(now) or (not self._timer and await self._lead(now))

    def leading(self, now: float) -> bool:
        """Whether this controller holds the lease now, as last renewed (no database call):
        what leader-only work (the spot notice queue, spill warm-up, CloudWatch) checks."""
        return self._durable.leading(now) and (self._leading or self._durable.renew_every_s is None)

    async def hold_lease(self, clock: Clock) -> None:
        """Renew the lease every third of its TTL until cancelled, apart from the steps, so
        a long step cannot let it lapse; on taking it over, adopt the fleet and the saved
        state and plan at once, as a restart does (a new leader acts within the TTL and one
        renewal). Nothing to do without a lease. Start it after ``adopt``."""
        every = self._durable.renew_every_s
        if every is None:
            return
        self._timer = True
        try:
            while True:
                await clock.sleep(every)
                try:
                    now = clock.now()
                    leads = await self._durable.lead(now)
                    if leads and not self._leading:
                        await self.step(now, taking_over=True)
                    elif not leads and self._leading:
                        log.warning("the control lease passed to another controller")
                        self._leading = False
                except Exception:  # the next renewal retries; the lease lapses if none can
                    log.exception("renewing the control lease failed")
        finally:
            self._timer = False

    async def _lead(self, now: float) -> bool:
        """Whether this controller may act now. Taking the lease from another controller
        (not at start: the daemon calls ``adopt``) restores the saved state and adopts the
        fleet first."""
        leads = await self._durable.lead(now)
        took_over = leads and not self._leading and self._looked
        self._leading, self._looked = leads, True
        if took_over:
            await self._take_over(now)
        return leads

    async def _take_over(self, now: float) -> list[InstanceInfo]:
        saved = await self._durable.restore(self.state)
        if saved is not None:
            self.state = saved
        fleet, self.state = await adopt_fleet(
            self.fleet, self.store, self._parts.recorder, self.settings, self.state, now
        )
        self.state = forget_gone(self.state, {i.instance_id for i in fleet})
        await self._durable.save(self.state, now)
        return fleet

    async def run(self, clock: Clock) -> None:
        """Repeat ``step`` every P_u until cancelled; a failed step is logged, not fatal."""
        while True:
            try:
                await self.step(clock.now())
            except Exception:
                log.exception("control-loop step failed")
            await clock.sleep(self.settings.timings.update_period_s)


__all__ = ["LIVE", "Controller", "StepResult"]
