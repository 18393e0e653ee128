"""The configuration's sections: offerings, timings, predictor, planner, budget, control
and the API (``Settings`` in ``mark.config.settings`` holds them; models and their SLOs are
in ``mark.config.models``, the aws and local worlds in ``mark.config.worlds``).

Every value is validated when loaded, so a typo fails at start-up with a message
that names the field, the value and what is allowed. Names follow the paper's
notation in their descriptions (P_u, P_w, P_s, τ, RT_max, SL_min).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mark.catalog import Market, load_catalog
from provisioner.rise_headroom import DEFAULT_RISE_MISS_SHARE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_types(types: Sequence[str], what: str) -> None:
    catalog = load_catalog()
    for t in types:
        if t not in catalog.types:
            family = t.split(".", 1)[0]
            same = [i for n, i in catalog.types.items() if n.startswith(family + ".")]
            near = [i.name for i in sorted(same, key=lambda i: (i.vcpus, i.name))][:12]
            hint = f"e.g. {', '.join(near)}" if near else "see `mark catalog`"
            raise ValueError(
                f"unknown {what} {t!r}; allowed: instance types in the catalog ({hint})"
            )


class OfferingsSpec(_Strict):
    """Which offerings (instance type × market) the planner may buy."""

    types: tuple[str, ...] = Field(
        default=(
            "c5.large",
            "c5.xlarge",
            "c5.2xlarge",
            "c5.4xlarge",
            "m5.large",
            "g4dn.xlarge",
            "inf1.xlarge",
        ),
        min_length=1,
    )
    markets: tuple[Market, ...] = Field(default=(Market.ON_DEMAND,), min_length=1)
    standby_types: tuple[str, ...] = Field(
        default=("t3.large",), description="stopped burstable standbys for spot interruptions"
    )
    spot_interruption_rate: float = Field(
        default=0.2,
        ge=0,
        description="the share of spot instances interrupted a month (the AWS Spot Instance "
        "Advisor's 'frequency of interruption'; 0.2, its top bucket '>20%', by default), "
        "the prior of the rate learned from the notices the daemon sees: where spill "
        "answers within RT_max, the stopped standby pool keeps no more standbys than the "
        "spill they would save at that rate pays the volumes of",
    )
    max_instances: int = Field(default=50, ge=1, le=10_000)
    volume_gb: float = Field(
        default=8.0,
        ge=0,
        description="a worker's root EBS volume (GiB), billed while it is stopped: 8 for "
        "the stack's default Amazon Linux 2023 AMI; a GPU AMI's is larger",
    )

    @field_validator("types")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _check_types(v, "instance type")
        return v

    @field_validator("standby_types")
    @classmethod
    def _burstable(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _check_types(v, "standby type")
        catalog = load_catalog()
        for t in v:
            if not catalog.types[t].burstable:
                allowed = ", ".join(sorted(n for n, i in catalog.types.items() if i.burstable)[:8])
                raise ValueError(f"standby type {t!r} is not burstable; allowed: {allowed}, ...")
        return v


class Timings(_Strict):
    """Control-loop timings; defaults are the paper's (§4.2, §4.3)."""

    update_period_s: float = Field(default=60, gt=0, description="P_u: prediction unit")
    window_steps: int = Field(default=60, ge=1, le=1440, description="P_w: steps forecast")
    sample_window_s: float = Field(default=5, gt=0, description="P_s: arrival sample window")
    early_steps: bool = Field(
        default=True,
        description="plan before the next P_u once two P_s windows in a row run above both "
        "the rate the last plan was made for and the fleet's capacity, while spill answers "
        "within RT_max (provisioner.early_step)",
    )
    lead_time_s: float | None = Field(
        default=None,
        ge=0,
        description="τ: provision for the load τ ahead; default the boot time, from when an "
        "instance launched now serves (the paper's 300 s planned past a 120 s boot for a "
        "forecast 3 minutes staler than needed), and with warm_start_s, a start's while "
        "the warm pool holds an instance",
    )
    cooldown_s: float | None = Field(
        default=None,
        ge=0,
        description="idle time before retiring; default the boot time: idling longer costs "
        "more than relaunching (ski rental), and a start for one stopped into the warm pool",
    )
    billing_minimum_s: float = Field(default=60, ge=0, description="EC2 per-second minimum")
    warm_start_s: float | None = Field(
        default=20.0,
        gt=0,
        description="a stopped worker's start to serving: retired on-demand instances are "
        "stopped into a warm pool and started again before any launch of their type, kept "
        "while their volume costs less than the boot a start spares (provisioner.warm_pool); "
        "where a start is no faster than the boot, or null, they are terminated. Not "
        "measured by mark: about 5 s to boot from a hydrated volume (depot.dev, 'Making EC2 "
        "boot time 8x faster', 2024) plus the agent loading its model",
    )
    boot_deadline_s: float | None = Field(
        default=None,
        gt=0,
        description="launch to agent ready at the latest, else replaced; default 3 × boot, ≥ 60 s",
    )
    probe_every_s: float = Field(default=5, gt=0, description="liveness probe of every agent")
    probe_timeout_s: float = Field(default=5, gt=0, description="a probe's one inference, at most")
    unhealthy_after_s: float = Field(
        default=15, ge=0, description="failing probes (or a dead agent) this long: replaced"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Timings:
        if self.sample_window_s > self.update_period_s:
            raise ValueError(
                f"sample_window_s (P_s = {self.sample_window_s}) must not exceed "
                f"update_period_s (P_u = {self.update_period_s})"
            )
        horizon = self.window_steps * self.update_period_s
        if self.lead_time_s is not None and self.lead_time_s >= horizon:
            raise ValueError(
                f"lead_time_s (τ = {self.lead_time_s}) must be shorter than the forecast "
                f"horizon P_w × P_u = {horizon:g} s"
            )
        return self

    def cooldown(self, boot_s: float) -> float:
        """How long an instance the plan no longer wants stays: ``cooldown_s``, else the boot
        time. Keeping an idle instance costs its price per second; retiring it and buying
        it back later costs its boot (price × boot time, the launch overhead), so waiting
        the boot time before retiring never pays more than twice the better of the two in
        hindsight (the ski-rental rule)."""
        return self.cooldown_s if self.cooldown_s is not None else boot_s

    def lead_steps(self, boot_s: float) -> int:
        """τ in control steps, at least one: ``lead_time_s``, else the boot time rounded up
        (an instance launched now serves from then, so that is the first load it can
        meet; planning further ahead buys for a forecast staler than needed, and
        planning nearer buys for steps it cannot serve), within the forecast's P_w."""
        if self.lead_time_s is not None:
            return max(1, round(self.lead_time_s / self.update_period_s))
        steps = math.ceil(boot_s / self.update_period_s - 1e-9)
        return max(1, min(steps, self.window_steps - 1))


class SloMonitorSpec(_Strict):
    """Reactive backups when recent requests miss the SLO (paper §4.4)."""

    last_m: int = Field(default=100, ge=1, description="M: requests looked at")
    launch_l: int = Field(
        default=1,
        ge=1,
        description="L: instances launched on a miss streak (at least; where spill misses "
        "RT_max, as many as carry the measured load above the fleet)",
    )
    instance_type: str | None = Field(
        default=None,
        description="T: type of the backups (its cheapest market the plans may buy); unset: "
        "the model's cheapest offering by hourly price, spot included where the plans may "
        "buy it (provisioner/slo_monitor.py backup_offering)",
    )
    holdoff_s: float = Field(default=120, ge=0, description="no second launch within this")

    @field_validator("instance_type")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None:
            _check_types([v], "instance type")
        return v


class PredictorSpec(_Strict):
    """The workload predictor the control loop asks each P_u (paper §4.2)."""

    model: str = Field(
        default="lstm-calendar",
        description="lstm-calendar (the LSTM, and the recurring rises beside it that the "
        "planner may buy ahead for), lstm, seasonal, seasonal-week, last, paper, ets, sarima, or "
        "pkg.module:Class",
    )
    model_file: Path | None = Field(
        default=None, description="a model saved by `mark predictor train`, used from the start"
    )
    history_minutes: int = Field(default=1500, ge=60, description="history handed to the model")
    fit_history_minutes: int = Field(
        default=14 * 1440,
        ge=60,
        description="history a refit learns from (at least history_minutes): days, as the "
        "simulator's forecaster learns from every day before its window",
    )
    refit_every_minutes: int = Field(default=1440, ge=60, description="refit schedule (nightly)")
    refit_at_minute_of_day: int | None = Field(default=180, ge=0, lt=1440)
    min_history_minutes: int = Field(
        default=1440, ge=60, description="observed minutes before a learned model first fits"
    )
    max_forecast_multiple: float | None = Field(
        default=2.0,
        ge=1.0,
        description="a forecast step above this × the history's observed peak is clipped",
    )

    @field_validator("model")
    @classmethod
    def _known(cls, v: str) -> str:
        from predictor.registry import resolve

        try:
            resolve(v)
        except Exception as exc:
            raise ValueError(str(exc)) from None
        return v


class ExploreSpec(_Strict):
    """Measuring offering types no profile rates: the control loop launches one instance of
    such a type, its agent times the model, and the type is planned from then on. On by
    default: in the aws world a model with no profile would otherwise get no instance."""

    max_concurrent: int = Field(
        default=1,
        ge=0,
        le=100,
        description="exploring instances in the cluster at once (within the spend rails and "
        "offerings.max_instances; each lives until its agent reports, at most the boot "
        "deadline); 0: off",
    )
    interval_s: float = Field(
        default=3600.0,
        gt=0,
        description="at least this long between two explorations of a model; waived while "
        "no rated offering can serve it and none of its offerings failed lately (a new "
        "model explores at its first step)",
    )


class PlannerSpec(_Strict):
    """What the planner may do beyond buying rated offerings."""

    explore_unprofiled: ExploreSpec = ExploreSpec()
    pooled_capacity: bool | Literal["auto"] = Field(
        default="auto",
        description="rate instances by what each carries within the SLO in a pool of the "
        "size planned (the dispatcher pools a model's instances), not alone "
        "(provisioner/pooling.py); false plans with stand-alone capacities as the paper. "
        "A pool runs close to saturation and leans on the Bouncer spilling its transient "
        "overload to Lambda, so auto pools while the model's spilled requests are measured "
        "to answer within RT_max, most of them (provisioner/spill_evidence.py); otherwise, "
        "once the history shows its rises within a boot time, at pooled capacity divided "
        "by the rise it must carry (rise_miss_share), never below stand-alone "
        "(provisioner/rise_headroom.py)",
    )
    rise_miss_share: float = Field(
        default=DEFAULT_RISE_MISS_SHARE,
        ge=0,
        le=1,
        description="where pooled_capacity is auto and spill cannot answer in time: the "
        "share of the SLO's miss allowance (1 - SL_min) the pool may leave to rises, less "
        "what the last hour's misses already spent (every miss, declines included); the "
        "pool then carries the least rise whose misses fit it in every hour of the "
        "model's history. 0: carry the largest rise within a boot time the history shows",
    )
    rise_by_misses: bool = Field(
        default=True,
        description="where the pool carries a rise (above): carry only the part of it the "
        "measured misses show is needed, in proportion to the share of rise_miss_share "
        "they spent, the last hour's or the SLO period's, whichever is more: pool "
        "outright while nothing missed, the whole rise once that share is spent "
        "(provisioner/rise_headroom.py by_misses); false: the whole rise always",
    )
    spill_capacity_target: bool = Field(
        default=True,
        description="plan a step's capacity at the newsvendor quantile of its 5 s rates "
        "rather than its peak, leaving the rest to spill, once spill is measured to meet "
        "RT_max and its price per request is known (provisioner/capacity_target.py); "
        "false: always the peak, as the paper",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: object) -> object:
        if isinstance(data, dict) and "persisting_floor" in data:
            raise ValueError(
                "planner.persisting_floor was removed: the floor saved nothing beyond its "
                "spread on mark or mark-spot across the Twitter windows "
                "(experiments/windows/README.md); delete the setting"
            )
        return data


OrphanKind = Literal["removed-model", "beyond-pool"]
_ORPHAN_KINDS: tuple[OrphanKind, ...] = ("removed-model", "beyond-pool")


class ControlSpec(_Strict):
    """What the control loop does beyond planning: the orphan sweep and the leader lease.

    Every step the loop lists the cluster's tagged instances and reports those no
    configured model, pool or step claims (decisions ``orphan``); it terminates those
    of the kinds named here once they have been orphans for the grace. A ``true``
    means every kind, ``false`` none. Instances without the cluster's tag are never
    touched. One controller at a time acts: it holds a lease in the database, renewed
    on a timer of its own every third of ``lease_ttl_s``; another one sharing the
    database serves requests but plans nothing, and takes over within the TTL once the
    holder stops renewing.
    """

    terminate_orphans: tuple[OrphanKind, ...] = Field(
        default=("removed-model",),
        description="orphan kinds terminated after the grace: removed-model (instances of "
        "a model no longer configured), beyond-pool (stopped standbys beyond the pool)",
    )
    orphan_grace_s: float = Field(
        default=600.0, ge=0, description="an instance is an orphan this long before it is ended"
    )
    leader_lease: bool = Field(
        default=True, description="only the controller holding the database lease acts"
    )
    lease_ttl_s: float = Field(
        default=15.0,
        ge=3.0,
        le=600.0,
        description="a lease not renewed this long passes to another frontend's controller "
        "(renewed every third of it): how long the cluster goes unplanned after its leader "
        "dies; shorter asks the database more often",
    )

    @field_validator("terminate_orphans", mode="before")
    @classmethod
    def _all_or_none(cls, v: object) -> object:
        if v is True:
            return _ORPHAN_KINDS
        if v is False or v is None:
            return ()
        return v


class BudgetSpec(_Strict):
    """Spending rails: the control loop never starts capacity that would pay more than this.

    Dollars per hour of instances running (on-demand, spot, standbys started,
    SLO-monitor backups) plus the spill function's provisioned concurrency.
    The defaults are for a small budget (about $3,600 a month per model if it
    ran at the rail all the time); raise them to what you mean to spend, or
    set ``null`` for no rail.
    """

    max_hourly_per_model: float | None = Field(
        default=5.0, gt=0, description="$/h of one model's instances"
    )
    max_hourly_cluster: float | None = Field(
        default=10.0, gt=0, description="$/h of every model's instances + provisioned concurrency"
    )


class ApiSpec(_Strict):
    """The REST endpoint: where it listens, and who may call it (API keys, ``mark keys``)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    body_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="how long a request body may take to arrive once its headers have; a "
        "slower one gets 408 and its connection closed, so a client that promises bytes it "
        "never sends does not hold a connection",
    )
    access_log: bool | Literal["auto"] = Field(
        default="auto",
        description="one JSON line per request on the mark.access logger (request id, "
        "method, path, status, duration, bytes, model, key, client); auto: on unless the "
        "daemon logs as text to a terminal",
    )
    auth: bool = Field(
        default=True,
        description="require an API key on every route but the health checks; false only on a "
        "network where every client is trusted (logged as a warning at start)",
    )
    key_refresh_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="how often the endpoint re-reads the keys from the store: a revoked key "
        "stops working within this long",
    )
    default_rate_rps: float | None = Field(
        default=None,
        gt=0,
        description="requests per second a key may send when it sets none; null: unlimited",
    )
    default_max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="requests a key may have in flight when it sets none; null: unlimited",
    )
    burst_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="a rate-limited key may send this many seconds of its rate at once",
    )
    drain_s: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="on SIGTERM or Ctrl-C, how long requests already taken may run to their "
        "outcome before what is left is answered with an error; null: the dispatcher's "
        "outcome bound (RT_max + 2 x max(RT_max, 1 s) + the spill timeout) plus 1 s. Set it "
        "below the platform's kill timeout (ECS stopTimeout, Kubernetes "
        "terminationGracePeriodSeconds, systemd TimeoutStopSec)",
    )
    sync_wait_s: float = Field(
        default=30.0,
        ge=0,
        le=600,
        description="at start, how long readiness and inference wait for the first agent "
        "sync (so a restarted daemon knows its running instances before it serves); past "
        "it the endpoint serves anyway, spilling until the sync ends",
    )
