"""The simulated world: one workload's arrivals, the cloud, the servers, the bill.

A ``SimWorld`` wires a ``SimFleet`` and a ``SimLambda`` on a virtual clock, an
in-memory ``Store`` (or any store), and the ``Engine`` that serves the
arrivals on the instances the fleet has running. It is what every policy
driver acts on: the drivers launch and terminate through ``fleet``, read the
load through ``history_windows``, ``windows_between`` and ``true_load``, and
advance time with ``mark.sim.loop.run_loop``; ``result`` prices the run.

The world starts ``warmup_s`` before the measured window so the fleet, and what
the daemon carries from hour to hour, have formed when measurement begins
(``DEFAULT_WARMUP_S``); requests and charges before ``t0`` are not counted, and the
SLO's miss budget starts at ``t0``, so the window is judged on its own requests.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from bouncer.variants import Variant
from mark.billing import ebs_charge, ec2_charge
from mark.catalog import (
    Catalog,
    HostingPrices,
    Market,
    load_catalog,
    load_hosting_prices,
    load_spot_advisor,
)
from mark.control import build_options
from mark.errors import ConfigError, UnknownOffering
from mark.ports import InstanceInfo, InstanceRole, InstanceState, Store
from mark.sim.engine import DECLINED, FAILED, LAMBDA, Engine, Server
from mark.sim.fleet import SimFleet
from mark.sim.memstore import MemoryStore
from mark.sim.models import T3_BASELINE, SimModel
from mark.sim.policies import Policy
from mark.sim.results import PolicyResult, summarise
from mark.sim.serverless import SimLambda
from mark.sim.workloads import Workload
from mark.state.records import ArrivalWindow
from provisioner.batching import serving_batching
from provisioner.greedy import PlannerOption
from provisioner.pool_batching import batching_for
from provisioner.target_tracking import DEFAULT_METRIC_DELAY_S
from provisioner.variant_mix import planning_curves

Progress = Callable[[float], None]  # fraction of simulated time done
Extra = dict[str, float | int | bool | str]  # what a driver adds to a result's extras

SAMPLE_S = 5.0  # P_s: the arrival windows the daemon's telemetry counts


DEFAULT_WARMUP_S = 10_800.0
"""Simulated before the window and not counted: three hours, for two reasons.

- A daemon that has run for hours carries state the window's first minutes draw on:
  the warm pool's stopped instances (``provisioner.warm_pool``; a retired c5.large with
  an 8 GB volume is held 2.7 h, longer where its starts met a rising load), the share of
  starts that met one, the spill evidence, the forecaster's recent input. A warm-up
  shorter than that hold starts every window with an empty pool, which only a daemon
  started minutes ago has, and the window's first rise pays for it.
- The warm-up should be real load: the 29 minutes before Twitter day 10 (Table 5's
  window) are an archive gap, filled by interpolation, so the 15 minutes used before
  2026-11-29 were none.

