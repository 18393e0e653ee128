"""The local world: an embedded moto server as EC2, agent processes as instances, local Lambda.

The daemon talks to moto through the very ``AwsFleet`` adapter it uses on AWS
(aiobotocore, launch template, tags); only the endpoint differs. At start the
world creates the launch template mark launches through, as the CloudFormation
stack does on AWS, and warms the local Lambda's runtimes, as the aws world
warms its spill function.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from bouncer.latency import BatchLatency
from mark.catalog import Catalog
from mark.cloud.aws.fleet import AwsFleet, LaunchTemplateRef
from mark.cloud.aws.interruptions import EVENT_PATTERN, SqsInterruptionSource
from mark.cloud.local.agents import AgentModel, AgentSupervisor, default_slowdown
from mark.cloud.local.lambda_ import LocalLambda
from mark.config import ModelSpec
from mark.errors import CloudError
from mark.logs import quiet_access_logs
from mark.ports import InterruptionNotice, NoticeKind
from mark.state.records import ArrivalWindow, LatencyRollup
from mark.world import Job
from provisioner.batching import PROFILE_BATCHES

log = logging.getLogger("mark.local")


def lambda_threads(concurrency: int, cpus: int | None = None) -> dict[str, str]:
    """Math-library threads per local Lambda runtime: this machine's cores shared out.

    On AWS each runtime has its own vCPUs (2 at 2048 MB). Here the runtimes,
    the agents and the daemon share a few cores, and OpenMP threads that spin
    waiting for each other across oversubscribed cores made an invocation of
    a 4 ms model take seconds (4 runtimes x 2 threads on 2 cores: ~1 r/s
    with 20 concurrent spills, ~150 r/s with one thread each).
    """
    n = str(max(1, (cpus or os.cpu_count() or 1) // max(concurrency, 1)))
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def measure_profile(model: AgentModel) -> BatchLatency:
    """T_b of ``model`` on this machine (real inference, warm-up, lower quartile of runs)."""
    from bouncer.runner import ModelRunner  # torch: imported when a world starts, not before

    runner = ModelRunner(model.contract)
    return runner.profile(PROFILE_BATCHES)


TEMPLATE = "mark-agent"
QUEUE = "mark-interruptions"
_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "mark-local",
    "AWS_SECRET_ACCESS_KEY": "mark-local",
}


def _start_moto() -> tuple[object, str]:
    """moto on a free loopback port; its per-request access log (werkzeug's INFO lines,
    two a second from a running daemon) is kept off the terminal, its errors are not."""
    from moto.server import ThreadedMotoServer

    quiet_access_logs()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


async def _create_interruption_queue(region: str, endpoint: str, name: str) -> str:
    """The SQS queue and EventBridge rule the CloudFormation stack creates on AWS."""
    session = get_session()
    async with session.create_client("sqs", region_name=region, endpoint_url=endpoint) as sqs:
        url = (await sqs.create_queue(QueueName=name))["QueueUrl"]
        arn = (await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]["QueueArn"]
    async with session.create_client("events", region_name=region, endpoint_url=endpoint) as ev:
        await ev.put_rule(Name=name, EventPattern=json.dumps(EVENT_PATTERN))
        await ev.put_targets(Rule=name, Targets=[{"Id": "queue", "Arn": arn}])
    return str(url)


async def _create_template(region: str, endpoint: str) -> None:
    async with get_session().create_client("ec2", region_name=region, endpoint_url=endpoint) as ec2:
        images = await ec2.describe_images(
            Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}]
        )
        ami = images["Images"][0]["ImageId"]
        try:
            await ec2.create_launch_template(
                LaunchTemplateName=TEMPLATE, LaunchTemplateData={"ImageId": ami}
            )
        except ClientError as exc:  # a second world in the same process shares moto's state
            if "AlreadyExists" not in exc.response.get("Error", {}).get("Code", ""):
                raise


def fresh_cluster() -> str:
    """A new cluster tag, for a world whose moto (and fleet) dies with it."""
    return f"local-{uuid.uuid4().hex[:8]}"


@dataclass
class LocalWorld:
    region: str
    catalog: Catalog
    models: dict[str, AgentModel]
    clock: Callable[[], float]
    boot_delay_s: float = 5.0
    lambda_env: Mapping[str, str] = field(default_factory=dict)
    lambda_concurrency: int = 4
    lambda_memory_mb: int = 2048
    slowdown: Mapping[str, float] = field(default_factory=dict)
    control_loop: bool = True
    probe_every_s: float = 5.0
    probe_timeout_s: float = 5.0
    profiles: dict[str, BatchLatency] = field(default_factory=dict)
    """T_b per model on this machine (measured at start unless given), what agents emulate."""
    external_endpoint: str | None = None
    """A moto server that outlives this world (``local.ec2_endpoint``); None: its own."""
    endpoint: str = ""
    fleet: AwsFleet | None = None
    agents: AgentSupervisor | None = None
    serverless: LocalLambda | None = None
    interruptions: SqsInterruptionSource | None = None
    cluster: str = field(default_factory=fresh_cluster)
    _moto: object | None = None
    _reclaims: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def boot_s(self) -> float:
        """The emulated boot delay plus the agent's start (about 5 s here)."""
        return self.boot_delay_s + 5.0

    async def prices(self, catalog: Catalog, instance_types: Sequence[str]) -> Catalog:
        return catalog  # the shipped us-east-1 prices

    @property
    def agents_measure(self) -> bool:
        return False  # agents emulate a type: their T_b is the rule's, not a measurement

    async def emulated_latency(
        self, spec: ModelSpec, source: str, catalog: Catalog, types: Sequence[str]
    ) -> dict[str, BatchLatency]:
        """The profile every agent emulates (measured once at start), stretched per type by
        the local world's emulated slowdown: the one rule-based profile in mark."""
        measured = self.profiles.get(spec.name)
        if measured is None:
            measured = await asyncio.to_thread(measure_profile, self.models[spec.name])
        slowdown = default_slowdown(catalog, self.slowdown)
        return {t: measured.scaled(slowdown(t)) for t in types}

    def jobs(self, catalog: Catalog, leads: Callable[[], bool]) -> list[Job]:
        return []

    def observe(self, windows: Sequence[ArrivalWindow], rollups: Sequence[LatencyRollup]) -> None:
        return None

    def use_model(self, spec: ModelSpec, artifact: str) -> None:
        model = AgentModel(spec.contract(artifact))
        old = self.models.get(spec.name)
        self.models[spec.name] = model
        if self.agents is not None:
            if old is not None:  # the version rolled from still serves until it is drained
                self.agents.versions[(spec.name, old.contract.version)] = old
            self.agents.versions[(spec.name, spec.version)] = model
        if self.serverless is not None:
            self.serverless.use(spec.name, model.contract)

    def fixed_hourly(self, catalog: Catalog) -> float:
        return 0.0

    async def start(self) -> None:
        for key, value in _FAKE_CREDENTIALS.items():  # moto accepts any; never real ones
            os.environ.setdefault(key, value)
        if self.external_endpoint is not None:
            self.endpoint = self.external_endpoint.rstrip("/")
        else:
            self._moto, self.endpoint = await asyncio.to_thread(_start_moto)
        await _create_template(self.region, self.endpoint)
        self.fleet = AwsFleet(
            self.region,
            self.endpoint,
            cluster=self.cluster,
            launch_template=LaunchTemplateRef(TEMPLATE),
        )
        await self.fleet.open()
        # Before anything else of ours runs here: the profile every agent will emulate.
        for name, model in self.models.items():
            if name not in self.profiles:
                self.profiles[name] = await asyncio.to_thread(measure_profile, model)
        self.agents = AgentSupervisor(
            self.fleet,
            self.models,
            self.clock,
            boot_delay_s=lambda _t: self.boot_delay_s,
            slowdown=default_slowdown(self.catalog, self.slowdown),
            profiles=self.profiles,
            probe_every_s=self.probe_every_s,
            probe_timeout_s=self.probe_timeout_s,
        )
        self.serverless = LocalLambda(
            {name: m.contract for name, m in self.models.items()},
            env={**lambda_threads(self.lambda_concurrency), **self.lambda_env},
            max_concurrency=self.lambda_concurrency,
            memory_mb=self.lambda_memory_mb,
        )
        await self.serverless.start()
        await self._warm_spill()
        queue = await _create_interruption_queue(self.region, self.endpoint, self.queue_name)
        self.interruptions = SqsInterruptionSource(
            queue, self._notice, region=self.region, endpoint_url=self.endpoint, wait_seconds=1
        )
        await self.interruptions.open()

    async def _warm_spill(self) -> None:
        """Start every Lambda runtime with each model loaded, as the aws world warms its function.

        A cold runtime imports torch and loads the model, seconds on this machine,
        and the first requests (before any instance exists, all of them spill)
        would wait that long against a deadline of RT_max.
        """
        assert self.serverless is not None
        for name in self.models:
            try:
                await self.serverless.warm_up(name, self.lambda_concurrency)
            except CloudError as exc:  # a cold spill is slower, not broken
                log.warning("warming the local Lambda for %s failed: %s", name, exc)

    @property
    def queue_name(self) -> str:
        """The SQS queue spot notices arrive on (EventBridge rule of the same name)."""
        return f"{QUEUE}-{self.cluster}"

    def _notice(self, notice: InterruptionNotice) -> None:
        """Hand the notice to the fleet's stream, and play AWS: reclaim at the deadline."""
        assert self.fleet is not None
        self.fleet.notify(notice)
        if notice.kind is NoticeKind.INTERRUPTION:
            task = asyncio.get_running_loop().create_task(self._reclaim(notice))
            self._reclaims.add(task)
            task.add_done_callback(self._reclaims.discard)

    async def _reclaim(self, notice: InterruptionNotice) -> None:
        delay = (notice.action_at or self.clock() + 120.0) - self.clock()
        await asyncio.sleep(max(0.0, delay))
        assert self.fleet is not None
        try:
            await self.fleet.terminate([notice.instance_id])
        except CloudError as exc:  # not ours, or gone already
            log.info("reclaim of %s skipped: %s", notice.instance_id, exc)

    async def close(self) -> None:
        """Stop every agent and Lambda runtime, then the fleet client and moto (its own:
        an external one, and the fleet in it, outlive the daemon for a restart to adopt)."""
        for task in list(self._reclaims):
            task.cancel()
        if self.interruptions is not None:
            await self.interruptions.close()
        if self.agents is not None:
            await self.agents.close()
        if self.serverless is not None:
            await self.serverless.close()
        if self.fleet is not None:
            await self.fleet.close()
        if self._moto is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._moto.stop)  # type: ignore[attr-defined]
