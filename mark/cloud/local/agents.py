"""The local world's "instances": one agent process per running EC2 instance of the embedded moto.

moto keeps the EC2 state (launch, tags, stop, start, terminate) exactly as the
aws world's adapter sees it; this supervisor makes each running instance real
by starting ``python -m bouncer.agent`` for it once its boot delay has passed,
and stops the process when the instance stops or terminates. The agent's
address is the instance's address for the dispatcher.

Speed: the world measures each model's batch latency on this machine once,
at start, and every agent emulates that profile times a ``slowdown`` per
instance type, so that a c5.large is slower than a c5.4xlarge or a GPU, as
on AWS, and every c5.large as fast as every other (an agent profiling itself
would measure whatever else the machine was doing then). The default rule (documented, not
measured): accelerated types run at this machine's speed, CPU types at
``8 / vCPUs`` times slower (at least 1).

Each agent is given this daemon's agent token in its environment (not its
command line, which any user can read in ``ps``), and every probe sends it
(``bouncer.agent_token``): other processes on the machine get 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from bouncer.agent_token import TOKEN_ENV, daemon_token, token_headers
from bouncer.contract import ModelContract
from bouncer.latency import BatchLatency
from bouncer.parent_watch import ENV as PARENT_ENV
from bouncer.wire import health_variants
from mark.catalog import Accelerator, Catalog
from mark.ports import Fleet, InstanceInfo, InstanceState

log = logging.getLogger("mark.local.agents")

RUNNING = {InstanceState.RUNNING, InstanceState.READY}
PAUSED = {InstanceState.STOPPING, InstanceState.STOPPED}


@dataclass(frozen=True)
class AgentModel:
    """The model an agent serves: its contract, the artifact a path on this machine."""

    contract: ModelContract

    @property
    def source(self) -> str:
        return self.contract.artifact


@dataclass
class AgentProcess:
    instance: InstanceInfo
    process: asyncio.subprocess.Process
    url: str
    latency: BatchLatency
    variants: dict[str, BatchLatency] = field(default_factory=dict)


def default_slowdown(
    catalog: Catalog, overrides: Mapping[str, float] | None = None
) -> Callable[[str], float]:
    given = dict(overrides or {})

    def slowdown(instance_type: str) -> float:
        if instance_type in given:
            return given[instance_type]
        itype = catalog.types.get(instance_type)
        if itype is None or itype.accelerator is not Accelerator.CPU:
            return 1.0
        return max(1.0, 8.0 / max(itype.vcpus, 1))

    return slowdown


@dataclass
class AgentSupervisor:
    fleet: Fleet
    models: Mapping[str, AgentModel]
    clock: Callable[[], float]
    boot_delay_s: Callable[[str], float] = lambda _t: 0.0
    slowdown: Callable[[str], float] = lambda _t: 1.0
    profiles: Mapping[str, BatchLatency] = field(default_factory=dict)  # per model, unslowed
    start_timeout_s: float = 120.0
    probe_every_s: float = 5.0
    probe_timeout_s: float = 5.0
    versions: dict[tuple[str, str], AgentModel] = field(default_factory=dict)
    """(model, version) → what an instance tagged with that version runs (a version being
    rolled to, or from); an instance of any other serves its model's current one."""
    procs: dict[str, AgentProcess] = field(default_factory=dict)
    """Every agent process started and not yet stopped, healthy or not."""
    instance_ids: list[str] = field(default_factory=list)
    """The instances of the last listing."""
    _starting: set[str] = field(default_factory=set)
    _dead: set[str] = field(default_factory=set)  # agent died: the instance is replaced
    _failing: set[str] = field(default_factory=set)  # failed its last liveness probe
    _probed_at: float = float("-inf")
    _stopping: dict[int, AgentProcess] = field(default_factory=dict)  # pid -> being stopped

    @property
    def agents(self) -> dict[str, AgentProcess]:
        """The agents that serve: alive and passing their liveness probe."""
        return {
            iid: a
            for iid, a in self.procs.items()
            if a.process.returncode is None and iid not in self._failing
        }

    async def sync(self) -> None:
        """Bring the processes in line with the fleet: start what booted, stop what is gone;
        an agent that died is not restarted (as on EC2, the instance is replaced)."""
        instances = {i.instance_id: i for i in await self.fleet.list()}
        # A stopped instance's agent is gone with it, not failing: what its health showed
        # ends with the run (a start out of the warm pool begins afresh).
        self.instance_ids = [i for i, inst in instances.items() if inst.state not in PAUSED]
        for iid in list(self.procs):
            inst = instances.get(iid)
            if inst is None or inst.state not in RUNNING:
                await self._stop(self.procs.pop(iid))
                self._failing.discard(iid)
            elif self.procs[iid].process.returncode is not None and iid not in self._dead:
                self._dead.add(iid)
                log.error(
                    "agent for %s exited with code %s: drained",
                    iid,
                    self.procs[iid].process.returncode,
                )
        self._dead &= set(instances)
        now = self.clock()
        if now >= self._probed_at + self.probe_every_s:
            self._probed_at = now
            await self._probe_all()
        starts = [
            inst
            for iid, inst in instances.items()
            if inst.state in RUNNING
            and iid not in self.procs
            and iid not in self._starting
            and iid not in self._dead
            and inst.model in self.models
            and now >= inst.launched_at + self.boot_delay_s(inst.instance_type)
        ]
        results = await asyncio.gather(*(self._start(i) for i in starts), return_exceptions=True)
        for inst, res in zip(starts, results, strict=True):
            if isinstance(res, BaseException):
                log.error("agent for %s did not start: %s", inst.instance_id, res)

    async def _start(self, inst: InstanceInfo) -> None:
        model = self.versions.get((inst.model, inst.version or "")) or self.models[inst.model]
        self._starting.add(inst.instance_id)
        try:
            profile = self.profiles.get(inst.model)
            extra = ["--latency", str(profile)] if profile is not None else []
            proc = await spawn_agent(
                model, "--slowdown", str(self.slowdown(inst.instance_type)), *extra, announce=True
            )
            try:
                port = await asyncio.wait_for(_read_port(proc), self.start_timeout_s)
            except BaseException:
                _kill(proc)
                await proc.wait()
                raise
            url = f"http://127.0.0.1:{port}"
            latency, variants = await _fetch_latency(url)
            self.procs[inst.instance_id] = AgentProcess(inst, proc, url, latency, variants)
            log.info(  # why it was launched: the control loop's line naming this id
                "agent for %s (%s %s of %s) at %s",
                inst.instance_id,
                inst.instance_type,
                inst.role.value,
                inst.model,
                url,
            )
        finally:
            self._starting.discard(inst.instance_id)

    async def _stop(self, agent: AgentProcess) -> None:
        # Tracked until it has exited: a sync cancelled during the grace period (the daemon
        # stopping) must not leave a hung agent behind; ``close`` stops it again.
        self._stopping[agent.process.pid] = agent
        await stop_agent(agent.process)  # cancelled here: still in _stopping for close()
        self._stopping.pop(agent.process.pid, None)

    async def _probe_all(self) -> None:
        """Each live agent's liveness probe (one tiny inference, bounded): a hung model fails."""
        alive = {iid: a for iid, a in self.procs.items() if a.process.returncode is None}
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s + 1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            results = await asyncio.gather(*(_live(session, a.url) for a in alive.values()))
        for iid, ok in zip(alive, results, strict=True):
            if ok:
                self._failing.discard(iid)
            elif iid not in self._failing:
                self._failing.add(iid)
                log.error("agent for %s failed its liveness probe: drained", iid)

    async def close(self) -> None:
        agents = [*self.procs.values(), *self._stopping.values()]
        self.procs.clear()
        await asyncio.gather(*(self._stop(a) for a in agents))


