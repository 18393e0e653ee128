"""The ``World`` port: what the daemon needs of the world it runs in (local or aws).

The daemon starts a world, reads its parts (fleet, agents, spill function,
interruption source), asks it for prices and for the latency it plans with,
runs the periodic jobs it names, and closes it; it never asks which world it
is. ``open_world`` is the one place that chooses, from ``settings.world``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bouncer.latency import BatchLatency
from mark.catalog import Catalog
from mark.config import ModelSpec, Settings
from mark.errors import ConfigError
from mark.ports import Fleet, InstanceInfo, Serverless
from mark.state.records import ArrivalWindow, LatencyRollup, LedgerEntry


class AgentView(Protocol):
    """An instance's agent as the dispatcher needs it."""

    @property
    def instance(self) -> InstanceInfo: ...
    @property
    def url(self) -> str: ...
    @property
    def latency(self) -> BatchLatency: ...
    @property
    def variants(self) -> dict[str, BatchLatency]:
        """T_b of each variant the agent loaded beside the model's own."""
        ...


class Agents(Protocol):
    """The agents serving now, brought up to date by ``sync``."""

    @property
    def agents(self) -> Mapping[str, AgentView]:
        """The agents that serve now: ready and passing their liveness probe."""
        ...

    @property
    def instance_ids(self) -> Sequence[str]:
        """The instances of the last listing (serving or not)."""
        ...

    async def sync(self) -> None: ...


class BilledServerless(Serverless, Protocol):
    def take_charges(self) -> list[LedgerEntry]:
        """The spill charges accrued since the last call, for the ledger."""
        ...


class NoticeSource(Protocol):
    async def run(self, active: Callable[[], bool] | None = None) -> None:
        """Deliver spot notices to the fleet's stream until cancelled; while ``active``
        says no (this frontend does not lead), take none off the queue, so the leader
        hears every one."""
        ...


@dataclass(frozen=True)
class Job:
    """A periodic task a world needs run (spill warm-up, metrics publishing)."""

    every_s: float
    name: str
    run: Callable[[], Awaitable[None]]
    at_stop: bool = False
    """Run once more when the daemon stops (the last, partial metrics period)."""


class World(Protocol):
    @property
    def fleet(self) -> Fleet | None: ...
    @property
    def agents(self) -> Agents | None: ...
    @property
    def serverless(self) -> BilledServerless | None: ...
    @property
    def interruptions(self) -> NoticeSource | None: ...
    @property
    def boot_s(self) -> float:
        """Seconds from launch to serving, as the planner counts them."""
        ...

    @property
    def control_loop(self) -> bool:
        """Whether the daemon plans and launches here (the local world can be told not to)."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    async def prices(self, catalog: Catalog, instance_types: Sequence[str]) -> Catalog:
        """The catalog with the prices this world pays."""
        ...

    @property
    def agents_measure(self) -> bool:
        """Whether an agent's reported T_b was measured on its instance type (aws), or
        is this machine's time stretched by the local world's rule (local)."""
        ...

    async def emulated_latency(
        self, spec: ModelSpec, source: str, catalog: Catalog, types: Sequence[str]
    ) -> dict[str, BatchLatency]:
        """T_b per type by a rule, where this world emulates instance types (local only;
        the aws world rates types from measured or shipped profiles, never a rule)."""
        ...

    def jobs(self, catalog: Catalog, leads: Callable[[], bool]) -> list[Job]:
        """Periodic tasks to run while the daemon does; ``leads``: whether this frontend
        leads now, for the work done once per cluster (spill warm-up, the fleet's cost)."""
        ...

    def observe(self, windows: Sequence[ArrivalWindow], rollups: Sequence[LatencyRollup]) -> None:
        """Telemetry as it is flushed (the aws world publishes it as metrics)."""
        ...

    def use_model(self, spec: ModelSpec, artifact: str) -> None:
        """From now on, ``spec`` (its version; ``artifact``: its file on this machine) is
        what the spill function runs and what an instance tagged with its version runs."""
        ...

    def fixed_hourly(self, catalog: Catalog) -> float:
        """$/h this world pays whatever the fleet (provisioned concurrency)."""
        ...


def open_world(settings: Settings, sources: Mapping[str, str], clock: Callable[[], float]) -> World:
    """The world ``settings.world`` names, not yet started."""
    if settings.world == "aws":
        from mark.cloud.aws.world import AwsWorld

        return AwsWorld(settings, clock)
    if settings.world == "local":
        from mark.catalog import load_catalog
        from mark.cloud.local.agents import AgentModel
        from mark.cloud.local.world import LocalWorld, fresh_cluster

        return LocalWorld(
            settings.aws.region,
            load_catalog(),
            {m.name: AgentModel(m.contract(sources[m.name])) for m in settings.models},
            clock,
            boot_delay_s=settings.local.boot_delay_s,
            lambda_env={"MARK_DATA_DIR": str(settings.data_dir)},
            lambda_concurrency=settings.local.lambda_concurrency,
            lambda_memory_mb=settings.local.lambda_memory_mb,
            slowdown=settings.local.slowdown,
            control_loop=settings.local.control_loop,
            probe_every_s=settings.timings.probe_every_s,
            probe_timeout_s=settings.timings.probe_timeout_s,
            profiles={
                name: BatchLatency.parse(text)
                for name, text in settings.local.reference_profile.items()
            },
            external_endpoint=settings.local.ec2_endpoint,
            cluster=settings.local.cluster or fresh_cluster(),
        )
    raise ConfigError(
        f"world {settings.world!r} cannot run as a daemon; use 'local' or 'aws' "
        "(the simulator runs the sim world)"
    )
