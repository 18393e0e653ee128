"""Where the aws world's agents are: each running instance's private address on the agent port.

Every worker runs the instance agent on one fixed port (the launch template's
user data starts it; ``infra/``), and the security group lets only the
controller reach it. So the frontend needs no registration protocol: it lists
the fleet, and an instance whose ``http://{private IP}:{port}/health`` answers
is a backend, with the batch latencies the agent measured on its own hardware.
An instance that stops answering is dropped until it answers again.

The same poll carries the agent's view of the instance metadata service: when
``/health`` shows a ``spot_action`` (IMDS ``spot/instance-action``), an
``InterruptionNotice`` goes to ``on_notice`` once per instance, the same stream
the EventBridge → SQS notices feed; the controller ignores a repeat.

Every request carries the agent token (``bouncer.agent_token``), which the
controller's bootstrap puts in its environment from the stack's secret.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from bouncer.agent_token import token_headers
from bouncer.latency import BatchLatency
from bouncer.wire import health_variants
from mark.ports import Fleet, InstanceInfo, InstanceState, InterruptionNotice, NoticeKind

log = logging.getLogger("mark.aws.agents")

RUNNING = {InstanceState.RUNNING, InstanceState.READY}


@dataclass
class RemoteAgent:
    instance: InstanceInfo
    url: str
    latency: BatchLatency
    variants: dict[str, BatchLatency] = field(default_factory=dict)


@dataclass
class AgentDirectory:
    fleet: Fleet
    port: int
    on_notice: Callable[[InterruptionNotice], None]
    clock: Callable[[], float]
    timeout_s: float = 2.0
    agents: dict[str, RemoteAgent] = field(default_factory=dict)
    instances: list[InstanceInfo] = field(default_factory=list)  # the last listing
    probe_every_s: float = 5.0
    probe_timeout_s: float = 5.0
    _failing: set[str] = field(default_factory=set)  # failed the last liveness probe
    _probed_at: float = float("-inf")
    _noticed: set[str] = field(default_factory=set)
    _session: aiohttp.ClientSession | None = None

    async def sync(self) -> None:
        """List the fleet and ask every running instance's agent whether it serves."""
        self.instances = await self.fleet.list()
        running = [i for i in self.instances if i.state in RUNNING and i.address]
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        answers = await asyncio.gather(*(self._health(i) for i in running))
        up = {a.instance.instance_id: a for a in answers if a is not None}
        now = self.clock()
        if now >= self._probed_at + self.probe_every_s:
            self._probed_at = now
            alive = await asyncio.gather(*(self._live(a.url) for a in up.values()))
            self._failing = {iid for iid, ok in zip(up, alive, strict=True) if not ok}
            for iid in self._failing:
                log.error("agent on %s failed its liveness probe: drained", iid)
        self.agents = {iid: a for iid, a in up.items() if iid not in self._failing}
        live = {i.instance_id for i in self.instances}
        self._noticed &= live  # forget instances that are gone

    async def _health(self, inst: InstanceInfo) -> RemoteAgent | None:
        assert self._session is not None
        url = f"http://{inst.address}:{self.port}"
        answer = await ready_agent(self._session, url)
        if answer is None:
            return None  # not up yet, or gone: not a backend this round
        latency, body = answer
        action = body.get("spot_action")
        if isinstance(action, dict) and inst.instance_id not in self._noticed:
            self._noticed.add(inst.instance_id)
            now = self.clock()
            self.on_notice(
                InterruptionNotice(
                    inst.instance_id, NoticeKind.INTERRUPTION, now, _time(action.get("time"))
                )
            )
            log.warning("agent on %s reports a spot %s", inst.instance_id, action)
        return RemoteAgent(inst, url, latency, health_variants(body))

    @property
    def instance_ids(self) -> list[str]:
        """The instances whose health is followed: every one listed but the stopped, whose
        agent is gone with its run, not failing (a start begins afresh)."""
        paused = (InstanceState.STOPPING, InstanceState.STOPPED)
        return [i.instance_id for i in self.instances if i.state not in paused]

    async def _live(self, url: str) -> bool:
        """The agent's liveness probe: one tiny inference on the model's thread, bounded."""
        assert self._session is not None
        try:
            timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s + 1.0)
            async with self._session.get(
                f"{url}/live", timeout=timeout, headers=token_headers()
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def ready_agent(
    session: aiohttp.ClientSession, url: str
) -> tuple[BatchLatency, dict[str, Any]] | None:
    """The T_b an agent at ``url`` measured on its instance, and its ``/health`` body, once
    it is ready (model loaded, warmed, profiled); None while it is not, or is gone."""
    try:
        async with session.get(f"{url}/health", headers=token_headers()) as r:
            if r.status != 200:
                return None
            body = await r.json()
        latency = BatchLatency.from_mapping({int(b): float(t) for b, t in body["batch_latency_s"]})
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return None
    return latency, body


def _time(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