Longer costs simulation time, about a third more for an 8 h window. Measured on
Inception-v3, Twitter day 10, seed 0: mark cost 1.397× the bound after 15 min, 1.351×
after 3 h and 1.366× after 4 h, and every run from 2 h on was 1.32–1.37× (with P2 still
in the catalog; git history of experiments/table5/README.md, 2026-11-29)."""


@dataclass(frozen=True)
class SimConfig:
    """What the simulated cloud does (defaults from the paper and AWS docs)."""

    boot_s: float = 120.0  # launch → serving for EC2 (minutes on AWS; the paper's testbed)
    standby_start_s: float = 20.0
    """A stopped standby's start to serving; not measured by mark. The paper bounds it
    ("resumed from stopped state in less than 2 minutes", §4.5). An instance started with
    its volume already hydrated boots in about 5 s (depot.dev, "Making EC2 boot time 8x
    faster", 2024), a fresh Linux launch reaches SSH in about 28 s (C. Percival, "EC2 boot
    time benchmarking", 2021); 20 s is the first plus the agent loading and warming its
    model. ``--interrupt`` runs (experiments/fig9) depend on it; Table 5's do not."""
    standby_type: str = "t3.large"
    standby_credits_per_vcpu: float = 30.0  # CPU credits a started standby holds
    warmup_s: float = DEFAULT_WARMUP_S
    slo_check_s: float = 2.0  # the daemon's SLO-monitor period
    lambda_concurrency: int = 1000
    lambda_memory_mb: int = 3072
    lambda_cold_start_s: float = 2.5
    lambda_keep_warm_s: float = 600.0
    sagemaker_type: str | None = None  # None: the cheapest per request that meets RT_max
    over_provision: float = 2.0
    # The sagemaker policy (SageMaker as users pay it; provisioner.target_tracking):
    # a minute's invocations reach its alarm this long after the minute (metric
    # published per minute, alarm evaluated once a minute) ...
    sagemaker_metric_delay_s: float = DEFAULT_METRIC_DELAY_S
    # ... a response later than this after the request fails (InvokeEndpoint's 60 s) ...
    sagemaker_invocation_timeout_s: float = 60.0
    # ... and a new ml.* instance is InService this long after the decision (None: boot_s;
    # AWS publishes no figure).
    sagemaker_boot_s: float | None = None
    interrupt_rate_per_hour: float | None = None
    """Spot interruptions per spot instance-hour, the same for every type; None: each
    type's Spot Instance Advisor rate (``mark.catalog.spot_advisor``)."""
    interruptions: tuple[tuple[float, float], ...] = ()  # (s after t0, fraction of spot fleet)
    seed: int = 0
    max_instances: int = 200
    milp_time_limit_s: float = 60.0
    history_minutes: int = 1500
    bound_slot_s: float = 5.0  # the lower bound's slot (mark.sim.bound); divides 60 s
    # The mark policies' share of the SLO's miss budget spent declining what would spill
    # (bouncer.miss_budget; None: the model spec's default).
    decline_share: float | None = None
    # The SLO's period those misses are kept within (bouncer.miss_budget; None: the spec's).
    slo_period_s: float | None = None
    early_steps: bool = True  # mark policies: plan early when the load outruns the plan
    # mark policies: how long an instance the plan no longer wants stays before it is
    # retired (the daemon's timings.cooldown_s; None: its default, the boot time).
    cooldown_s: float | None = None
    accuracy_floor: float | None = None
    """mark policies: serve the model's variants (``SimModel.variants``) under this floor,
    planned at the mix it allows; None: the model alone (its most accurate variant)."""
    spill_batching: bool = True
    """Spill in batches sized from the function's batch curve, where the model has one
    (``SimModel.lambda_batches``, ``bouncer.routing.spill_chunks``); False: one request
    per invocation."""
    warm_pool: bool = True
    """mark policies: retired on-demand instances are stopped into a warm pool and started
    (``standby_start_s``) before any launch of their type, as the daemon does by default
    (``timings.warm_start_s``; ``provisioner.warm_pool``); False: terminated."""
    pooled_capacity: bool | Literal["auto"] = "auto"
    """mark policies: the daemon's ``planner.pooled_capacity`` (``provisioner.pooling``)."""
    capacity_target: bool = True
    """mark policies: the daemon's ``planner.spill_capacity_target``
    (``provisioner.capacity_target``)."""
    rise_by_misses: bool = True
    """mark policies: the daemon's ``planner.rise_by_misses``
    (``provisioner.rise_headroom.by_misses``)."""
    volume_gb: float = 8.0
    """Each instance's EBS root volume, GB: billed at the catalog's gp3 price while the
    instance is stopped (a standby, or a stopped instance kept to start fast). 8 is the
    root volume of the workers' default AMI, Amazon Linux 2023 (the stack's default
    ``WorkerImageId`` in infra/mark.yaml; its snapshot is 8 GiB); a GPU AMI such as a Deep
    Learning AMI carries a much larger one, so set it per run. A running instance's volume
    is not billed (EC2 bills it too; a run is priced at its instance price alone)."""


@dataclass
class VirtualClock:
    """The world's time; only the event loop moves it."""

    t: float = 0.0

    def now(self) -> float:
        return self.t


def latency_curves(model: SimModel, batching: bool) -> dict[str, BatchLatency]:
    """Per type T_b; without batching, b requests cost b × T_1 (so N_batch tunes to 1)."""
    if batching:
        return dict(model.latency)
    return {t: BatchLatency(((1, c(1)),)) for t, c in model.latency.items()}


def model_options(
    model: SimModel,
    catalog: Catalog,
    markets: Sequence[str],
    batching: bool,
    boot_s: float,
    accuracy_floor: float | None = None,
) -> list[PlannerOption]:
    """The planner's options; with ``accuracy_floor`` and variants, each type rated at the
    mix of variants the floor allows (``provisioner.variant_mix``), as the daemon rates it."""
    spec = model.spec()
    curves = latency_curves(model, batching)
    if accuracy_floor is not None and model.variants:
        primary, *others = model.variants
        curves = planning_curves(
            curves,
            {v.name: dict(v.latency) for v in others},
            {v.name: v.accuracy for v in model.variants},
            primary.name,
            accuracy_floor,
            model.rt_max_s,
        )
    types = [t for t in curves if t in catalog.types]
    return build_options(spec, catalog, types, [Market(m) for m in markets], curves, boot_s)


class SimWorld:
    """The cloud, the servers and the arrivals of one simulated run of one policy."""

    def __init__(
        self,
        workload: Workload,
        model: SimModel,
        policy: Policy,
        cfg: SimConfig,
        *,
        arrivals: NDArray[np.float64],
        catalog: Catalog | None = None,
        progress: Progress | None = None,
        store: Store | None = None,
        fleet_boot_s: float | None = None,
    ) -> None:
        """``fleet_boot_s``: launch → serving in this world (default ``cfg.boot_s``)."""
        self.workload = workload
        self.store: Store = store if store is not None else MemoryStore()
        self.model = model
        self.policy = policy
        self.cfg = cfg
        self.catalog = catalog or load_catalog()
        self.progress = progress
        self.clock = VirtualClock()
        self.t0 = workload.t0
        self.t_begin = self.t0 - cfg.warmup_s
        self.t_end = self.t0 + workload.seconds
        self.arrivals = arrivals
        self.lam = SimLambda(
            self.catalog.lambda_prices,
            memory_mb=cfg.lambda_memory_mb,
            cold_start_s=cfg.lambda_cold_start_s,
            concurrency=cfg.lambda_concurrency,
            keep_warm_s=cfg.lambda_keep_warm_s,
        )
        self.hosting: HostingPrices | None = (
            load_hosting_prices() if policy.hosting == "sagemaker" else None
        )
        """SageMaker's ml.* prices, when the policy pays them for its on-demand runs."""
        self.engine = Engine(
            arrivals,
            model.rt_max_s,
            self.lam if policy.spill else None,
            model.lambda_latency,
            bouncer=policy.spill,
            timeout_s=cfg.sagemaker_invocation_timeout_s if self.hosting is not None else None,
            budget=self._miss_budget(),
            spill_batches=model.lambda_batches if cfg.spill_batching else None,
            accuracy_floor=cfg.accuracy_floor or 0.0,
        )
        boot = cfg.boot_s if fleet_boot_s is None else fleet_boot_s
        self.fleet = SimFleet(
            self.catalog,
            self.clock.now,
            boot_delay_s=lambda _t: boot,
            start_delay_s=lambda _t: cfg.standby_start_s,
        )
        self.curves = latency_curves(model, policy.batching)
        self.accuracy_floor = cfg.accuracy_floor if policy.kind == "mark" else None
        """With variants: the floor mark's policies choose them under (None: one variant)."""
        self.options = model_options(
            model, self.catalog, policy.markets, policy.batching, cfg.boot_s, self.accuracy_floor
        )
        if not self.options:
            raise ConfigError(f"{model.name}: no offering meets RT_max in {policy.markets}")
        self.timeline: list[tuple[float, int, float, int]] = []  # t, serving, capacity, pending
        self.interruptions = 0  # spot interruptions delivered
        self._servers: dict[str, Server] = {}
        self._batching: dict[tuple[str, BatchLatency, int], tuple[int, float]] = {}
        self._lambda_at_t0 = (0.0, 0, 0, 0)  # cost, cold starts, throttled, invocations
        self._window_counts = self._count_windows()

    # -- the load ------------------------------------------------------------

    def _count_windows(self) -> NDArray[np.int64]:
        n = math.ceil((self.t_end - self.t_begin) / SAMPLE_S)
        idx = np.floor((self.arrivals - self.t_begin) / SAMPLE_S).astype(np.int64)
        return np.bincount(idx[(idx >= 0) & (idx < n)], minlength=n)

    def history_windows(self, minutes: int) -> list[ArrivalWindow]:
        """Expected counts of the P_s windows in the ``minutes`` before the simulation."""
        w = self.workload
        begin_s = int(self.t_begin - w.epoch) - minutes * 60
        begin_s = max(0, begin_s - begin_s % 60)
        end_s = int(self.t_begin - w.epoch)
        x = w.per_second[begin_s:end_s]
        n = x.shape[0] // 5
        counts = np.rint(x[: n * 5].reshape(n, 5).sum(axis=1)).astype(int)
        return [
            ArrivalWindow(self.model.name, w.epoch + begin_s + 5.0 * k, 5.0, int(c))
            for k, c in enumerate(counts)
        ]

    def windows_between(self, a: float, b: float) -> list[ArrivalWindow]:
        """The simulated arrivals counted in the P_s windows that lie within [a, b)."""
        lo = max(0, int((a - self.t_begin) // SAMPLE_S))
        hi = min(self._window_counts.shape[0], int((b - self.t_begin) // SAMPLE_S))
        return [
            ArrivalWindow(
                self.model.name, self.t_begin + SAMPLE_S * k, SAMPLE_S, int(self._window_counts[k])
            )
            for k in range(lo, hi)
        ]

    def true_load(self, step_s: float = 60.0) -> list[float]:
        """Per-step peak P_s-window rate of the arrivals themselves (clairvoyant)."""
        per_step = int(step_s // SAMPLE_S)
        w = self._window_counts / SAMPLE_S
        n = w.shape[0] // per_step
        return [float(x) for x in w[: n * per_step].reshape(n, per_step).max(axis=1)]

    # -- serving -------------------------------------------------------------

    def _server_for(self, inst: InstanceInfo) -> Server | None:
        srv = self._servers.get(inst.instance_id)
        if srv is not None:
            return srv
        itype = inst.instance_type
        if inst.role is InstanceRole.STANDBY or itype not in self.curves:
            if itype not in T3_BASELINE:
                return None  # no profile for this type: it cannot serve the model
            vcpus = self.catalog.types[itype].vcpus
            baseline, earn_h = T3_BASELINE[itype]
            srv = Server(
                inst.instance_id,
                itype,
                inst.market.value,
                inst.role.value,
                self.model.standby_latency(vcpus),
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
            n, w = serving_batching(curve, self.model.rt_max_s)
            srv = Server(inst.instance_id, itype, inst.market.value, inst.role.value, curve, n, w)
            if self.accuracy_floor is not None and self.model.variants:
                srv.variants = tuple(
                    Variant(v.name, v.accuracy, curve if i == 0 else v.latency[itype])
                    for i, v in enumerate(self.model.variants)
                    if i == 0 or itype in v.latency
                )
        self._servers[inst.instance_id] = srv
        return srv

    async def sync(self) -> None:
        """Serve on exactly the instances of the model that are running now."""
        serving = []
        for inst in await self.fleet.list():
            if inst.state is InstanceState.RUNNING and inst.model == self.model.name:
                srv = self._server_for(inst)
                if srv is not None:
                    serving.append(srv)
        of_type = Counter(s.itype for s in serving if not s.burstable)
        for s in serving:
            if not s.burstable:  # a pool batches as the daemon's dispatcher does
                s.n_batch, s.w_batch_s = self._pool_batching(s, of_type[s.itype])
        self.engine.set_servers(serving)

    def _pool_batching(self, srv: Server, size: int) -> tuple[int, float]:
        """``batching_for`` the server's curve in a pool of ``size``, remembered per type
        and size (it is pure, and asked for every server at every event)."""
        key = (srv.itype, srv.latency, size)
        got = self._batching.get(key)
        if got is None:
            got = self._batching[key] = batching_for(
                srv.latency, self.model.rt_max_s, self.model.sl_min, size
            )
        return got

    async def record_fleet(self, t: float) -> None:
        """Add (t, serving, capacity, pending) of the fleet now to the timeline."""
        caps = {o.key: o.capacity_rps for o in self.options}
        live = await self.fleet.list()
        serving = [i for i in live if i.state is InstanceState.RUNNING]
        pending = sum(1 for i in live if i.state is InstanceState.PENDING)
        cap = sum(caps.get((i.instance_type, i.market.value), 0.0) for i in serving)
        self.timeline.append((t, len(serving), cap, pending))

    def _accuracy(self, first: int) -> Extra:
        """The mean accuracy the window's answered requests got, where variants chose."""
        acc = self.engine.acc[first:]
        answered = acc[~np.isnan(acc)]
        if self.accuracy_floor is None or not answered.size:
            return {}
        return {"accuracy_delivered": float(answered.mean())}

    def start_measuring(self) -> None:
        """Called at ``t0``: what Lambda has cost, and the cold starts and throttles it has
        had so far, are warm-up, not counted (as the requests before ``t0`` are not). The
        miss budget starts again: the window's SLO is judged on its requests alone, so
        the warm-up's allowance must not pay for the window's declines."""
        self._lambda_at_t0 = (
            self.lam.cost,
            self.lam.cold_starts,
            self.lam.throttled,
            self.lam.invocations,
        )
        if self.engine.budget is not None:
            self.engine.budget = self._miss_budget()

    def interrupt_rate(self, instance_type: str) -> float:
        """Interruptions per instance-hour a spot instance of the type meets in this world:
        the configured rate, or the type's Advisor rate (0 for a type the Advisor lacks)."""
        if self.cfg.interrupt_rate_per_hour is not None:
            return self.cfg.interrupt_rate_per_hour
        try:
            return load_spot_advisor().rate_per_hour(instance_type)
        except UnknownOffering:
            return 0.0

    # -- the bill ------------------------------------------------------------

    def price_per_hour(self, instance_type: str, market: str) -> float:
        """What an hour of the offering costs this policy: the ml.* hosting price for a
        SageMaker policy's on-demand runs, else the catalog's EC2 price."""
        if self.hosting is not None and market == Market.ON_DEMAND.value:
            return self.hosting.price(instance_type).price_per_hour
        return self.catalog.offering(instance_type, market).price_per_hour

    def _miss_budget(self) -> MissBudget | None:
        """The daemon's miss budget wherever mark's data plane serves (the mark policies and
        the clairvoyant schedule, served with the Bouncer), declines off too: it counts the
        misses a pool sized for rises spends its allowance on
        (``provisioner.rise_headroom.rise_allowance``); None for the target-tracking
        baselines, which have no Bouncer."""
        share = self.cfg.decline_share
        if share is None:
            share = self.model.spec().slo.decline_share
        if not self.policy.spill:
            return None
        period = self.cfg.slo_period_s
        if period is None:
            period = self.model.spec().slo.period_s
        return MissBudget(self.model.sl_min, share, window_s=period)

    def result(self, extra: Extra | None = None) -> PolicyResult:
        """The measured window priced: EC2 by the second per run, the EBS volumes of
        stopped instances by the GB-second, Lambda by GB-second."""
        costs = {"on-demand": 0.0, "spot": 0.0, "standby": 0.0, "ebs": 0.0}
        hours: dict[str, float] = {}
        for run in self.fleet.runs:
            end = run.end if run.end is not None else self.t_end
            start, end = max(run.start, self.t0), min(end, self.t_end)
            if end <= start:
                continue
            charge = ec2_charge(self.price_per_hour(run.instance_type, run.market), start, end)
            part = "standby" if run.role == InstanceRole.STANDBY.value else run.market
            costs[part] += charge.cost
            hours[run.instance_type] = hours.get(run.instance_type, 0.0) + (end - start) / 3600
        for period in self.fleet.stopped:
            end = period.end if period.end is not None else self.t_end
            start, end = max(period.start, self.t0), min(end, self.t_end)
            if end > start:
                costs["ebs"] += ebs_charge(
                    self.cfg.volume_gb, self.catalog.ebs_gb_month, start, end
                )
        cost0, cold0, throttled0, calls0 = self._lambda_at_t0
        costs["lambda"] = self.lam.cost - cost0
        first = int(np.searchsorted(self.arrivals, self.t0, "left"))
        where = self.engine.where[first:]
        extras: Extra = {
            "lambda_cold_starts": self.lam.cold_starts - cold0,
            "lambda_invocations": self.lam.invocations - calls0,
            "lambda_throttled": self.lam.throttled - throttled0,
            "interruptions": self.interruptions,
            "declined": int(np.count_nonzero(where == DECLINED)),
            **self._accuracy(first),
            **(extra or {}),
        }
        return summarise(
            policy=self.policy.name,
            model=self.model.name,
            workload=self.workload.name,
            hours=self.workload.seconds / 3600.0,
            rt_max_s=self.model.rt_max_s,
            latencies=self.engine.lat[first:],
            spilled=int(np.count_nonzero(where == LAMBDA)),
            failed=int(np.count_nonzero(where == FAILED)),
            costs=costs,
            instance_hours=hours,
            timeline=[r for r in self.timeline if r[0] >= self.t0],
            load=self.true_load(),
            load_t0=self.t_begin,
            extra=extras,
            arrivals=self.arrivals[first:],
        )
