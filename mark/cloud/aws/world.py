"""The aws world: the adapters a daemon on AWS runs, wired from ``Settings.aws``.

EC2 through ``AwsFleet`` (the stack's worker launch template, this cluster's
tags), spot notices from the stack's SQS queue, agents found at their
instances' private addresses, the spill function through ``AwsLambda``, and
CloudWatch metrics. ``aws.endpoint_url`` points every client somewhere else (a
moto server in the tests) and ``aws.lambda_endpoint_url`` the Lambda client
alone (the Invoke stand-in); nothing here knows or asks which it is talking to.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from bouncer.agent_token import TOKEN_ENV
from bouncer.latency import BatchLatency
from mark.billing import provisioned_hourly
from mark.catalog import Catalog
from mark.cloud.aws.agents import AgentDirectory
from mark.cloud.aws.fleet import AwsFleet, LaunchTemplateRef
from mark.cloud.aws.interruptions import SqsInterruptionSource
from mark.cloud.aws.lambda_ import AwsLambda
from mark.cloud.aws.metrics import CloudWatchMetrics
from mark.cloud.aws.pricing import refresh_on_demand_prices
from mark.cloud.aws.spot_prices import refresh_spot_prices
from mark.config import ModelSpec, Settings
from mark.errors import CloudError, ConfigError, UnknownOffering
from mark.ports import InstanceState
from mark.state.records import ArrivalWindow, LatencyRollup
from mark.world import Job

log = logging.getLogger("mark.aws")

_LIVE = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.READY}


def worker_fleet(settings: Settings) -> AwsFleet:
    """The cluster's EC2 fleet, launching through the stack's worker launch template
    (not yet opened); ``ConfigError`` if no template is configured."""
    aws = settings.aws
    if aws.launch_template_id is None and aws.launch_template_name is None:
        raise ConfigError(
            "world 'aws' needs aws.launch_template_id (the stack's WorkerLaunchTemplateId) "
            "or aws.launch_template_name"
        )
    template = LaunchTemplateRef(
        name=aws.launch_template_name,
        id=aws.launch_template_id,
        version=aws.launch_template_version,
    )
    return AwsFleet(
        aws.region,
        aws.endpoint_url,
        aws.cluster,
        template,
        subnet_ids=aws.subnet_ids,
    )


@dataclass
class AwsWorld:
    settings: Settings
    clock: Callable[[], float]
    fleet: AwsFleet | None = None
    agents: AgentDirectory | None = None
    serverless: AwsLambda | None = None
    interruptions: SqsInterruptionSource | None = None
    metrics: CloudWatchMetrics | None = None

    @property
    def models(self) -> list[str]:
        return [m.name for m in self.settings.models]

    async def start(self) -> None:
        aws = self.settings.aws
        if not os.environ.get(TOKEN_ENV):
            # A token made up here matches no worker's: every agent would answer 401.
            log.warning(
                "%s is not set: the workers' agents will refuse this daemon "
                "(the stack's bootstrap sets it from its secret; infra/README.md)",
                TOKEN_ENV,
            )
        self.fleet = worker_fleet(self.settings)
        await self.fleet.open()
        self.agents = AgentDirectory(
            self.fleet,
            aws.agent_port,
            self.fleet.notify,
            self.clock,
            probe_every_s=self.settings.timings.probe_every_s,
            probe_timeout_s=self.settings.timings.probe_timeout_s,
        )
        if aws.interruption_queue_url is not None:
            self.interruptions = SqsInterruptionSource(
                aws.interruption_queue_url,
                self.fleet.notify,
                region=aws.region,
                endpoint_url=aws.endpoint_url,
            )
            await self.interruptions.open()
        else:
            log.warning("no aws.interruption_queue_url: spot notices only from agents (IMDS)")
        if aws.spill_function is not None:
            self.serverless = AwsLambda(
                aws.spill_function,
                region=aws.region,
                endpoint_url=aws.lambda_endpoint_url or aws.endpoint_url,
                qualifier=aws.spill_qualifier,
                # A model from the repository in S3 goes with its contract (the artifact
                # in S3); no other source: a path on this machine means nothing in
                # Lambda, and a single-model function knows its model (MARK_MODEL_SOURCE).
                sources={m.name: m.contract() for m in self.settings.models if m.location},
                models=self.models,  # who share its provisioned concurrency's cost
                memory_mb=aws.spill_memory_mb,
                provisioned_concurrency=aws.spill_provisioned_concurrency,
            )
            await self.serverless.open()
            await self.serverless.ensure_provisioned_concurrency()
            await self.warm_up()
        else:
            log.warning("no aws.spill_function: requests no instance can take will fail")
        if aws.metrics:
            self.metrics = CloudWatchMetrics(
                self.models,
                cluster=aws.cluster,
                region=aws.region,
                endpoint_url=aws.endpoint_url,
            )
            await self.metrics.open()

    @property
    def boot_s(self) -> float:
        return self.settings.aws.boot_s

    @property
    def control_loop(self) -> bool:
        return True

    @property
    def agents_measure(self) -> bool:
        return True  # each agent times the model on its own instance's device

    async def emulated_latency(
        self, spec: ModelSpec, source: str, catalog: Catalog, types: Sequence[str]
    ) -> dict[str, BatchLatency]:
        return {}  # no rule: a type is rated from a measured or shipped profile only

    def jobs(self, catalog: Catalog, leads: Callable[[], bool]) -> list[Job]:
        """The spill warm-up, by the leader only (N frontends would keep N times the
        runtimes warm), and CloudWatch metrics: every frontend publishes the arrivals and
        SLO outcomes it saw (read them with the Sum statistic across frontends for the
        cluster's rate), the leader alone the fleet's cost."""
        aws = self.settings.aws
        out = []
        if aws.spill_warm_every_s > 0:

            async def warm() -> None:
                if leads():
                    await self.warm_up()

            out.append(Job(aws.spill_warm_every_s, "spill warm-up", warm))
        if self.metrics is not None:

            async def publish() -> None:
                await self.publish_metrics(catalog, with_cost=leads())

            out.append(Job(aws.metrics_period_s, "CloudWatch metrics", publish, at_stop=True))
        return out

    def observe(self, windows: Sequence[ArrivalWindow], rollups: Sequence[LatencyRollup]) -> None:
        if self.metrics is not None:
            self.metrics.observe(windows, rollups)

    async def publish_metrics(self, catalog: Catalog, *, with_cost: bool = True) -> None:
        """One CloudWatch period: arrivals and SLO from telemetry, and ``with_cost`` the cost
        of the live fleet now."""
        if self.metrics is None or self.agents is None:
            return
        if not with_cost:
            self.metrics.set_cost_rate(None)
            await self.metrics.publish(self.clock())
            return
        cost = dict.fromkeys(self.models, 0.0)
        for inst in self.agents.instances:
            if inst.state in _LIVE and inst.model in cost:
                try:
                    price = catalog.offering(inst.instance_type, inst.market).price_per_hour
                except UnknownOffering:
                    continue
                cost[inst.model] += price
        self.metrics.set_cost_rate(cost)
        await self.metrics.publish(self.clock())

    def use_model(self, spec: ModelSpec, artifact: str) -> None:
        # Instances fetch the version they are tagged with themselves; the spill function
        # is told the new contract in each event, for a model from an S3 repository.
        if self.serverless is not None and spec.location is not None:
            self.serverless.sources[spec.name] = spec.contract()

    def fixed_hourly(self, catalog: Catalog) -> float:
        aws = self.settings.aws
        return provisioned_hourly(
            catalog.lambda_prices, aws.spill_provisioned_concurrency, aws.spill_memory_mb
        )

    async def warm_up(self) -> None:
        """Ping the spill function so ``aws.spill_warm_concurrency`` runtimes hold each model."""
        if self.serverless is None:
            return
        for model in self.models:
            try:
                await self.serverless.warm_up(model, self.settings.aws.spill_warm_concurrency)
            except CloudError as exc:  # a cold spill is slower, not broken
                log.warning("warming the spill function for %s failed: %s", model, exc)

    async def prices(self, catalog: Catalog, instance_types: Sequence[str]) -> Catalog:
        """The catalog with today's prices: on-demand from the Pricing API, spot from
        DescribeSpotPriceHistory; the shipped price wherever either fails or is implausible."""
        aws = self.settings.aws
        if not aws.refresh_prices:
            return catalog
        types = sorted(set(instance_types))
        on_demand = await refresh_on_demand_prices(
            catalog, types, endpoint_url=aws.pricing_endpoint_url or aws.endpoint_url
        )
        catalog = on_demand.catalog
        try:
            spot = await refresh_spot_prices(
                catalog, types, region=aws.region, endpoint_url=aws.endpoint_url
            )
        except (ClientError, BotoCoreError) as exc:
            log.warning("spot prices: the shipped table stays (%s)", exc)
            return catalog
        if spot.refused:
            log.warning("implausible spot quotes refused, shipped prices kept: %s", spot.refused)
        log.info("prices refreshed: on-demand %s, spot %s", on_demand.updated, spot.updated)
        return spot.catalog

    async def close(self) -> None:
        """Close every client; instances keep running (a restart adopts them)."""
        for part in (self.agents, self.metrics, self.serverless, self.interruptions, self.fleet):
            if part is not None:
                try:
                    await part.close()
                except Exception:  # closing one client must not leave the others open
                    log.exception("closing %s failed", type(part).__name__)
