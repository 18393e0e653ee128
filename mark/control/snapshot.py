"""Ports → the plain values a step reads: the fleet as ``Member``s, a model's
``Snapshot`` and its ``StepConfig``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from mark.billing import ebs_per_hour
from mark.catalog import Catalog
from mark.cloud.aws.instances import TAG_CLUSTER
from mark.config import ModelSpec, Settings
from mark.errors import UnknownOffering
from mark.ports import InstanceInfo
from provisioner.capacity_target import spill_price
from provisioner.control_state import Member, Rise, Snapshot, StepConfig, WarmPoolConfig
from provisioner.explore_step import Candidate, ExploreConfig
from provisioner.forecast_sanity import ForecastBounds
from provisioner.greedy import OptionKey, PlannerOption
from provisioner.guards import GuardConfig
from provisioner.health_step import HealthConfig
from provisioner.interruption_rate import InterruptionEvidence
from provisioner.orphan_step import OrphanConfig, StandbyPool
from provisioner.pooling import pool_with
from provisioner.slo_monitor import SloMonitorConfig, backup_offering
from provisioner.spend_rails import SpendLimits
from provisioner.spill_evidence import SpillEvidence
from provisioner.standby_value import StandbyValue, interruptions_per_hour

Price = Callable[[str, str], float]


def member(inst: InstanceInfo, price: Price) -> Member:
    return Member(
        inst.instance_id,
        inst.model,
        inst.instance_type,
        inst.market.value,
        inst.role.value,
        inst.state.value,
        inst.launched_at,
        price(inst.instance_type, inst.market.value),
        inst.tags.get(TAG_CLUSTER),
        inst.version,
    )


def members(fleet: Sequence[InstanceInfo], price: Price) -> tuple[Member, ...]:
    return tuple(member(i, price) for i in fleet)


def step_config(
    settings: Settings,
    spec: ModelSpec,
    *,
    boot_s: float,
    price: Price,
    standby_capacity_rps: float,
    standby_loss_fraction: float,
    unavailable_ttl_s: float,
    spill: SpillEvidence = SpillEvidence(),
    ebs_gb_month: float = 0.0,
    options: Sequence[PlannerOption] = (),
    interruptions: InterruptionEvidence = InterruptionEvidence(),
) -> StepConfig:
    """The model's step settings; ``spill`` (what its spilled requests showed lately)
    decides pooled capacity under ``auto``, the capacity target's spill price and, with
    the model's ``options``, what a warm start spares against spill; ``interruptions``
    (the cluster's spot notices) the standby pool's worth."""
    t = settings.timings
    planner = settings.planner
    budget = settings.budget
    standby_types = settings.offerings.standby_types
    standby = standby_types[0] if standby_types else None
    return StepConfig(
        step_s=t.update_period_s,
        tau_steps=t.lead_steps(boot_s),
        warm_tau_steps=None
        if t.warm_start_s is None or t.lead_time_s is not None
        else t.lead_steps(t.warm_start_s),
        boot_s=boot_s,
        window_steps=t.window_steps,
        guard=GuardConfig(
            t.cooldown(boot_s), t.billing_minimum_s, settings.offerings.max_instances
        ),
        limits=SpendLimits(budget.max_hourly_per_model, budget.max_hourly_cluster),
        bounds=ForecastBounds(settings.predictor.max_forecast_multiple, spec.max_rate_rps),
        standby_type=standby,
        standby_price=price(standby, "on-demand") if standby is not None else 0.0,
        standby_capacity_rps=standby_capacity_rps,
        standby_loss_fraction=standby_loss_fraction,
        standby_value=standby_value(settings, boot_s, ebs_gb_month, interruptions),
        unavailable_ttl_s=unavailable_ttl_s,
        pooled=pool_with(planner.pooled_capacity, spill),
        pool_for_rises=planner.pooled_capacity == "auto",
        rise_miss_share=planner.rise_miss_share * (1.0 - spec.slo.sl_min),
        rise_by_misses=planner.rise_by_misses,
        spill_cost_per_request=spill_price(planner.spill_capacity_target, spill),
        warm=None
        if t.warm_start_s is None
        else WarmPoolConfig(
            t.warm_start_s,
            volume_per_hour(settings, ebs_gb_month),
            t.cooldown_s,
            spill_per_hour(options, spill),
        ),
    )


def spill_per_hour(
    options: Sequence[PlannerOption], spill: SpillEvidence
) -> dict[OptionKey, float]:
    """Per offering, what its capacity's load costs an hour on spill where spill answers
    in time at a measured price; empty otherwise (``WarmPoolConfig.spill_per_hour``)."""
    price = spill.in_time_price()
    if price is None:
        return {}
    return {o.key: o.capacity_rps * 3600.0 * price for o in options}


def health_config(settings: Settings, boot_s: float, avoid_s: float) -> HealthConfig:
    """Boot deadline (default 3 × boot time, at least 60 s), failing limit, avoid time."""
    t = settings.timings
    return HealthConfig(
        boot_deadline_s=t.boot_deadline_s or max(3.0 * boot_s, 60.0),
        unhealthy_after_s=t.unhealthy_after_s,
        avoid_s=avoid_s,
    )


def explore_config(settings: Settings) -> ExploreConfig:
    spec = settings.planner.explore_unprofiled
    return ExploreConfig(spec.max_concurrent, spec.interval_s)


def explore_candidates(settings: Settings, catalog: Catalog) -> list[Candidate]:
    """Every configured offering (type × market) the catalog prices, with its accelerator."""
    out = []
    for t in settings.offerings.types:
        itype = catalog.types.get(t)
        for market in settings.offerings.markets:
            try:
                price = catalog.offering(t, market).price_per_hour
            except UnknownOffering:
                continue
            if itype is not None:
                out.append(Candidate(t, market.value, itype.accelerator.value, price))
    return out


def volume_per_hour(settings: Settings, ebs_gb_month: float) -> float:
    """What a stopped worker's root volume costs an hour ($, ``offerings.volume_gb`` at
    ``ebs_gb_month``)."""
    return ebs_per_hour(settings.offerings.volume_gb, ebs_gb_month)


def standby_value(
    settings: Settings,
    boot_s: float,
    ebs_gb_month: float,
    seen: InterruptionEvidence = InterruptionEvidence(),
) -> StandbyValue:
    """What prices a stopped standby (``provisioner.standby_value``): the spot interruption
    rate (the configured one, learned from the notices ``seen``), the boot a replacement
    needs, the volume's hourly price."""
    return StandbyValue(
        seen.rate_per_hour(interruptions_per_hour(settings.offerings.spot_interruption_rate)),
        boot_s,
        volume_per_hour(settings, ebs_gb_month),
    )


