"""Simulate one policy on one workload: virtual time, the real decision code, a priced result.

The loop advances from event to event — a control step every P_u, an SLO
check every ``slo_check_s``, an instance becoming ready, a spot interruption
or reclaim — and between events the engine serves every request that
arrives. For the ``mark`` policies the events call the daemon's own
``Controller`` (``step``, ``check_slo``, ``on_interruption``) against a
``SimFleet`` and an in-memory store: only the clock and the cloud are
simulated.

The simulation starts ``warmup_s`` before the measured window so the fleet
has formed when measurement begins; requests and charges before ``t0`` are
not counted. History before the warm-up (``history_minutes`` of per-minute
peaks) is pre-loaded into the store, as a daemon that has run for a day
would have it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bouncer.latency import BatchLatency
from mark.billing import ec2_charge
from mark.catalog import Catalog, Market, load_catalog
from mark.config import BudgetSpec, OfferingsSpec, Settings, SloMonitorSpec
from mark.controller import PROFILE_BATCHES, Controller, build_options
from mark.errors import ConfigError
from mark.ports import (
    InstanceInfo,
    InstanceRole,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
    Store,
)
from mark.sim.engine import FAILED, LAMBDA, Engine, Server
from mark.sim.fleet import SimFleet
from mark.sim.memstore import MemoryStore
from mark.sim.models import T3_BASELINE, SimModel
from mark.sim.policies import Policy
from mark.sim.results import PolicyResult, summarise
from mark.sim.serverless import SimLambda
from mark.sim.workloads import Workload
from mark.state.records import ArrivalWindow
from predictor.base import Forecaster
from predictor.baselines import LastValue
from predictor.online import OnlinePredictor, RefitPolicy
from provisioner.batching import tune_batching
from provisioner.greedy import PlannerOption
from provisioner.milp import solve_min_cost
from provisioner.options import planner_option
from provisioner.perf_model import InstancePerf

Progress = Callable[[float], None]  # fraction of simulated time done


@dataclass(frozen=True)
class SimConfig:
    """What the simulated cloud does (defaults from the paper and AWS docs)."""

    boot_s: float = 120.0  # launch → serving for EC2 (minutes on AWS; the paper's testbed)
    standby_start_s: float = 20.0  # a stopped standby starts in seconds
    standby_type: str = "t3.large"
    standby_credits_per_vcpu: float = 30.0  # CPU credits a started standby holds
    warmup_s: float = 900.0
    slo_check_s: float = 2.0  # the daemon's SLO-monitor period
    lambda_concurrency: int = 1000
    lambda_memory_mb: int = 3072
    lambda_cold_start_s: float = 2.5
    lambda_keep_warm_s: float = 600.0
    sagemaker_type: str | None = None  # None: the cheapest per request that meets RT_max
    over_provision: float = 2.0
    interrupt_rate_per_hour: float = 0.0  # per spot instance-hour
    interruptions: tuple[tuple[float, float], ...] = ()  # (s after t0, fraction of spot fleet)
    seed: int = 0
    max_instances: int = 200
    milp_time_limit_s: float = 60.0
    history_minutes: int = 1500


@dataclass
class _Clock:
    t: float = 0.0

    def now(self) -> float:
        return self.t


def latency_curves(model: SimModel, batching: bool) -> dict[str, BatchLatency]:
    """Per type T_b; without batching, b requests cost b × T_1 (so N_batch tunes to 1)."""
    if batching:
        return dict(model.latency)
    return {t: BatchLatency(((1, c(1)),)) for t, c in model.latency.items()}


def serving_params(curve: BatchLatency, rt_max_s: float) -> tuple[int, float]:
    """N_batch, W_batch as the daemon tunes them for a backend (``daemon.backend_for``)."""
    try:
        cfg = tune_batching({b: curve(b) for b in PROFILE_BATCHES}, rt_max_s)
    except ValueError:
        return 1, 0.0
    return cfg.n_batch, cfg.w_batch_s


def model_options(
    model: SimModel,
    catalog: Catalog,
    markets: Sequence[str],
    batching: bool,
    boot_s: float,
) -> list[PlannerOption]:
    spec = model.spec()
    curves = latency_curves(model, batching)
    types = [t for t in curves if t in catalog.types]
    return build_options(spec, catalog, types, [Market(m) for m in markets], curves, boot_s)


def monitor_type(options: Sequence[PlannerOption]) -> str:
    """The SLO monitor's backup type: the cheapest on-demand option (c5.large for
    Inception-v3, as in the paper, where the model's profile allows it)."""
    od = [o for o in options if o.market == "on-demand"] or list(options)
    if not od:
        raise ConfigError("no instance type can serve this model within its SLO")
    return min(od, key=lambda o: (o.price_per_hour, o.instance_type)).instance_type


