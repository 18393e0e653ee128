"""The local world: an embedded moto server as EC2, agent processes as instances, local Lambda.

The daemon talks to moto through the very ``AwsFleet`` adapter it uses on AWS
(aiobotocore, launch template, tags); only the endpoint differs. At start the
world creates the launch template mark launches through, as the CloudFormation
stack does on AWS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiobotocore.session import get_session

from mark.catalog import Catalog
from mark.cloud.aws.fleet import AwsFleet, LaunchTemplateRef
from mark.cloud.local.agents import AgentModel, AgentSupervisor, default_slowdown
from mark.cloud.local.lambda_runtime import LocalLambda

log = logging.getLogger("mark.local")

TEMPLATE = "mark-agent"
_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "mark-local",
    "AWS_SECRET_ACCESS_KEY": "mark-local",
}


def _start_moto() -> tuple[object, str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


async def _create_template(region: str, endpoint: str) -> None:
    async with get_session().create_client("ec2", region_name=region, endpoint_url=endpoint) as ec2:
        images = await ec2.describe_images(
            Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}]
        )
        ami = images["Images"][0]["ImageId"]
        await ec2.create_launch_template(
            LaunchTemplateName=TEMPLATE, LaunchTemplateData={"ImageId": ami}
        )


@dataclass
class LocalWorld:
    region: str
    catalog: Catalog
    models: Mapping[str, AgentModel]
    clock: Callable[[], float]
    boot_delay_s: float = 5.0
    lambda_env: Mapping[str, str] = field(default_factory=dict)
    lambda_concurrency: int = 4
    lambda_memory_mb: int = 2048
    endpoint: str = ""
    fleet: AwsFleet | None = None
    agents: AgentSupervisor | None = None
    serverless: LocalLambda | None = None
    _moto: object | None = None

    async def start(self) -> None:
        for key, value in _FAKE_CREDENTIALS.items():  # moto accepts any; never real ones
            os.environ.setdefault(key, value)
        self._moto, self.endpoint = await asyncio.to_thread(_start_moto)
        await _create_template(self.region, self.endpoint)
        self.fleet = AwsFleet(
            self.region, self.endpoint, cluster="local", launch_template=LaunchTemplateRef(TEMPLATE)
        )
        await self.fleet.open()
        self.agents = AgentSupervisor(
            self.fleet,
            self.models,
            self.clock,
            boot_delay_s=lambda _t: self.boot_delay_s,
            slowdown=default_slowdown(self.catalog),
        )
        self.serverless = LocalLambda(
            {name: m.source for name, m in self.models.items()},
            env=dict(self.lambda_env),
            max_concurrency=self.lambda_concurrency,
            memory_mb=self.lambda_memory_mb,
        )
        await self.serverless.start()

    async def close(self) -> None:
        """Stop every agent and Lambda runtime, then the fleet client and moto."""
        if self.agents is not None:
            await self.agents.close()
        if self.serverless is not None:
            await self.serverless.close()
        if self.fleet is not None:
            await self.fleet.close()
        if self._moto is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._moto.stop)  # type: ignore[attr-defined]
