"""What a control step sees and keeps: the snapshot, the control state, the actions.

The control loop's shape is snapshot → pure step → reconcile. The shell reads
its ports into a ``Snapshot`` (plain values, no handles); a step in
``provisioner.step`` or ``provisioner.standby_step`` turns it and the
``ControlState`` into actions and the next state; the shell carries the actions
out. Everything here is a frozen value, so a step can be replayed, tabled in a
test and run by the simulator exactly as by the daemon.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from bouncer.miss_budget import NO_TALLY, MissTally
from provisioner.forecast_sanity import ForecastBounds
from provisioner.greedy import OptionKey, PlannerOption
from provisioner.guards import GuardConfig
from provisioner.interruption_rate import InterruptionEvidence
from provisioner.slo_monitor import SloMonitorState
from provisioner.spend_rails import Spend, SpendLimits
from provisioner.spill_evidence import SpillEvidence
from provisioner.spot import InterruptionMemory
from provisioner.standby_value import StandbyValue

LIVE_STATES = frozenset({"pending", "running", "ready", "failing"})
"""Billed; a stopped standby is not live. ``failing``: its agent was ready and now fails
its liveness probe (still billed, no longer capacity)."""

SERVING_ROLES = frozenset({"serving", "backup"})
"""Roles the planner counts and may retire: its own and the SLO monitor's backups."""

MEASURING_ROLES = frozenset({"explore", "profiling"})
"""Roles of instances launched to measure a type's T_b, not to serve: the control loop's
exploration (``provisioner.explore_step``) and ``mark profile --type``'s instance."""


@dataclass(frozen=True)
class Member:
    """One instance of the cluster, as a step sees it."""

    instance_id: str
    model: str
    instance_type: str
    market: str
    role: str  # "serving", "backup", "standby", "explore" or "profiling"
    state: str  # EC2's names plus "ready"
    launched_at: float
    price_per_hour: float = 0.0
    owner: str | None = None
    """The cluster its ownership tag names (``mark:cluster``); None: untagged, never ours."""
    version: str | None = None
    """The model version it serves (None: untagged, any)."""

    @property
    def key(self) -> OptionKey:
        return (self.instance_type, self.market)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass(frozen=True)
class WarmPoolConfig:
    """What the warm pool needs from the configuration and the catalog."""

    start_s: float
    """A stopped instance's start to serving (``timings.warm_start_s``)."""
    ebs_per_hour: float
    """What one stopped instance's volume costs an hour ($; size × the gp3 price)."""
    cooldown_s: float | None = None
    """The cool-down of an instance that will be stopped: ``timings.cooldown_s`` where it
    is configured; None: one start (``provisioner.warm_pool.cooldown_s``)."""
    spill_per_hour: Mapping[OptionKey, float] = field(default_factory=dict)
    """Per offering, what its capacity's load costs an hour on spill, where spill answers
    within RT_max at a measured price (empty otherwise): what a start spares over a launch
    for each second sooner it serves load that is spilling (``warm_pool.hold_s``)."""


@dataclass(frozen=True)
class WarmState:
    """What the warm pool remembers between steps."""

    stopped_at: Mapping[str, float] = field(default_factory=dict)
    """Instance id → when it was stopped into the pool."""
    started_at: Mapping[str, float] = field(default_factory=dict)
    """Instance id → when it was started out of the pool (it serves ``start_s`` later)."""
    starts: float = 0.0
    """Instances started out of the pool, exponentially weighted over
    ``warm_pool.START_MEMORY`` starts."""
    outrun_starts: float = 0.0
    """Those of ``starts`` started while the load outran the fleet (spilling), weighted
    alike: the share of starts a start's speed saved spill for (``warm_pool.hold_s``).
    Both are saved with the control state."""

    def outrun_share(self) -> float:
        """The share of recent starts that met an outrun load; 0 before any start."""
        return self.outrun_starts / self.starts if self.starts > 0 else 0.0