async def spawn_agent(
    model: AgentModel | None,
    *args: str,
    announce: bool = False,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """An instance agent process for ``model`` (``args`` add to its command line; with no
    model, they say which: ``--repository R --model M``; ``env`` adds to its environment).

    It runs in its own session, so Ctrl-C on the daemon reaches it through us only, and
    ends when this process does (``bouncer.parent_watch``), so none outlives a killed daemon;
    with ``announce`` its stdout is piped for the ``READY <port>`` line. It answers
    only requests carrying this daemon's token, which it finds in its environment.
    """
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bouncer.agent",
        *(("--model-contract", model.contract.to_json()) if model is not None else ()),
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE if announce else asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        env={
            **os.environ,
            "OMP_NUM_THREADS": "1",
            TOKEN_ENV: daemon_token(),
            PARENT_ENV: str(os.getpid()),  # it ends when we do, even by kill -9
            **(env or {}),
        },
    )


async def stop_agent(proc: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL to its process group if it has not exited in ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        _kill(proc)
        await proc.wait()


async def _read_port(proc: asyncio.subprocess.Process) -> int:
    assert proc.stdout is not None
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent exited with code {await proc.wait()} before it was ready")
        text = line.decode().strip()
        if text.startswith("READY "):
            return int(text.split()[1])


async def _fetch_latency(url: str) -> tuple[BatchLatency, dict[str, BatchLatency]]:
    """The agent's T_b for the model's own artifact, and for each other variant it loaded."""
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{url}/health", headers=token_headers()) as r,
    ):
        body = await r.json()
    own = BatchLatency.from_mapping({int(b): float(t) for b, t in body["batch_latency_s"]})
    return own, health_variants(body)


async def _live(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/live", headers=token_headers()) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
