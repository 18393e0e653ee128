"""The control loop: each P_u, forecast → plan → guards → fleet, and the plan recorded.

``Controller.step(now)`` is one step, callable directly with any ``now`` (the
simulator and the tests drive it); ``run`` only repeats it on a clock. The
decisions are the pure policies of ``provisioner`` and ``predictor``; this
module reads their inputs from the ports and carries their outputs back out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bouncer.latency import BatchLatency
from mark.billing import ec2_charge
from mark.catalog import Catalog, Market, load_catalog
from mark.config import ModelSpec, Settings
from mark.errors import CloudError, InsufficientCapacity, UnknownOffering
from mark.ports import (
    Clock,
    Fleet,
    InstanceInfo,
    InstanceRole,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    Store,
)
from mark.state.records import ArrivalWindow, Decision, InstanceRecord, LedgerEntry, PlanRecord
from predictor.base import Forecaster, History
from predictor.baselines import PaperFallback
from predictor.online import COLD_START_WINDOW, OnlinePredictor, RefitPolicy
from provisioner.batching import tune_batching
from provisioner.forecast_sanity import ForecastBounds, clip_forecast
from provisioner.greedy import NoFeasibleOption, Plan, PlannerOption, RunningInstance, plan_greedy
from provisioner.guards import Decision as GuardDecision
from provisioner.guards import FleetInstance, GuardConfig, GuardState, RawDecision, apply_guards
from provisioner.options import planner_option
from provisioner.perf_model import InstancePerf
from provisioner.slo_monitor import (
    SloMonitorConfig,
    SloMonitorState,
    observe_latencies,
    slo_at_risk,
)
from provisioner.spend_rails import RailHit, Spend, SpendLimits, within_rails
from provisioner.spot import (
    UNAVAILABLE_OFFERING_TTL_S,
    InterruptionMemory,
    SpotHolding,
    Standby,
    avoid_interrupted,
    on_interruption_notice,
    record_interruption,
    standby_pool_size,
    standbys_to_stop,
)

log = logging.getLogger("mark.controller")

PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)
LIVE = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.READY}


def max_rate_per_minute(
    windows: Sequence[ArrivalWindow], start: float, minutes: int
) -> list[float]:
    """The paper's series: for each minute, the highest rate of its P_s sample windows.

    A minute with no windows recorded is NaN, missing: the daemon records
    every window while it runs, empty ones as zeros, so a minute without any
    is one it did not see (before it started, or while it was down), and a
    forecaster must not learn it as zero load.
    """
    out = [math.nan] * minutes
    for w in windows:
        k = math.floor((w.window_start - start) / 60.0)
        if 0 <= k < minutes:
            out[k] = w.rate if math.isnan(out[k]) else max(out[k], w.rate)
    return out


def launch_token(
    model: str, instance_type: str, market: str, role: InstanceRole, step: int, seen: int
) -> str:
    """The client token of one launch decision, the same whenever the decision is.

    A decision is "in control step ``step``, with ``seen`` live instances of this
    model, offering and role, launch more": a controller that crashes after
    launching and re-runs the step before the cloud lists the new instances
    makes the same decision with the same token, and the fleet returns the
    first launch instead of buying again. A later launch in the same step sees
    the earlier one's instances, so its token differs. The count is left out on
    purpose: a re-run that wants a different number still must not buy twice.
    """
    return f"{model}/{instance_type}/{market}/{role.value}/step-{step}/seen-{seen}"


def cold_start_forecaster() -> Forecaster:
    """The forecaster used when no predictor is configured for a model: the paper's
    fallback over the last hour (``predictor.baselines.PaperFallback``)."""
    return PaperFallback(window=COLD_START_WINDOW)


def build_options(
    spec: ModelSpec,
    catalog: Catalog,
    types: Sequence[str],
    markets: Sequence[Market],
    latency_by_type: Mapping[str, BatchLatency],
    boot_s: float,
) -> list[PlannerOption]:
    """Planner options for one model: batching tuned per type, capacity under the SLO."""
    rt_max_s = spec.slo.rt_max_ms / 1000.0
    options = []
    for itype in types:
        latency = latency_by_type.get(itype)
        if latency is None:
            continue
        try:
            cfg = tune_batching({b: latency(b) for b in PROFILE_BATCHES}, rt_max_s)
        except ValueError as exc:  # even one request at a time misses RT_max
            log.info("%s cannot serve %s within the SLO: %s", itype, spec.name, exc)
            continue
        perf = InstancePerf(latency(cfg.n_batch), cfg.n_batch, cfg.w_batch_s)
        for market in markets:
            try:
                price = catalog.offering(itype, market).price_per_hour
            except UnknownOffering:
                continue
            options.append(
                planner_option(
                    itype,
                    market.value,
                    price,
                    perf,
                    rt_max_s=rt_max_s,
                    sl_min=spec.slo.sl_min,
                    boot_s=boot_s,
                )
            )
    return options


@dataclass
class _Launched:
    launched: list[InstanceInfo]
    key: tuple[str, str] | None  # the offering that ran out of capacity, if one did


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


@dataclass
class Controller:
    settings: Settings
    fleet: Fleet
    store: Store
    options: Mapping[str, Sequence[PlannerOption]]
    forecast: Forecaster = field(default_factory=cold_start_forecaster)
    predictors: Mapping[str, OnlinePredictor] = field(default_factory=dict)
    boot_s: float = 90.0
    catalog: Catalog = field(default_factory=load_catalog)
    _guards: dict[str, GuardState] = field(default_factory=dict)
    _slo: dict[str, SloMonitorState] = field(default_factory=dict)
    standby_capacity: Mapping[str, float] = field(default_factory=dict)  # r/s per model
    standby_loss_fraction: float = 0.25
    _memory: InterruptionMemory = field(default_factory=InterruptionMemory)
    _doomed: dict[str, float] = field(default_factory=dict)  # instance id -> reclaim time
    _hold_standbys: dict[str, float] = field(default_factory=dict)  # model -> until when
    _series: dict[str, dict[float, ArrivalWindow]] = field(default_factory=dict)
    _fetched: dict[str, float] = field(default_factory=dict)
    max_fallbacks: int = 3  # re-plans per step after offerings out of capacity
    unavailable_ttl_s: float = UNAVAILABLE_OFFERING_TTL_S
    fixed_hourly: float = 0.0  # $/h paid whatever the fleet (provisioned concurrency)
    rail_hits: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, rail) -> n
    forecast_clips: dict[str, int] = field(default_factory=dict)  # model -> n

    def _limits(self) -> SpendLimits:
        b = self.settings.budget
        return SpendLimits(b.max_hourly_per_model, b.max_hourly_cluster)

    def _spend(self, model: str, fleet: Sequence[InstanceInfo], gone: Sequence[str] = ()) -> Spend:
        """What is paid per hour now for ``model`` and for the cluster, without ``gone``."""
        left = set(gone)
        model_cost = cluster_cost = 0.0
        for i in fleet:
            if i.state not in LIVE or i.instance_id in left:
                continue
            price = self._price(i.instance_type, i.market.value)
            cluster_cost += price
            if i.model == model:
                model_cost += price
        return Spend(model_cost, cluster_cost + self.fixed_hourly)

    def _rail_decisions(self, model: str, now: float, hits: Sequence[RailHit]) -> list[Decision]:
        """Each rail hit as a decision row, a warning in the log and a /metrics count."""
        out = []
        for h in hits:
            why = h.explain()
            log.warning("%s: %s", model, why)
            self.rail_hits[(model, h.rail)] = self.rail_hits.get((model, h.rail), 0) + 1
            itype, market = h.key
            out.append(Decision(model, now, "spend-rail", why, itype, market, h.wanted - h.allowed))
        return out

    def prometheus(self) -> str:
        """The control loop's counters for ``/metrics``: spend-rail hits, forecast clips."""
        lines = [
            f'mark_spend_rail_hits_total{{model="{m}",rail="{r}"}} {n}'
            for (m, r), n in sorted(self.rail_hits.items())
        ]
        lines += [
            f'mark_forecast_clips_total{{model="{m}"}} {n}'
            for m, n in sorted(self.forecast_clips.items())
        ]
        return "".join(line + "\n" for line in lines)

    async def check_slo(self, now: float, latencies: Mapping[str, Sequence[float]]) -> list[str]:
        """The SLO monitor (§4.4): launch backups at once when recent requests miss RT_max.

        ``latencies`` holds, per model, the latencies finished since the last call
        (inf for failures). Returns the ids of the backups launched.
        """
        mon = self.settings.slo_monitor
        launched: list[str] = []
        for spec in self.settings.models:
            cfg = SloMonitorConfig(
                rt_max_s=spec.slo.rt_max_ms / 1000.0,
                sl_min=spec.slo.sl_min,
                window=mon.last_m,
                launch_count=mon.launch_l,
                instance_type=mon.instance_type,
                holdoff_s=mon.holdoff_s,
            )
            action, self._slo[spec.name] = observe_latencies(
                self._slo.get(spec.name, SloMonitorState()),
                latencies.get(spec.name, ()),
                now,
                cfg,
            )
            if action is None:
                continue
            why = (
                f"only {action.service_level:.1%} of the last {mon.last_m} requests met "
                f"RT_max {spec.slo.rt_max_ms:g} ms (SL_min {spec.slo.sl_min:.0%})"
            )
            market = Market(action.market)
            try:
                fleet = await self.fleet.list()
                allowed, hits, _ = within_rails(
                    [
                        (
                            (action.instance_type, action.market),
                            action.count,
                            self._price(action.instance_type, action.market),
                        )
                    ],
                    self._spend(spec.name, fleet),
                    self._limits(),
                )
                if hits:
                    await self._record_decisions(self._rail_decisions(spec.name, now, hits))
                if not allowed:
                    continue
                count = allowed[0][1]
                seen = _count(fleet, spec.name, action.instance_type, market, InstanceRole.BACKUP)
                got = await self.fleet.launch(
                    LaunchRequest(
                        spec.name,
                        action.instance_type,
                        market,
                        count,
                        InstanceRole.BACKUP,
                        launch_token(
                            spec.name,
                            action.instance_type,
                            market.value,
                            InstanceRole.BACKUP,
                            self._step_index(now),
                            seen,
                        ),
                    )
                )
            except CloudError as exc:
                await self.store.record_decision(
                    Decision(spec.name, now, "backup-failed", f"{why}: {exc}", action.instance_type)
                )
                continue
            launched += [i.instance_id for i in got]
            await self._record_launched(got, now, "SLO monitor")
            await self.store.record_decision(
                Decision(
                    spec.name,
                    now,
                    "backup",
                    why,
                    action.instance_type,
                    action.market,
                    count,
                )
            )
        return launched

    async def _record_decisions(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            await self.store.record_decision(d)

    async def adopt(self, now: float) -> list[InstanceInfo]:
        """Take over, after a (re)start, whatever the cloud's tags say this cluster owns.

        Each owned instance is recorded in the store and counts as wanted now,
        so the cool-down starts afresh rather than retiring a fleet the old
        controller had just been using; the next step plans with them and
        launches only what they do not cover. Instances the store still holds
        as live that the cloud no longer lists are marked terminated. Nothing
        is launched here.
        """
        fleet = await self.fleet.list()
        for inst in fleet:
            await self._set_state(inst, inst.state, now, "adopted after a restart")
        listed = {i.instance_id for i in fleet}
        live = [s.value for s in InstanceState if s is not InstanceState.TERMINATED]
        for rec in await self.store.instances(states=live):
            if rec.instance_id not in listed:
                await self.store.set_instance_state(
                    rec.instance_id,
                    InstanceState.TERMINATED.value,
                    now,
                    reason="no longer in the cloud at restart",
                )
        for spec in self.settings.models:
            mine = [i for i in fleet if i.model == spec.name]
            wanted = dict(self._guards.get(spec.name, GuardState()).last_wanted)
            wanted.update({i.instance_id: now for i in mine})
            self._guards[spec.name] = GuardState(wanted)
            if mine:
                await self.store.record_decision(
                    Decision(
                        spec.name,
                        now,
                        "adopt",
                        f"{len(mine)} instance(s) found by this cluster's tags at start",
                        count=len(mine),
                    )
                )
        return fleet

    def _step_index(self, now: float) -> int:
        return math.floor(now / self.settings.timings.update_period_s)

    async def step(self, now: float) -> list[StepResult]:
        out = []
        for m in self.settings.models:
            # Listed again per model: the cluster's spend rail sees what earlier models bought.
            out.append(await self._step_model(m, now, await self.fleet.list()))
        return out

    def _plan(
        self,
        spec: ModelSpec,
        now: float,
        fleet: Sequence[InstanceInfo],
        forecast: Sequence[float],
        by_key: Mapping[tuple[str, str], PlannerOption],
    ) -> tuple[Plan, GuardDecision, GuardState, list[InstanceInfo], list[RailHit]]:
        """Plan over the offerings not being avoided, then the guards and the spend rails;
        nothing is done yet.

        Returns the plan, the guarded decision, the guard state to keep if it is
        carried out, this model's serving instances the plan counted, and what
        the spend rails held back.
        """
        t = self.settings.timings
        step_s = t.update_period_s
        options = avoid_interrupted(list(by_key.values()), self._memory, now)
        # Backups the SLO monitor launched join the fleet the planner keeps or retires.
        mine = [
            i
            for i in fleet
            if i.model == spec.name and i.role in (InstanceRole.SERVING, InstanceRole.BACKUP)
        ]
        # An instance with an interruption notice is reclaimed within minutes: plan without it.
        mine = [i for i in mine if i.instance_id not in self._doomed]
        running = []
        for i in mine:
            opt = by_key.get((i.instance_type, i.market.value))
            if opt is None:
                continue
            ready_at = i.launched_at + self.boot_s
            steps_left = (
                0 if i.state is InstanceState.READY else math.ceil((ready_at - now) / step_s)
            )
            running.append(RunningInstance(i.instance_id, opt, max(0, steps_left)))
        plan = plan_greedy(
            forecast,
            running,
            options,
            slo_s=spec.slo.rt_max_ms / 1000.0,
            step_s=step_s,
            tau_steps=max(1, round(t.lead_time_s / step_s)),
        )
        guard_cfg = GuardConfig(
            t.cooldown_s, t.billing_minimum_s, self.settings.offerings.max_instances
        )
        members = [
            FleetInstance(i.instance_id, (i.instance_type, i.market.value), i.launched_at)
            for i in mine
        ]
        decision, state = apply_guards(
            RawDecision.from_plan(plan),
            members,
            self._guards.get(spec.name, GuardState()),
            now,
            guard_cfg,
            hold=slo_at_risk(self._slo.get(spec.name, SloMonitorState()), now),
        )
        allowed, hits, _ = within_rails(
            [(key, n, by_key[key].price_per_hour) for key, n in decision.launch],
            self._spend(spec.name, fleet, gone=decision.retire),
            self._limits(),
        )
        decision = replace(decision, launch=tuple(allowed))
        return plan, decision, state, mine, hits

    async def _launch(
        self,
        spec: ModelSpec,
        now: float,
        plan: Plan,
        decision: GuardDecision,
        fleet: Sequence[InstanceInfo],
        decisions: list[Decision],
    ) -> _Launched:
        """Carry out the decision's launches, stopping at the first offering out of capacity."""
        out = _Launched([], None)
        for (itype, market), count in decision.launch:
            seen = _count(fleet, spec.name, itype, Market(market), InstanceRole.SERVING)
            token = launch_token(
                spec.name, itype, market, InstanceRole.SERVING, self._step_index(now), seen
            )
            try:
                got = await self.fleet.launch(
                    LaunchRequest(
                        spec.name, itype, Market(market), count, InstanceRole.SERVING, token
                    )
                )
            except InsufficientCapacity as exc:
                ttl = self.unavailable_ttl_s
                why = f"{exc}; avoided for {ttl:g} s, planning again without it"
                decisions.append(
                    Decision(spec.name, now, "launch-unavailable", why, itype, market, count)
                )
                out.key = (itype, market)
                return out
            except CloudError as exc:
                decisions.append(
                    Decision(spec.name, now, "launch-failed", str(exc), itype, market, count)
                )
                continue
            out.launched.extend(got)
            await self._record_launched(got, now, "planner")
            why = next(
                (it.explain() for it in plan.launch_items() if it.option.key == (itype, market)), ""
            )
            decisions.append(Decision(spec.name, now, "launch", why, itype, market, count))
        return out

    async def _step_model(
        self, spec: ModelSpec, now: float, everything: Sequence[InstanceInfo]
    ) -> StepResult:
        # Stopped standbys are not live, but they are the pool: count them there.
        fleet = [i for i in everything if i.state in LIVE]
        t = self.settings.timings
        raw, peak = await self._forecast_and_peak(spec.name, now, t.window_steps)
        bounds = ForecastBounds(self.settings.predictor.max_forecast_multiple, spec.max_rate_rps)
        forecast, clip = clip_forecast(raw, peak, bounds)
        by_key = {o.key: o for o in self.options.get(spec.name, ())}
        launched: list[InstanceInfo] = []
        decisions: list[Decision] = []
        if clip is not None:
            log.warning("%s: %s", spec.name, clip.why)
            self.forecast_clips[spec.name] = self.forecast_clips.get(spec.name, 0) + 1
            decisions.append(Decision(spec.name, now, "forecast-clipped", clip.why))
        exhausted = False
        # An offering out of capacity is avoided for a while and the step plans again
        # without it (what it launched before counts as running), a bounded number of times.
        for attempt in range(self.max_fallbacks + 1):
            try:
                plan, decision, guard_state, mine, hits = self._plan(
                    spec, now, fleet, forecast, by_key
                )
            except NoFeasibleOption as exc:
                if attempt == 0:
                    return StepResult(spec.name, forecast, None, [], [], [], 0.0, error=str(exc))
                exhausted = True
                decisions.append(Decision(spec.name, now, "fallback-exhausted", str(exc)))
                break
            decisions += self._rail_decisions(spec.name, now, hits)
            out_of_capacity = await self._launch(spec, now, plan, decision, fleet, decisions)
            launched += out_of_capacity.launched
            if out_of_capacity.key is None:
                break
            self._memory = record_interruption(
                self._memory, out_of_capacity.key, now, self.unavailable_ttl_s
            )
            if attempt == self.max_fallbacks:
                exhausted = True
                decisions.append(
                    Decision(
                        spec.name,
                        now,
                        "fallback-exhausted",
                        f"{self.max_fallbacks} fallback(s) in this step; the rest waits for "
                        "the next step",
                    )
                )
                break
            fleet = [i for i in await self.fleet.list() if i.state in LIVE]
        self._guards[spec.name] = guard_state
        if exhausted:  # the plan's retirements counted on capacity that did not come
            decision = replace(decision, retire=())
        if decision.retire:
            try:
                await self.fleet.terminate(list(decision.retire))
                for iid in decision.retire:
                    decisions.append(
                        Decision(spec.name, now, "retire", "cool-down over", instance_id=iid)
                    )
                await self._bill_retired(spec.name, decision.retire, mine, now)
            except CloudError as exc:
                decisions.append(Decision(spec.name, now, "retire-failed", str(exc)))
        known = {i.instance_id for i in mine}
        serving = [*mine, *(i for i in launched if i.instance_id not in known)]
        decisions += await self._standbys(spec, now, everything, serving, by_key, forecast)
        plan_id = await self.store.record_plan(
            PlanRecord(
                model=spec.name,
                at=now,
                planner="greedy",
                forecast=forecast,
                horizon_cost=plan.cost_per_hour,
                explanation={
                    "lines": plan.explain(),
                    "held": [list(h) for h in decision.held],
                    "shortfall": [list(x) for x in plan.shortfall],
                },
                decisions=decisions,
            )
        )
        return StepResult(
            spec.name,
            forecast,
            plan_id,
            launched,
            list(decision.retire),
            list(decision.held),
            max((r for _, r in plan.shortfall), default=0.0),
        )

    async def on_interruption(self, notice: InterruptionNotice, now: float) -> list[str]:
        """A spot instance will be reclaimed (§4.5): start standbys at once, then re-plan.

        Returns the standbys started. Notices for instances mark does not own, and
        repeated notices, change nothing.
        """
        fleet = await self.fleet.list()
        inst = next((i for i in fleet if i.instance_id == notice.instance_id), None)
        if inst is None or notice.instance_id in self._doomed or notice.kind != "interruption":
            return []
        reclaim_at = notice.action_at if notice.action_at is not None else now + 120.0
        self._doomed[inst.instance_id] = reclaim_at
        key = (inst.instance_type, inst.market.value)
        opt = next((o for o in self.options.get(inst.model, ()) if o.key == key), None)
        lost = opt.capacity_rps if opt is not None else 0.0
        cap = self.standby_capacity.get(inst.model, 0.0)
        stopped = [
            Standby(i.instance_id, cap)
            for i in fleet
            if i.model == inst.model
            and i.role is InstanceRole.STANDBY
            and i.state is InstanceState.STOPPED
        ]
        response = on_interruption_notice(key, lost, stopped, self._memory, now)
        self._memory = response.memory
        start = list(response.start)
        if start:
            standby_type = next(i.instance_type for i in fleet if i.instance_id == start[0])
            allowed, hits, _ = within_rails(
                [
                    (
                        (standby_type, Market.ON_DEMAND.value),
                        len(start),
                        self._price(standby_type, Market.ON_DEMAND.value),
                    )
                ],
                self._spend(inst.model, fleet),
                self._limits(),
            )
            start = start[: allowed[0][1]] if allowed else []
            await self._record_decisions(self._rail_decisions(inst.model, now, hits))
        # Standbys carry the lost capacity until the instance is gone and replacements,
        # launched now, have booted; only then may the load decide to stop them.
        self._hold_standbys[inst.model] = max(
            self._hold_standbys.get(inst.model, 0.0), reclaim_at + self.boot_s
        )
        if start:
            await self.fleet.start(start)
            by_id = {i.instance_id: i for i in fleet}
            for iid in start:
                await self._set_state(by_id[iid], InstanceState.PENDING, now, "standby started")
        why = (
            f"spot interruption of {inst.instance_id} ({inst.instance_type}) at t={reclaim_at:g}: "
            f"{lost:.1f} r/s lost, {len(start)} standby(s) started, "
            f"{response.uncovered_rps:.1f} r/s left to Lambda until replacements serve"
        )
        await self.store.record_decision(
            Decision(
                inst.model,
                now,
                "start-standby",
                why,
                instance_id=inst.instance_id,
                count=len(start),
            )
        )
        await self._bill_retired(inst.model, [inst.instance_id], [inst], reclaim_at)
        await self.step(now)  # replacements now, avoiding the interrupted offering
        return start

    async def _standbys(
        self,
        spec: ModelSpec,
        now: float,
        fleet: Sequence[InstanceInfo],
        serving: Sequence[InstanceInfo],
        by_key: Mapping[tuple[str, str], PlannerOption],
        forecast: Sequence[float],
    ) -> list[Decision]:
        """Keep the stopped-standby pool sized to the spot capacity at risk; stop started
        standbys once ready replacements cover the load."""
        cap = self.standby_capacity.get(spec.name, 0.0)
        types = self.settings.offerings.standby_types
        if cap <= 0 or not types:
            return []
        out: list[Decision] = []
        standbys = [
            i
            for i in fleet
            if i.model == spec.name
            and i.role is InstanceRole.STANDBY
            and i.state is not InstanceState.TERMINATED
        ]
        holdings: dict[tuple[str, str], int] = {}
        for i in serving:
            if i.market is Market.SPOT:
                k = (i.instance_type, i.market.value)
                holdings[k] = holdings.get(k, 0) + 1
        spot = [
            SpotHolding(k, n, by_key[k].capacity_rps) for k, n in holdings.items() if k in by_key
        ]
        want = standby_pool_size(spot, cap, self.standby_loss_fraction) if spot else 0
        known = {i.instance_id for i in fleet}
        pool_launch = 0
        if len(standbys) < want:
            # A new standby runs until it has booted and is stopped: it is spend meanwhile.
            allowed, hits, _ = within_rails(
                [
                    (
                        (types[0], Market.ON_DEMAND.value),
                        want - len(standbys),
                        self._price(types[0], Market.ON_DEMAND.value),
                    )
                ],
                self._spend(
                    spec.name, [*fleet, *(i for i in serving if i.instance_id not in known)]
                ),
                self._limits(),
            )
            out += self._rail_decisions(spec.name, now, hits)
            pool_launch = allowed[0][1] if allowed else 0
        if pool_launch > 0:
            got = await self.fleet.launch(
                LaunchRequest(
                    spec.name,
                    types[0],
                    Market.ON_DEMAND,
                    pool_launch,
                    InstanceRole.STANDBY,
                    launch_token(
                        spec.name,
                        types[0],
                        Market.ON_DEMAND.value,
                        InstanceRole.STANDBY,
                        self._step_index(now),
                        len(standbys),
                    ),
                )
            )
            await self._record_launched(got, now, "standby pool")
            out.append(
                Decision(
                    spec.name,
                    now,
                    "launch-standby",
                    f"pool of {want} covers the spot capacity at risk",
                    types[0],
                    "on-demand",
                    len(got),
                )
            )
        # Freshly launched standbys are stopped once they have booted (EC2 cannot launch
        # straight into "stopped"); started ones are stopped once replacements serve.
        ready = sum(
            by_key[(i.instance_type, i.market.value)].capacity_rps
            for i in serving
            if i.state in (InstanceState.RUNNING, InstanceState.READY)
            and now >= i.launched_at + self.boot_s  # booted and serving, not just "running"
            and (i.instance_type, i.market.value) in by_key
        )
        need = max(0.0, (forecast[0] if forecast else 0.0) - ready)
        active = [
            Standby(i.instance_id, cap)
            for i in standbys
            if i.state in (InstanceState.RUNNING, InstanceState.READY)
        ]
        held = now < self._hold_standbys.get(spec.name, -math.inf)
        to_stop = standbys_to_stop(active, need) if active and not held else ()
        if to_stop:
            await self.fleet.stop(list(to_stop))
            by_id = {i.instance_id: i for i in standbys}
            for iid in to_stop:
                await self._set_state(by_id[iid], InstanceState.STOPPED, now, "standby idle")
            out.append(
                Decision(
                    spec.name,
                    now,
                    "stop-standby",
                    f"replacements cover all but {need:.1f} r/s",
                    count=len(to_stop),
                )
            )
        return out

    def _price(self, instance_type: str, market: str) -> float:
        try:
            return self.catalog.offering(instance_type, market).price_per_hour
        except UnknownOffering:
            return 0.0

    async def _record_launched(self, got: Sequence[InstanceInfo], now: float, why: str) -> None:
        for inst in got:
            await self._set_state(inst, inst.state, now, why)

    async def _set_state(
        self, inst: InstanceInfo, state: InstanceState, now: float, why: str
    ) -> None:
        """Record an instance's state (inserting it if the store has not seen it: an
        instance adopted from the cloud, or launched by hand)."""
        await self.store.upsert_instance(
            InstanceRecord(
                inst.instance_id,
                inst.model,
                inst.instance_type,
                inst.market.value,
                inst.role.value,
                state.value,
                self._price(inst.instance_type, inst.market.value),
                inst.launched_at,
                now,
                inst.address,
            ),
            reason=why,
        )

    async def _history(self, model: str, now: float) -> tuple[float, list[float]]:
        """Max rate per minute of the last ``history_minutes`` minutes, the last one ending now.

        The minutes slide with ``now`` instead of being cut at wall-clock
        minute boundaries, so with P_u < 60 s each step sees the load of the
        last 60 s, not the last whole minute (up to a minute stale). The 5 s
        windows are kept in memory between steps: only windows since the last
        step (and the two minutes before, for late ones) are read from the store.
        """
        minutes = self.settings.predictor.history_minutes
        start = now - minutes * 60.0
        cache = self._series.setdefault(model, {})
        since = max(start, self._fetched.get(model, start) - 120.0)
        for w in await self.store.arrivals(model, since, now):
            cache[w.window_start] = w
        self._fetched[model] = now
        for key in [k for k in cache if k < start]:
            del cache[key]
        return start, max_rate_per_minute(list(cache.values()), start, minutes)

    async def _forecast(self, model: str, now: float, steps: int) -> list[float]:
        """The forecast max rate for each of the next ``steps`` control steps, unclipped."""
        return (await self._forecast_and_peak(model, now, steps))[0]

    async def _forecast_and_peak(
        self, model: str, now: float, steps: int
    ) -> tuple[list[float], float]:
        """The forecast max rate for each of the next ``steps`` control steps (P_u each),
        and the highest rate observed in the history it was made from.

        Forecasters speak per minute; with P_u < 60 s each minute's value
        covers the steps inside it, so the planner's τ and cool-down arithmetic,
        which count in steps, read the forecast on the right time axis.
        """
        step_s = self.settings.timings.update_period_s
        minutes = math.ceil(steps * step_s / 60.0)
        start, values = await self._history(model, now)
        history = History(
            np.asarray(values, dtype=np.float64), np.datetime64(int(start // 60), "m")
        )
        observed = history.observed
        peak = float(observed.max()) if observed.size else 0.0
        if peak <= 0.0:  # nothing seen yet, or only idle minutes: no load to plan for
            return [0.0] * steps, peak
        online = self.predictors.get(model)
        if online is None:
            if not self.forecast.fitted:
                self.forecast.fit(history)
            per_minute = [float(x) for x in self.forecast.forecast(history, minutes)]
        else:
            online.maybe_refit(history, int(now // 60))
            per_minute = [float(x) for x in online.forecast(history, minutes)]
        per_step = [
            per_minute[min(int(k * step_s // 60.0), len(per_minute) - 1)] for k in range(steps)
        ]
        return per_step, peak

    async def _bill_retired(
        self,
        model: str,
        retired: Sequence[str],
        fleet: Sequence[InstanceInfo],
        now: float,
    ) -> None:
        """Record each retired instance's run in the ledger: per second, 60 s minimum."""
        gone = set(retired)
        entries = []
        for inst in fleet:
            if inst.instance_id not in gone:
                continue
            price = self._price(inst.instance_type, inst.market.value)
            charge = ec2_charge(price, inst.launched_at, now)
            entries.append(
                LedgerEntry(
                    kind="ec2",
                    model=model,
                    start=inst.launched_at,
                    end=now,
                    component=inst.market.value,
                    unit_price=price,
                    cost=charge.cost,
                    instance_id=inst.instance_id,
                    instance_type=inst.instance_type,
                    seconds=charge.seconds,
                    billed_seconds=charge.billed_seconds,
                )
            )
            await self._set_state(inst, InstanceState.TERMINATED, now, "retired")
        if entries:
            await self.store.add_charges(entries)

    async def run(self, clock: Clock) -> None:
        """Repeat ``step`` every P_u until cancelled; a failed step is logged, not fatal."""
        while True:
            try:
                await self.step(clock.now())
            except Exception:
                log.exception("control-loop step failed")
            await clock.sleep(self.settings.timings.update_period_s)


def _count(
    fleet: Sequence[InstanceInfo],
    model: str,
    instance_type: str,
    market: Market,
    role: InstanceRole,
) -> int:
    """Live instances of one model, offering and role."""
    return sum(
        1
        for i in fleet
        if (i.model, i.instance_type, i.market, i.role) == (model, instance_type, market, role)
        and i.state in LIVE
    )


def online_predictor(settings: Settings) -> OnlinePredictor:
    """The configured model behind the refit schedule; a saved model serves from the start."""
    from predictor.registry import create, load

    spec = settings.predictor
    online = OnlinePredictor(
        lambda: create(spec.model),
        RefitPolicy(
            every_minutes=spec.refit_every_minutes,
            min_history=spec.min_history_minutes,
            at_minute_of_day=spec.refit_at_minute_of_day,
        ),
    )
    if spec.model_file is not None:
        online.model = load(spec.model_file)
        online.last_fit = 0  # trained offline: the next refit waits for the schedule
    return online
