"""The configuration's world sections: the aws world's account, stack and spill function,
and the local world's emulation (agent slowdowns, boot delay, local Lambda)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from mark.config.specs import _check_types, _Strict


class AwsSpec(_Strict):
    """The aws world: what the CloudFormation stack's outputs name (see ``infra/``)."""

    region: str = Field(default="us-east-1", pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    endpoint_url: str | None = Field(
        default=None, pattern=r"^https?://", description="e.g. a moto server; None: AWS"
    )
    cluster: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/=+@-]{0,62}$",
        description="value of the mark:cluster tag on everything this daemon owns",
    )
    launch_template_id: str | None = Field(default=None, description="workers' launch template")
    launch_template_name: str | None = Field(default=None, description="or its name")
    launch_template_version: str = "$Latest"
    subnet_ids: tuple[str, ...] = Field(
        default=(),
        description="subnets to launch into, tried in turn on no capacity; empty: the "
        "template's network interfaces decide",
    )
    agent_port: int = Field(default=8500, ge=1, le=65535, description="every agent's port")
    boot_s: float = Field(default=120.0, ge=0, description="launch to agent serving, planned")
    interruption_queue_url: str | None = Field(
        default=None, pattern=r"^https?://", description="SQS queue fed by the EventBridge rule"
    )
    spill_function: str | None = Field(default=None, description="the Lambda spill function")
    spill_qualifier: str | None = Field(default=None, description="its alias or version")
    spill_memory_mb: int = Field(default=2048, ge=128, le=10240, description="as deployed")
    spill_provisioned_concurrency: int = Field(
        default=0, ge=0, description="set on spill_qualifier at start when above 0"
    )
    spill_warm_concurrency: int = Field(
        default=1, ge=0, le=1000, description="runtimes pinged warm at start and periodically"
    )
    spill_warm_every_s: float = Field(
        default=300.0,
        ge=0,
        description="re-ping so idle runtimes are not reclaimed (Lambda frees them after "
        "minutes idle); 0: only at start",
    )
    lambda_endpoint_url: str | None = Field(
        default=None, pattern=r"^https?://", description="default: endpoint_url"
    )
    refresh_prices: bool = Field(
        default=True,
        description="at start: on-demand from the Pricing API, spot from the price history; "
        "the shipped table where either fails",
    )
    pricing_endpoint_url: str | None = Field(
        default=None, pattern=r"^https?://", description="default: endpoint_url"
    )
    metrics: bool = Field(default=True, description="publish CloudWatch metrics")
    metrics_period_s: float = Field(default=60.0, ge=1.0, le=3600.0)

    @model_validator(mode="after")
    def _one_template(self) -> AwsSpec:
        if self.launch_template_id is not None and self.launch_template_name is not None:
            raise ValueError("give launch_template_id or launch_template_name, not both")
        return self


class LocalSpec(_Strict):
    """The embedded local world (moto as EC2, agent processes as instances, local Lambda)."""

    boot_delay_s: float = Field(default=5.0, ge=0, description="launch to agent start")
    control_loop: bool = Field(default=True, description="run the planner every P_u")
    lambda_concurrency: int = Field(default=4, ge=1, le=64)
    lambda_memory_mb: int = Field(default=2048, ge=128, le=10240)
    slowdown: dict[str, float] = Field(
        default_factory=dict,
        description="emulated speed per instance type: this machine's T_b times the factor "
        "(default: 1 for accelerated types, 8 / vCPUs for CPU types)",
    )
    ec2_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="an EC2/SQS/EventBridge endpoint (a moto server) that outlives the daemon, "
        "instead of the world's own moto: a restarted daemon finds its fleet there (with "
        "local.cluster); None: a moto server of its own, gone when the daemon stops",
    )
    cluster: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/=+@-]{0,62}$",
        description="the mark:cluster tag of the local fleet; None: a fresh local-<8 hex> at "
        "every start (nothing to adopt from a moto that died with the last daemon)",
    )
    reference_profile: dict[str, str] = Field(
        default_factory=dict,
        description="per model, the T_b on this machine agents emulate (b:seconds,..., "
        "slowed per type as above) instead of measuring it at start: for runs that must "
        "not depend on this machine's noise (the parity test)",
    )

    @field_validator("reference_profile")
    @classmethod
    def _profiles(cls, v: dict[str, str]) -> dict[str, str]:
        from bouncer.latency import BatchLatency

        for model, text in v.items():
            try:
                BatchLatency.parse(text)
            except ValueError as exc:
                raise ValueError(f"local.reference_profile[{model!r}]: {exc}") from None
        return v

    @field_validator("slowdown")
    @classmethod
    def _factors(cls, v: dict[str, float]) -> dict[str, float]:
        _check_types(list(v), "instance type")
        for t, f in v.items():
            if f < 1:
                raise ValueError(f"slowdown of {t} is {f}; allowed: 1 or more (never faster)")
        return v
