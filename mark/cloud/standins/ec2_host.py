"""Stand-in for what EC2 does that moto does not: boot an instance and run its user data.

moto keeps EC2's *records* (launch, tags, addresses, stop/start) but runs
nothing. ``Ec2Host`` plays the hypervisor for the aws-world tests: for every
running instance launched from one launch template, it starts what the
template's user data starts on AWS (``infra/``) — ``python -m bouncer.agent``
for the model in the instance's ``mark:model`` tag, on the fixed agent port; with
a model ``repository``, as the stack's workers do, ``--repository R --model M
--version V`` from the instance's ``mark:model`` and ``mark:version`` tags, so the
agent fetches its own model from S3 —
bound to the instance's *private IP address*, and gives it a metadata service
of its own (``ImdsStandin``) that a test can arm for a spot reclaim. When the
instance stops or terminates, the agent is stopped.

The trick that keeps the daemon's code path exactly AWS's: the test VPC's
subnet is carved from 127.0.0.0/8, so moto hands out private addresses such
as 127.77.0.5, every one of which is this machine's loopback. The daemon
reaches ``http://{PrivateIpAddress}:{agent_port}`` as it would in a VPC, with
no address override and no registration protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiobotocore.session import get_session

from mark.cloud.local.agents import AgentModel, spawn_agent, stop_agent
from mark.cloud.standins.imds import ImdsStandin

log = logging.getLogger("mark.standins.ec2")

_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class HostedInstance:
    instance_id: str
    address: str
    model: str
    process: asyncio.subprocess.Process
    imds: ImdsStandin


@dataclass
class Ec2Host:
    region: str
    endpoint_url: str
    launch_template_id: str
    agent_port: int
    models: Mapping[str, AgentModel]
    repository: str | None = None
    """With it, every instance's agent fetches the model its tags name from here."""
    data_dir: Path | None = None
    """With a repository: each instance's agent fetches its model under
    ``data_dir/<instance id>`` (its ``MARK_DATA_DIR``), as each instance has its own disk."""
    imds_interval_s: float = 0.5
    slowdown: float = 1.0
    hosted: dict[str, HostedInstance] = field(default_factory=dict)
    _client: Any = None
    _client_cm: Any = None
    _task: asyncio.Task[None] | None = None

    async def start(self, every_s: float = 0.5) -> None:
        self._client_cm = get_session().create_client(
            "ec2", region_name=self.region, endpoint_url=self.endpoint_url
        )
        self._client = await self._client_cm.__aenter__()
        self._task = asyncio.create_task(self._run(every_s))

    async def _run(self, every_s: float) -> None:
        while True:
            try:
                await self.sync()
            except Exception:
                log.exception("EC2 host stand-in: sync failed")
            await asyncio.sleep(every_s)

    async def sync(self) -> None:
        """Boot agents for new running instances; stop those whose instance is no longer running."""
        resp = await self._client.describe_instances(
            Filters=[{"Name": "tag:aws:ec2launchtemplate:id", "Values": [self.launch_template_id]}]
        )
        running: dict[str, dict[str, Any]] = {}
        for reservation in resp.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                if inst["State"]["Name"] == "running":
                    running[inst["InstanceId"]] = inst
        for iid in [i for i in self.hosted if i not in running]:
            await self._stop(self.hosted.pop(iid))
        for iid, inst in running.items():
            if iid not in self.hosted:
                hosted = await self._boot(inst)
                if hosted is not None:
                    self.hosted[iid] = hosted

    async def _boot(self, inst: Mapping[str, Any]) -> HostedInstance | None:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        name = tags.get("mark:model", "")
        model = self.models.get(name)
        address = inst.get("PrivateIpAddress")
        if (model is None and self.repository is None) or not name or not address:
            return None  # nothing this host knows how to run
        imds = ImdsStandin(str(inst["InstanceId"]))
        await imds.start()
        if self.repository is not None:  # what the stack's user data runs
            given = ["--repository", self.repository, "--model", name]
            if "mark:version" in tags:
                given += ["--version", tags["mark:version"]]
            disk = self.data_dir / str(inst["InstanceId"]) if self.data_dir else None
            env = {"MARK_DATA_DIR": str(disk)} if disk else None
            args = [*given, *self._args(str(address), imds)]
            proc = await spawn_agent(None, *args, cwd=str(_ROOT), env=env)
        else:
            proc = await spawn_agent(model, *self._args(str(address), imds), cwd=str(_ROOT))
        log.info(
            "booted %s (%s) at %s:%d (pid %d)",
            inst["InstanceId"],
            name,
            address,
            self.agent_port,
            proc.pid,
        )
        return HostedInstance(str(inst["InstanceId"]), str(address), name, proc, imds)

    def _args(self, address: str, imds: ImdsStandin) -> list[str]:
        return [
            "--host",
            address,
            "--port",
            str(self.agent_port),
            "--slowdown",
            str(self.slowdown),
            "--imds-url",
            imds.url,
            "--imds-interval",
            str(self.imds_interval_s),
        ]

    async def _stop(self, hosted: HostedInstance) -> None:
        await stop_agent(hosted.process)
        await hosted.imds.close()

    def child_pids(self) -> list[int]:
        return [h.process.pid for h in self.hosted.values() if h.process.returncode is None]

    async def close(self) -> None:
        """Stop watching and stop every agent (as if the instances were shut down)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        hosted = list(self.hosted.values())
        self.hosted.clear()
        await asyncio.gather(*(self._stop(h) for h in hosted))
        if self._client_cm is not None:
            await self._client_cm.__aexit__(None, None, None)
            self._client_cm = self._client = None