class Simulation:
    def __init__(
        self,
        workload: Workload,
        model: SimModel,
        policy: Policy,
        cfg: SimConfig,
        *,
        arrivals: NDArray[np.float64],
        forecaster: Forecaster | None = None,
        catalog: Catalog | None = None,
        progress: Progress | None = None,
        store: Store | None = None,
    ) -> None:
        self.w = workload
        self.store: Store = store if store is not None else MemoryStore()
        self.model = model
        self.policy = policy
        self.cfg = cfg
        self.catalog = catalog or load_catalog()
        self.progress = progress
        self.forecaster = forecaster
        self.clock = _Clock()
        self.t0 = workload.t0
        self.t_begin = self.t0 - cfg.warmup_s
        self.t_end = self.t0 + workload.seconds
        self.arrivals = arrivals
        self.rng = np.random.default_rng(cfg.seed + 1)
        self.lam = SimLambda(
            self.catalog.lambda_prices,
            memory_mb=cfg.lambda_memory_mb,
            cold_start_s=cfg.lambda_cold_start_s,
            concurrency=cfg.lambda_concurrency,
            keep_warm_s=cfg.lambda_keep_warm_s,
        )
        self.lambda_cost_at_t0 = 0.0
        self.lambda_gbs_at_t0 = 0.0
        self.engine = Engine(
            arrivals,
            model.rt_max_s,
            self.lam if policy.spill else None,
            model.lambda_latency,
            bouncer=policy.spill,
        )
        boot = 0.0 if policy.kind == "optimal" else cfg.boot_s
        self.fleet = SimFleet(
            self.catalog,
            self.clock.now,
            boot_delay_s=lambda _t: boot,
            start_delay_s=lambda _t: cfg.standby_start_s,
        )
        self.curves = latency_curves(model, policy.batching)
        self.options = model_options(
            model, self.catalog, policy.markets, policy.batching, cfg.boot_s
        )
        if not self.options:
            raise ConfigError(f"{model.name}: no offering meets RT_max in {policy.markets}")
        self.servers: dict[str, Server] = {}
        self.timeline: list[tuple[float, int, float, int]] = []  # t, serving, capacity, pending
        self.interruptions_done = 0
        self.sagemaker_type: str | None = None
        # What the policy does on a spot notice (mark: the controller's on_interruption).
        self.on_interruption: Callable[[InterruptionNotice], Awaitable[None]] | None = None
        self._window_counts = self._count_windows()

    # -- inputs ------------------------------------------------------------

    def _count_windows(self) -> NDArray[np.int64]:
        p_s = 5.0
        n = math.ceil((self.t_end - self.t_begin) / p_s)
        idx = np.floor((self.arrivals - self.t_begin) / p_s).astype(np.int64)
        return np.bincount(idx[(idx >= 0) & (idx < n)], minlength=n)

    def _history_windows(self, minutes: int) -> list[ArrivalWindow]:
        """Expected counts of the P_s windows before the simulation, as history."""
        begin_s = int(self.t_begin - self.w.epoch) - minutes * 60
        begin_s = max(0, begin_s - begin_s % 60)
        end_s = int(self.t_begin - self.w.epoch)
        x = self.w.per_second[begin_s:end_s]
        n = x.shape[0] // 5
        counts = np.rint(x[: n * 5].reshape(n, 5).sum(axis=1)).astype(int)
        return [
            ArrivalWindow(self.model.name, self.w.epoch + begin_s + 5.0 * k, 5.0, int(c))
            for k, c in enumerate(counts)
        ]

    def _windows_between(self, a: float, b: float) -> list[ArrivalWindow]:
        lo = max(0, int((a - self.t_begin) // 5))
        hi = min(self._window_counts.shape[0], int((b - self.t_begin) // 5))
        return [
            ArrivalWindow(self.model.name, self.t_begin + 5.0 * k, 5.0, int(self._window_counts[k]))
            for k in range(lo, hi)
        ]

    # -- serving -----------------------------------------------------------

    def _server(self, inst: InstanceInfo) -> Server | None:
        srv = self.servers.get(inst.instance_id)
        if srv is not None:
            return srv
        itype = inst.instance_type
        if inst.role is InstanceRole.STANDBY or itype not in self.curves:
            if itype not in T3_BASELINE:
                return None  # no profile for this type: it cannot serve the model
            vcpus = self.catalog.types[itype].vcpus
            curve = self.model.standby_latency(vcpus)
            baseline, earn_h = T3_BASELINE[itype]
            srv = Server(
                inst.instance_id,
                itype,
                inst.market.value,
                inst.role.value,
                curve,
                burstable=True,
                vcpus=vcpus,
                baseline=baseline,
                credits=self.cfg.standby_credits_per_vcpu * vcpus,
                earn_per_s=earn_h / 3600.0,
                max_credits=earn_h * 24.0,
                credit_t=self.clock.t,
            )
        else:
            curve = self.curves[itype]
            n, w = serving_params(curve, self.model.rt_max_s)
            srv = Server(inst.instance_id, itype, inst.market.value, inst.role.value, curve, n, w)
        self.servers[inst.instance_id] = srv
        return srv

    async def _sync(self) -> None:
        live = await self.fleet.list()
        serving = []
        for inst in live:
            if inst.state is InstanceState.RUNNING and inst.model == self.model.name:
                srv = self._server(inst)
                if srv is not None:
                    serving.append(srv)
        self.engine.set_servers(serving)

    def _capacity(self, live: Sequence[InstanceInfo]) -> tuple[int, float, int]:
        caps = {o.key: o.capacity_rps for o in self.options}
        serving = [i for i in live if i.state is InstanceState.RUNNING]
        pending = sum(1 for i in live if i.state is InstanceState.PENDING)
        cap = sum(caps.get((i.instance_type, i.market.value), 0.0) for i in serving)
        return len(serving), cap, pending

    # -- the loop ------------------------------------------------------------

    async def run(self) -> PolicyResult:
        if self.policy.kind == "mark":
            await self._run_mark()
        elif self.policy.kind == "optimal":
            await self._run_optimal()
        else:
            await self._run_sagemaker()
        return self._result()

    async def _loop(
        self,
        on_step: Callable[[float], Awaitable[None]],
        on_slo: Callable[[float, NDArray[np.float64]], Awaitable[None]] | None,
        step_s: float,
    ) -> None:
        """Serve requests between events; call the policy at its events."""
        t = self.t_begin
        self.clock.t = t
        next_step = t
        next_slo = t + self.cfg.slo_check_s
        slo_from = 0
        measured = False
        reclaims: dict[str, float] = {}
        planned = sorted(self.t0 + dt for dt, _ in self.cfg.interruptions)
        fractions = {self.t0 + dt: f for dt, f in self.cfg.interruptions}
        span = self.t_end - self.t_begin
        last_progress = t
        while t < self.t_end:
            candidates = [next_step, self.t_end]
            if on_slo is not None:
                candidates.append(next_slo)
            if not measured:
                candidates.append(self.t0)
            ready = self.fleet.next_ready_after(t)
            if ready is not None:
                candidates.append(ready)
            if reclaims:
                candidates.append(min(reclaims.values()))
            if planned:
                candidates.append(planned[0])
            t_next = max(t, min(candidates))
            self.engine.serve_until(t_next)
            t = self.clock.t = t_next
            if not measured and t >= self.t0:
                measured = True
                self.lambda_cost_at_t0 = self.lam.cost
                self.lambda_gbs_at_t0 = self.lam.gb_seconds
            for iid, at in list(reclaims.items()):
                if at <= t:
                    del reclaims[iid]
                    await self.fleet.terminate([iid])  # AWS takes the instance back
            if on_slo is not None and t >= next_slo:
                lat = self.engine.latencies_since(slo_from)
                slo_from = self.engine.i
                await on_slo(t, lat)
                next_slo = t + self.cfg.slo_check_s
            if planned and t >= planned[0]:
                at = planned.pop(0)
                await self._interrupt_fraction(fractions[at], reclaims)
            if t >= next_step:
                await self._sync()
                if self.cfg.interrupt_rate_per_hour > 0:
                    await self._interrupt_random(step_s, reclaims)
                await on_step(t)
                live = await self.fleet.list()
                serving, cap, pending = self._capacity(live)
                self.timeline.append((t, serving, cap, pending))
                next_step = t + step_s
            await self._sync()
            if self.progress is not None and t - last_progress >= 600:
                self.progress((t - self.t_begin) / span)
                last_progress = t
        self.engine.serve_until(self.t_end)
        self.fleet.close_runs(self.t_end)
        if self.progress is not None:
            self.progress(1.0)

    async def _interrupt_fraction(self, fraction: float, reclaims: dict[str, float]) -> None:
        spot = [
            i
            for i in await self.fleet.list()
            if i.market is Market.SPOT
            and i.state is InstanceState.RUNNING
            and i.instance_id not in reclaims
        ]
        k = round(fraction * len(spot))
        chosen: list[int] = (
            [int(x) for x in self.rng.choice(len(spot), size=k, replace=False)] if k else []
        )
        for j in sorted(chosen):
            await self._interrupt(spot[j].instance_id, reclaims)

    async def _interrupt_random(self, step_s: float, reclaims: dict[str, float]) -> None:
        p = 1.0 - math.exp(-self.cfg.interrupt_rate_per_hour * step_s / 3600.0)
        for inst in await self.fleet.list():
            if (
                inst.market is Market.SPOT
                and inst.state is InstanceState.RUNNING
                and inst.instance_id not in reclaims
                and self.rng.random() < p
            ):
                await self._interrupt(inst.instance_id, reclaims)

    async def _interrupt(self, iid: str, reclaims: dict[str, float]) -> None:
        notice = self.fleet.interrupt(iid, NoticeKind.INTERRUPTION)
        reclaims[iid] = notice.action_at if notice.action_at is not None else self.clock.t + 120
        self.interruptions_done += 1
        if self.on_interruption is not None:
            await self.on_interruption(notice)

    # -- mark ---------------------------------------------------------------

    def _settings(self) -> Settings:
        standby = (self.cfg.standby_type,) if self.policy.standbys else ()
        return Settings(
            world="sim",
            models=(self.model.spec(),),
            offerings=OfferingsSpec(
                types=tuple(sorted({o.instance_type for o in self.options})),
                markets=tuple(Market(m) for m in self.policy.markets),
                standby_types=standby,
                max_instances=self.cfg.max_instances,
            ),
            slo_monitor=SloMonitorSpec(instance_type=monitor_type(self.options)),
            # The paper's experiments measure the policy, not a user's budget: no spend rails.
            budget=BudgetSpec(max_hourly_per_model=None, max_hourly_cluster=None),
        )

    def _standby_capacity(self) -> float:
        vcpus = self.catalog.types[self.cfg.standby_type].vcpus
        curve = self.model.standby_latency(vcpus)
        price = self.catalog.offering(self.cfg.standby_type, Market.ON_DEMAND).price_per_hour
        opt = planner_option(
            self.cfg.standby_type,
            "on-demand",
            price,
            InstancePerf(curve(1), 1, 0.0),
            rt_max_s=self.model.rt_max_s,
            sl_min=self.model.sl_min,
        )
        return opt.capacity_rps

    async def _run_mark(self) -> None:
        settings = self._settings()
        store = self.store
        await store.add_arrivals(self._history_windows(self.cfg.history_minutes))
        predictors: dict[str, OnlinePredictor] = {}
        forecast_fn: Forecaster | None = None
        if not self.policy.prediction:
            forecast_fn = LastValue()
        elif self.forecaster is not None:
            online = OnlinePredictor(
                lambda: self.forecaster,  # type: ignore[return-value,arg-type]
                RefitPolicy(every_minutes=10**9, min_history=10**9),  # no refits mid-run
            )
            online.model = self.forecaster
            online.last_fit = 0
            predictors[self.model.name] = online
        ctl = Controller(
            settings,
            self.fleet,
            store,
            {self.model.name: self.options},
            predictors=predictors,
            boot_s=self.cfg.boot_s,
            catalog=self.catalog,
            standby_capacity=(
                {self.model.name: self._standby_capacity()} if self.policy.standbys else {}
            ),
        )
        if forecast_fn is not None:
            ctl.forecast = forecast_fn
        self.controller = ctl
        sample = settings.timings.sample_window_s
        flushed = self.t_begin

        async def on_step(t: float) -> None:
            nonlocal flushed
            await store.add_arrivals(self._windows_between(flushed, t))
            flushed = t - (t - self.t_begin) % sample
            await ctl.step(t)

        async def on_slo(t: float, lat: NDArray[np.float64]) -> None:
            if lat.size:
                await ctl.check_slo(t, {self.model.name: lat.tolist()})

        async def on_interruption(notice: InterruptionNotice) -> None:
            await ctl.on_interruption(notice, self.clock.t)

        self.on_interruption = on_interruption
        await self._loop(
            on_step, on_slo if self.policy.slo_monitor else None, settings.timings.update_period_s
        )

    # -- optimal ----------------------------------------------------------

    def true_load(self, step_s: float = 60.0) -> list[float]:
        """Per-step peak P_s-window rate of the arrivals themselves (clairvoyant)."""
        per_step = int(step_s // 5)
        w = self._window_counts / 5.0
        n = w.shape[0] // per_step
        return [float(x) for x in w[: n * per_step].reshape(n, per_step).max(axis=1)]

    async def _run_optimal(self) -> None:
        load = self.true_load()
        plan = solve_min_cost(
            load,
            self.options,
            slo_s=self.model.rt_max_s,
            time_limit_s=self.cfg.milp_time_limit_s,
        )
        self.milp_cost = plan.cost
        self.milp_lower_bound = plan.lower_bound
        self.milp_optimal = plan.optimal
        held: dict[tuple[str, str], list[str]] = {o.key: [] for o in plan.options}
        step_i = 0

        async def on_step(t: float) -> None:
            nonlocal step_i
            if step_i >= plan.counts.shape[1]:
                return
            for oi, opt in enumerate(plan.options):
                want = int(np.rint(plan.counts[oi, step_i]))
                have = held[opt.key]
                if want > len(have):
                    got = await self.fleet.launch(
                        LaunchRequest(
                            self.model.name,
                            opt.instance_type,
                            Market(opt.market),
                            want - len(have),
                        )
                    )
                    have.extend(i.instance_id for i in got)
                elif want < len(have):
                    gone = have[want:]
                    del have[want:]
                    await self.fleet.terminate(gone)
            step_i += 1

        await self._loop(on_step, None, 60.0)

    # -- sagemaker --------------------------------------------------------

    async def _run_sagemaker(self) -> None:
        from mark.sim.sagemaker import run_target_tracking

        await run_target_tracking(self)

    # -- result -------------------------------------------------------------

    def _result(self) -> PolicyResult:
        costs = {"on-demand": 0.0, "spot": 0.0, "standby": 0.0}
        hours: dict[str, float] = {}
        for run in self.fleet.runs:
            end = run.end if run.end is not None else self.t_end
            start, end = max(run.start, self.t0), min(end, self.t_end)
            if end <= start:
                continue
            price = self.catalog.offering(run.instance_type, run.market).price_per_hour
            charge = ec2_charge(price, start, end)
            part = "standby" if run.role == InstanceRole.STANDBY.value else run.market
            costs[part] += charge.cost
            hours[run.instance_type] = hours.get(run.instance_type, 0.0) + (end - start) / 3600
        costs["lambda"] = self.lam.cost - self.lambda_cost_at_t0
        first = int(np.searchsorted(self.arrivals, self.t0, "left"))
        lat = self.engine.lat[first:]
        where = self.engine.where[first:]
        return summarise(
            policy=self.policy.name,
            model=self.model.name,
            workload=self.w.name,
            hours=self.w.seconds / 3600.0,
            rt_max_s=self.model.rt_max_s,
            latencies=lat,
            spilled=int(np.count_nonzero(where == LAMBDA)),
            failed=int(np.count_nonzero(where == FAILED)),
            costs=costs,
            instance_hours=hours,
            timeline=[r for r in self.timeline if r[0] >= self.t0],
            load=self.true_load(),
            load_t0=self.t_begin,
            extra=self._extra(),
            arrivals=self.arrivals[first:],
        )

    def _extra(self) -> dict[str, float | int | bool | str]:
        out: dict[str, float | int | bool | str] = {
            "lambda_cold_starts": self.lam.cold_starts,
            "lambda_throttled": self.lam.throttled,
            "interruptions": self.interruptions_done,
        }
        if self.sagemaker_type is not None:
            out["sagemaker_type"] = self.sagemaker_type
        if hasattr(self, "milp_cost"):
            out["milp_ec2_cost"] = self.milp_cost
            out["milp_lower_bound"] = self.milp_lower_bound
            out["milp_optimal"] = self.milp_optimal
        return out
