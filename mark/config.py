"""Typed configuration: defaults < YAML file < ``MARK_*`` environment < CLI overrides.

Every value is validated when loaded, so a typo fails at start-up with a message
that names the field, the value and what is allowed, not an hour later in a
control-loop step. Names follow the paper's notation in their descriptions
(P_u, P_w, P_s, τ, RT_max, SL_min) so the two can be read side by side.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from mark.catalog import Market, load_catalog
from mark.errors import ConfigError

World = Literal["sim", "local", "aws"]
Dtype = Literal["float32", "float64", "int64", "int32", "uint8", "bool"]
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLO(_Strict):
    """A model's latency objective (paper §4.1, following Swayam)."""

    rt_max_ms: float = Field(gt=0, le=600_000, description="RT_max: response-time threshold")
    sl_min: float = Field(
        gt=0, le=1, description="SL_min: fraction of requests that must finish within RT_max"
    )


class InputSchema(_Strict):
    """Shape of one instance (without the batch dimension) and its dtype."""

    shape: tuple[int, ...] = Field(min_length=1)
    dtype: Dtype = "float32"

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be a positive integer, got {list(v)}")
        return v


class ModelSpec(_Strict):
    """A model served by mark."""

    name: str = Field(description="URL-safe name: lowercase letters, digits, '.', '_' and '-'")
    source: str = Field(
        description="a TorchScript file path, or 'package.module:factory' returning a torch module"
    )
    input: InputSchema
    slo: SLO
    profile: Path | None = Field(
        default=None, description="profile file (batch latencies per instance type)"
    )
    max_rate_rps: float | None = Field(
        default=None,
        gt=0,
        description="the most load this model can see (r/s); forecasts above it are clipped",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                f"{v!r} is not a valid model name; allowed: 1-63 of a-z 0-9 . _ - "
                "starting with a letter or digit"
            )
        return v

    @property
    def loader(self) -> Literal["torchscript", "factory"]:
        return "factory" if ":" in self.source and not Path(self.source).exists() else "torchscript"


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
    max_instances: int = Field(default=50, ge=1, le=10_000)

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
    lead_time_s: float = Field(default=300, ge=0, description="τ: provision for the load τ ahead")
    cooldown_s: float = Field(default=300, ge=0, description="idle time before retiring")
    billing_minimum_s: float = Field(default=60, ge=0, description="EC2 per-second minimum")

    @model_validator(mode="after")
    def _consistent(self) -> Timings:
        if self.sample_window_s > self.update_period_s:
            raise ValueError(
                f"sample_window_s (P_s = {self.sample_window_s}) must not exceed "
                f"update_period_s (P_u = {self.update_period_s})"
            )
        horizon = self.window_steps * self.update_period_s
        if self.lead_time_s >= horizon:
            raise ValueError(
                f"lead_time_s (τ = {self.lead_time_s}) must be shorter than the forecast "
                f"horizon P_w × P_u = {horizon:g} s"
            )
        return self


class SloMonitorSpec(_Strict):
    """Reactive backups when recent requests miss the SLO (paper §4.4)."""

    last_m: int = Field(default=100, ge=1, description="M: requests looked at")
    launch_l: int = Field(default=1, ge=1, description="L: instances launched on a miss streak")
    instance_type: str = Field(default="c5.large", description="T: type of the backups")
    holdoff_s: float = Field(default=120, ge=0, description="no second launch within this")

    @field_validator("instance_type")
    @classmethod
    def _known(cls, v: str) -> str:
        _check_types([v], "instance type")
        return v


class PredictorSpec(_Strict):
    """The workload predictor the control loop asks each P_u (paper §4.2)."""

    model: str = Field(
        default="lstm",
        description="lstm, seasonal, seasonal-week, last, paper, ets, sarima, or pkg.module:Class",
    )
    model_file: Path | None = Field(
        default=None, description="a model saved by `mark predictor train`, used from the start"
    )
    history_minutes: int = Field(default=1500, ge=60, description="history handed to the model")
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

    @field_validator("slowdown")
    @classmethod
    def _factors(cls, v: dict[str, float]) -> dict[str, float]:
        _check_types(list(v), "instance type")
        for t, f in v.items():
            if f < 1:
                raise ValueError(f"slowdown of {t} is {f}; allowed: 1 or more (never faster)")
        return v


class ApiSpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)