@dataclass(frozen=True)
class StepConfig:
    """The per-model settings a step needs (from the configuration, fixed while running)."""

    step_s: float
    tau_steps: int
    boot_s: float
    window_steps: int = 60
    """P_w: control steps the forecast covers."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    limits: SpendLimits = field(default_factory=SpendLimits)
    bounds: ForecastBounds = field(default_factory=ForecastBounds)
    standby_type: str | None = None
    standby_price: float = 0.0
    standby_capacity_rps: float = 0.0
    standby_loss_fraction: float = 0.25
    standby_value: StandbyValue | None = None
    """What prices a stopped standby against the spill it saves
    (``provisioner.standby_value``); None: the pool covers the capacity at risk."""
    unavailable_ttl_s: float = 180.0
    pooled: bool = True
    """Plan at pooled per-instance capacity (``provisioner.pooling``), not stand-alone."""
    pool_for_rises: bool = True
    """Where not ``pooled``, pool at capacity that carries ``Snapshot.carried_rise``
    (``provisioner.rise_headroom``; ``planner.pooled_capacity = "auto"``)."""
    rise_miss_share: float = 0.0
    """The share of all requests the pool sized for rises may leave to miss
    (``provisioner.rise_headroom.carried_rise``); 0: carry the worst rise."""
    rise_by_misses: bool = True
    """Carry only the part of that rise the measured misses show is needed
    (``provisioner.rise_headroom.by_misses``)."""
    spill_cost_per_request: float | None = None
    """Spill's measured price when the plan may leave each step's peak to it
    (``provisioner.capacity_target``); None: plan for the peak."""
    warm_tau_steps: int | None = None
    """τ while the warm pool holds an instance of the model (a start's lead, not a
    launch's); None: ``tau_steps`` always (no pool, or τ configured)."""
    warm: WarmPoolConfig | None = None
    """Stop retired on-demand instances into a pool and start them for later launches
    (``provisioner.warm_pool``); None: terminate them."""


@dataclass(frozen=True)
class Rise:
    """The rise a pool sized for rises carries (``provisioner.rise_headroom``)."""

    carried: float
    """What the pool carries: each instance rated at its pooled capacity over it."""
    counted: float
    """The rise the history shows when every request above it counts as missed
    (``carried_rise``); ``carried`` is the part of it the measured misses show is
    needed (``by_misses``), all of it without ``StepConfig.rise_by_misses``."""


@dataclass(frozen=True)
class Snapshot:
    """The world for one model at ``now``: its forecast, its options, the whole fleet."""

    model: str
    now: float
    forecast: tuple[float, ...]
    """Forecast max rate per control step, as the predictor made it (not yet clipped)."""
    observed_peak: float
    """Highest rate in the history the forecast was made from."""
    options: tuple[PlannerOption, ...]
    fleet: tuple[Member, ...]
    """Every instance of the cluster (every model's: the cluster spend rail needs them)."""
    fixed_hourly: float = 0.0
    """$/h paid whatever the fleet: the spill function's provisioned concurrency."""
    window_minutes: tuple[tuple[float, ...], ...] = ()
    """The last hour's window rates (requests/s), grouped by minute: the within-step
    shape ``provisioner.capacity_target`` reads."""
    rise_chance: tuple[float, ...] = ()
    """Per control step, the chance a rise the forecast leaves out is under way
    (``provisioner.foreseen_rise``); empty when none is foreseen."""
    rise_rate: tuple[float, ...] = ()
    """Per control step, the rate that rise would bring (requests/s)."""
    carried_rise: Rise | None = None
    """The rise a pool sized for rises carries (``provisioner.rise_headroom``); None: not
    measured (too little history, or the plan does not size for rises)."""
    recent_rates: tuple[float, ...] = ()
    """The rates of the P_s windows closed by ``now``, newest first, one every
    ``window_s`` seconds (0 where none came): whether the load has outrun the fleet
    (``provisioner.early_step``); empty: none measured."""
    window_s: float = 5.0
    """The P_s window length of ``recent_rates``."""

    def mine(self) -> list[Member]:
        return [m for m in self.fleet if m.model == self.model]

    def spend(self, gone: frozenset[str] = frozenset()) -> Spend:
        """$/h of live instances now, this model's and the cluster's, without ``gone``."""
        model = cluster = 0.0
        for m in self.fleet:
            if m.live and m.instance_id not in gone:
                cluster += m.price_per_hour
                if m.model == self.model:
                    model += m.price_per_hour
        return Spend(model, cluster + self.fixed_hourly)


@dataclass(frozen=True)
class ModelControl:
    """One model's control state between steps."""

    last_wanted: Mapping[str, float] = field(default_factory=dict)
    """Instance id → when a plan last wanted it (the cool-down counts from there)."""
    slo: SloMonitorState = field(default_factory=SloMonitorState)
    hold_standbys_until: float = -math.inf
    """Started standbys are not stopped before this (replacements still booting)."""
    explored_at: float = -math.inf
    """When the control loop last launched an instance to measure an unprofiled type."""
    spill: SpillEvidence = field(default_factory=SpillEvidence)
    """How the model's spilled requests fared lately (``provisioner.spill_evidence``)."""
    planned_rps: float = math.inf
    """The rate the last plan was made for, for the step under way (its clipped forecast
    with foreseen rises): load above it plans early (``provisioner.early_step``). Not
    saved: after a restart the first step sets it."""
    planned_at: float = -math.inf
    """When the last plan was made."""
    misses: MissTally = NO_TALLY
    """The last hour's and the SLO period's arrivals and misses (``bouncer.miss_budget``),
    as last measured; what a pool sized for rises may still leave to miss. Not saved: after a
    restart the next measurement sets it, and until then the pool carries the worst
    rise."""


@dataclass(frozen=True)
class PendingStart:
    """Standbys a spot notice wanted started that did not start (the cloud refused): the
    next notice or control step tries again, until replacements could have booted."""

    model: str
    lost_rps: float
    """The capacity the interrupted instance served, which the standbys are to carry."""
    until: float
    """Reclaim time + boot time: replacements serve by then, so standbys no longer help."""


@dataclass(frozen=True)
class ControlState:
    """All control state: per model, plus the offerings avoided, the doomed instances, the
    standby starts still owed and the orphans seen. What a restart needs of it is saved
    in the store (``mark.control.durable``)."""

    models: Mapping[str, ModelControl] = field(default_factory=dict)
    avoid: InterruptionMemory = field(default_factory=InterruptionMemory)
    doomed: Mapping[str, float] = field(default_factory=dict)
    """Instance id → when it is reclaimed (a spot notice came): planned without."""
    pending_starts: Mapping[str, PendingStart] = field(default_factory=dict)
    """Interrupted instance id → the standby start its notice still owes."""
    orphans: Mapping[str, float] = field(default_factory=dict)
    """Instance id → since when the orphan sweep has found it claimed by nothing."""
    warm: WarmState = field(default_factory=WarmState)
    """The warm pool's stop and start times (``provisioner.warm_pool``)."""
    interruptions: InterruptionEvidence = field(default_factory=InterruptionEvidence)
    """The spot notices seen and the spot hours they came in (``provisioner.interruption_rate``)."""

    def of(self, model: str) -> ModelControl:
        return self.models.get(model, ModelControl())

    def with_model(self, model: str, control: ModelControl) -> ControlState:
        return replace(self, models={**self.models, model: control})


def counted_members(snap: Snapshot, state: ControlState) -> list[Member]:
    """The model's instances a plan counts as its fleet: live serving and backup ones,
    booting included, less those failing their probe and those with a spot notice."""
    return [
        m
        for m in snap.mine()
        if m.live
        and m.state != "failing"
        and m.role in SERVING_ROLES
        and m.instance_id not in state.doomed
    ]


def forget_gone(
    state: ControlState, listed: Collection[str], models: Collection[str] | None = None
) -> ControlState:
    """The state without what only concerned instances the cloud no longer lists (their
    spot notices, their orphan clocks) or, given the configured ``models``, models no
    longer configured. A standby start still owed stays until its end."""
    doomed = {i: t for i, t in state.doomed.items() if i in listed}
    orphans = {i: t for i, t in state.orphans.items() if i in listed}
    warm = WarmState(
        {i: t for i, t in state.warm.stopped_at.items() if i in listed},
        {i: t for i, t in state.warm.started_at.items() if i in listed},
    )
    per_model = dict(state.models)
    pending = dict(state.pending_starts)
    if models is not None:
        per_model = {m: c for m, c in per_model.items() if m in models}
        pending = {i: p for i, p in pending.items() if p.model in models}
    return replace(
        state,
        models=per_model,
        doomed=doomed,
        pending_starts=pending,
        orphans=orphans,
        warm=warm,
    )


@dataclass(frozen=True)
class Note:
    """A decision to record (beside the actions): what, why, and on what."""

    action: str
    reason: str
    instance_type: str | None = None
    market: str | None = None
    count: int = 1
    instance_id: str | None = None


@dataclass(frozen=True)
class Launch:
    """Launch ``count`` of an offering in a role; ``reason`` says why."""

    model: str
    instance_type: str
    market: str
    count: int
    role: str
    reason: str

    @property
    def key(self) -> OptionKey:
        return (self.instance_type, self.market)


@dataclass(frozen=True)
class Change:
    """Terminate, start or stop these instances."""

    kind: str  # "terminate", "start" or "stop"
    model: str
    instance_ids: tuple[str, ...]
    reason: str
