"""``Settings``, and loading it: defaults < YAML file < ``MARK_*`` environment < CLI overrides.

``load_settings`` validates everything and turns pydantic's errors into one
readable ``ConfigError``; ``parse_overrides`` reads ``--set KEY=VALUE``;
``dump_settings`` is what `mark config show` prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from mark.config.manifest import repository_entries
from mark.config.models import SLO, InputSchema, ModelSpec
from mark.config.specs import (
    ApiSpec,
    BudgetSpec,
    ControlSpec,
    OfferingsSpec,
    PlannerSpec,
    PredictorSpec,
    SloMonitorSpec,
    Timings,
)
from mark.config.worlds import AwsSpec, LocalSpec
from mark.errors import ConfigError

World = Literal["sim", "local", "aws"]


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
    database_connect_timeout_s: float = Field(
        default=5.0, gt=0, description="PostgreSQL: how long connecting may take"
    )
    database_statement_timeout_s: float = Field(
        default=10.0, gt=0, description="how long one statement (SQLite: a lock) may take"
    )
    database_buffer_rows: int = Field(
        default=10_000,
        ge=0,
        description="bookkeeping rows kept while the database cannot be reached; "
        "past it the oldest are dropped (counted)",
    )
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="log lines as JSON objects or text; auto: JSON in the aws world or "
        "when stderr is not a terminal",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    aws: AwsSpec = AwsSpec()
    api: ApiSpec = ApiSpec()
    local: LocalSpec = LocalSpec()
    repository: str | None = Field(
        default=None,
        description="a model repository, a directory or s3://bucket/prefix: every "
        "subdirectory with a model.yaml is served, beside the models listed under models "
        "(from S3, each is fetched under data_dir/repository)",
    )
    repository_poll_s: float = Field(
        default=30.0,
        ge=0,
        description="how often the repository is read again (also on SIGHUP): a model "
        "whose version changed is checked and rolled to; 0: only at start",
    )
    models: tuple[ModelSpec, ...] = Field(default_factory=lambda: (_demo_model(),))
    offerings: OfferingsSpec = OfferingsSpec()
    timings: Timings = Timings()
    slo_monitor: SloMonitorSpec = SloMonitorSpec()
    predictor: PredictorSpec = PredictorSpec()
    planner: PlannerSpec = PlannerSpec()
    budget: BudgetSpec = BudgetSpec()
    control: ControlSpec = ControlSpec()

    @property
    def spill_memory_mb(self) -> int:
        """The spill function's memory in this world: as deployed (aws), or the local
        Lambda's runtimes'."""
        return self.aws.spill_memory_mb if self.world == "aws" else self.local.lambda_memory_mb

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

    @model_validator(mode="before")
    @classmethod
    def _repository(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("repository") is None:
            return data
        data_dir = Path(str(data.get("data_dir") or _default_data_dir()))
        entries = repository_entries(str(data["repository"]), data_dir / "repository")
        # A repository replaces the demo model; models listed beside it are kept.
        return {**data, "models": [*data.get("models", ()), *entries]}

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