def _default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "mark"


def _demo_model() -> ModelSpec:
    return ModelSpec(
        name="digits",
        source="mark.demo:digits_model",
        input=InputSchema(shape=(1, 8, 8), dtype="float32"),
        slo=SLO(rt_max_ms=100, sl_min=0.98),
    )


_DB_PREFIXES = {
    "sqlite:": "sqlite+aiosqlite:",
    "postgresql:": "postgresql+asyncpg:",
    "postgres:": "postgresql+asyncpg:",
}
_DB_ALLOWED = ("sqlite+aiosqlite:", "postgresql+asyncpg:")

_yaml_file: ContextVar[Path | None] = ContextVar("mark_yaml_file", default=None)


class Settings(BaseSettings):
    """Everything the daemon, the simulator and the CLI are configured by."""

    model_config = SettingsConfigDict(
        env_prefix="MARK_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    world: World = "local"
    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: a SQLite file in data_dir"
    )
    aws: AwsSpec = AwsSpec()
    api: ApiSpec = ApiSpec()
    local: LocalSpec = LocalSpec()
    models: tuple[ModelSpec, ...] = Field(default_factory=lambda: (_demo_model(),))
    offerings: OfferingsSpec = OfferingsSpec()
    timings: Timings = Timings()
    slo_monitor: SloMonitorSpec = SloMonitorSpec()
    predictor: PredictorSpec = PredictorSpec()
    budget: BudgetSpec = BudgetSpec()

    @field_validator("database_url")
    @classmethod
    def _db_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        for plain, driver in _DB_PREFIXES.items():
            if v.startswith(plain):
                return driver + v[len(plain) :]
        if not v.startswith(_DB_ALLOWED):
            raise ValueError(
                f"unsupported database URL {v!r}; allowed: sqlite:///PATH or "
                "postgresql://USER@HOST:PORT/DB"
            )
        return v

    @field_validator("models")
    @classmethod
    def _unique(cls, v: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        if not v:
            raise ValueError("at least one model must be configured")
        names = [m.name for m in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        return v

    @property
    def db_url(self) -> str:
        if self.database_url is not None:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'mark.db'}"

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise ConfigError(
            f"unknown model {name!r}; configured: {', '.join(m.name for m in self.models)}"
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _yaml_file.get()
        if path is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_file=path))


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Turn ``["timings.cooldown_s=600", "world=sim"]`` into a nested dict.

    Values are read as YAML scalars/flows, so ``600`` is a number and
    ``[c5.large, m5.large]`` a list.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. timings.cooldown_s=600)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {part}")
            node = nxt
        node[parts[-1]] = value
    return out


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "config"


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: ``field = value: what is allowed``."""
    lines = []
    for e in err.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not str(p).startswith(("function-", "tagged-")))
        msg = str(e["msg"]).removeprefix("Value error, ")
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            lines.append(f"{_loc(loc)}: unknown setting (check the spelling)")
        elif e["type"] == "missing":
            lines.append(f"{_loc(loc)}: required but missing")
        elif isinstance(value, Mapping | list):
            lines.append(f"{_loc(loc)}: {msg}")
        else:
            lines.append(f"{_loc(loc)} = {value!r}: {msg}")
    return "; ".join(lines)


@contextmanager
def _yaml_source(path: Path | None) -> Iterator[None]:
    token = _yaml_file.set(path)
    try:
        yield
    finally:
        _yaml_file.reset(token)


def load_settings(
    config_file: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Load and validate the configuration; raise ``ConfigError`` with a readable message."""
    if config_file is not None:
        if not config_file.is_file():
            raise ConfigError(f"config file {str(config_file)!r} does not exist")
        try:
            loaded = yaml.safe_load(config_file.read_text())
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}" if where is not None else ""
            raise ConfigError(f"config file {str(config_file)!r} is not valid YAML{at}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(config_file)!r} must hold a mapping of settings")
    try:
        with _yaml_source(config_file):
            return Settings(**dict(overrides or {}))
    except ValidationError as err:
        raise ConfigError(f"invalid configuration: {format_validation_error(err)}") from None


def dump_settings(settings: Settings) -> dict[str, Any]:
    """The effective configuration as plain YAML-able data (what `mark config show` prints)."""
    data = settings.model_dump(mode="json")
    data["database_url"] = settings.db_url
    return data