def orphan_config(
    settings: Settings,
    cluster: str | None,
    options: Mapping[str, Sequence[PlannerOption]],
    standby_capacity: Mapping[str, float],
    loss_fraction: float,
    *,
    boot_s: float,
    ebs_gb_month: float,
    interruptions: InterruptionEvidence = InterruptionEvidence(),
) -> OrphanConfig:
    """The sweep's rules: the cluster's tag, every configured model's standby pool, the
    grace and the kinds ``control.terminate_orphans`` lets it end."""
    ctl = settings.control
    pools = bool(settings.offerings.standby_types)  # none configured: no model keeps a pool
    return OrphanConfig(
        cluster,
        {
            m.name: StandbyPool(
                tuple(options.get(m.name, ())),
                standby_capacity.get(m.name, 0.0) if pools else 0.0,
                loss_fraction,
                standby_value(settings, boot_s, ebs_gb_month, interruptions),
            )
            for m in settings.models
        },
        ctl.orphan_grace_s,
        frozenset(ctl.terminate_orphans),
    )


def monitor_config(
    settings: Settings,
    spec: ModelSpec,
    options: Sequence[PlannerOption],
    usable: Sequence[PlannerOption] | None = None,
) -> SloMonitorConfig | None:
    """The SLO monitor's settings for one model, its backups on the offering
    ``backup_offering`` picks of ``usable`` (those of ``options`` not avoided now; all of
    them if none or every one is); None when no offering can serve it."""
    mon = settings.slo_monitor
    offering = backup_offering(options if usable is None else usable, mon.instance_type)
    offering = offering or backup_offering(options, mon.instance_type)
    if offering is None:
        return None
    return SloMonitorConfig(
        rt_max_s=spec.slo.rt_max_ms / 1000.0,
        sl_min=spec.slo.sl_min,
        window=mon.last_m,
        launch_count=mon.launch_l,
        instance_type=offering[0],
        market=offering[1],
        holdoff_s=mon.holdoff_s,
    )


def snapshot(
    model: str,
    now: float,
    fleet: Sequence[InstanceInfo],
    price: Price,
    options: Sequence[PlannerOption],
    forecast: Sequence[float] = (),
    observed_peak: float = 0.0,
    fixed_hourly: float = 0.0,
    window_minutes: Sequence[Sequence[float]] = (),
    rises: tuple[Sequence[float], Sequence[float]] = ((), ()),
    carried_rise: Rise | None = None,
    recent: tuple[float, Sequence[float]] = (5.0, ()),
) -> Snapshot:
    """``rises``: per step, the chance and the rate of the rises the forecaster foresees
    beside ``forecast`` (``mark.control.history.StepForecast``); ``carried_rise``: the
    rise a pool sized for rises carries (``provisioner.rise_headroom.rise_to_carry``);
    ``recent``: the P_s window length and the closed windows' rates, newest first
    (``mark.control.history.LoadHistory.recent_rates``)."""
    return Snapshot(
        model,
        now,
        tuple(forecast),
        observed_peak,
        tuple(options),
        members(fleet, price),
        fixed_hourly,
        tuple(tuple(m) for m in window_minutes),
        tuple(rises[0]),
        tuple(rises[1]),
        carried_rise,
        tuple(recent[1]),
        recent[0],
    )
