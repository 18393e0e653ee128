"""The control loop: each P_u, forecast → plan → guards → fleet, and the plan recorded.

``Controller.step(now)`` is one step, callable directly with any ``now`` (the
simulator and the tests drive it); ``run`` only repeats it on a clock. The
decisions are the pure policies of ``provisioner`` and ``predictor``; this
module reads their inputs from the ports and carries their outputs back out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
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
from predictor.base import History
from predictor.online import OnlinePredictor, RefitPolicy
from provisioner.batching import tune_batching
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

Forecast = Callable[[Sequence[float], int], list[float]]
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)
LIVE = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.READY}


def max_rate_per_minute(
    windows: Sequence[ArrivalWindow], start: float, minutes: int
) -> list[float]:
    """The paper's series: for each minute, the highest rate of its P_s sample windows.

    A minute with no windows recorded is 0 (the daemon records every window,
    empty ones included, while it runs).
    """
    out = [0.0] * minutes
    for w in windows:
        k = math.floor((w.window_start - start) / 60.0)
        if 0 <= k < minutes:
            out[k] = max(out[k], w.rate)
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


def headroom_fallback(headroom: float = 1.2) -> Forecast:
    """FALLBACK forecaster, used until a trained predictor is configured:
    the highest per-minute rate of the history times ``headroom``, flat."""

    def forecast(history: Sequence[float], steps: int) -> list[float]:
        peak = max(history) if history else 0.0
        return [peak * headroom] * steps

    return forecast


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
    forecast: Forecast = field(default_factory=headroom_fallback)
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
                seen = _count(
                    await self.fleet.list(),
                    spec.name,
                    action.instance_type,
                    market,
                    InstanceRole.BACKUP,
                )
                got = await self.fleet.launch(
                    LaunchRequest(
                        spec.name,
                        action.instance_type,
                        market,
                        action.count,
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
                    action.count,
                )
            )
        return launched

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
        everything = await self.fleet.list()
        return [await self._step_model(m, now, everything) for m in self.settings.models]

    def _plan(
        self,
        spec: ModelSpec,
        now: float,
        fleet: Sequence[InstanceInfo],
        forecast: Sequence[float],
        by_key: Mapping[tuple[str, str], PlannerOption],
    ) -> tuple[Plan, GuardDecision, GuardState, list[InstanceInfo]]:
        """Plan over the offerings not being avoided, then the guards; nothing is done yet.

        Returns the plan, the guarded decision, the guard state to keep if it is
        carried out, and this model's serving instances the plan counted.
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
        return plan, decision, state, mine

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
        forecast = await self._forecast(spec.name, now, t.window_steps)
        by_key = {o.key: o for o in self.options.get(spec.name, ())}
        launched: list[InstanceInfo] = []
        decisions: list[Decision] = []
        exhausted = False
        # An offering out of capacity is avoided for a while and the step plans again
        # without it (what it launched before counts as running), a bounded number of times.
        for attempt in range(self.max_fallbacks + 1):
            try:
                plan, decision, guard_state, mine = self._plan(spec, now, fleet, forecast, by_key)
            except NoFeasibleOption as exc:
                if attempt == 0:
                    return StepResult(spec.name, forecast, None, [], [], [], 0.0, error=str(exc))
                exhausted = True
                decisions.append(Decision(spec.name, now, "fallback-exhausted", str(exc)))
                break
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
        # Standbys carry the lost capacity until the instance is gone and replacements,
        # launched now, have booted; only then may the load decide to stop them.
        self._hold_standbys[inst.model] = max(
            self._hold_standbys.get(inst.model, 0.0), reclaim_at + self.boot_s
        )
        if response.start:
            await self.fleet.start(list(response.start))
            by_id = {i.instance_id: i for i in fleet}
            for iid in response.start:
                await self._set_state(by_id[iid], InstanceState.PENDING, now, "standby started")
        why = (
            f"spot interruption of {inst.instance_id} ({inst.instance_type}) at t={reclaim_at:g}: "
            f"{lost:.1f} r/s lost, {len(response.start)} standby(s) started, "
            f"{response.uncovered_rps:.1f} r/s left to Lambda until replacements serve"
        )
        await self.store.record_decision(
            Decision(
                inst.model,
                now,
                "start-standby",
                why,
                instance_id=inst.instance_id,
                count=len(response.start),
            )
        )
        await self._bill_retired(inst.model, [inst.instance_id], [inst], reclaim_at)
        await self.step(now)  # replacements now, avoiding the interrupted offering
        return list(response.start)

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
        if len(standbys) < want:
            got = await self.fleet.launch(
                LaunchRequest(
                    spec.name,
                    types[0],
                    Market.ON_DEMAND,
                    want - len(standbys),
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
        """The forecast max rate for each of the next ``steps`` control steps (P_u each).

        Forecasters speak per minute; with P_u < 60 s each minute's value
        covers the steps inside it, so the planner's τ and cool-down arithmetic,
        which count in steps, read the forecast on the right time axis.
        """
        step_s = self.settings.timings.update_period_s
        per_minute = await self._forecast_minutes(model, now, math.ceil(steps * step_s / 60.0))
        return [per_minute[min(int(k * step_s // 60.0), len(per_minute) - 1)] for k in range(steps)]

    async def _forecast_minutes(self, model: str, now: float, minutes: int) -> list[float]:
        start, values = await self._history(model, now)
        online = self.predictors.get(model)
        if online is None or not any(values):
            return [max(0.0, float(x)) for x in self.forecast(values[-60:], minutes)]
        history = History(
            np.asarray(values, dtype=np.float64), np.datetime64(int(start // 60), "m")
        )
        online.maybe_refit(history, int(now // 60))
        return [float(x) for x in online.forecast(history, minutes)]

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
