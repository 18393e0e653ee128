"""`mark profile --type T`: one instance of T launched to measure a model there (aws world).

The instance goes out through the cluster's normal launch path (the worker
launch template, this cluster's tags, a client token) in role ``profiling``,
which no plan, standby pool or health rule claims. Its agent loads, warms and
times the model on that type's device, as every agent does at start, and
reports the profile with its readiness (``/health``); the profile is stored as
``measured`` for (model, T), so the planner rates T from it. The instance is
terminated whatever happens (measured, failed, timed out, Ctrl-C), and its run
is recorded like any other: instance states, a decision, the ledger.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, Market
from mark.cloud.aws.agents import ready_agent
from mark.cloud.aws.fleet import AwsFleet
from mark.cloud.aws.instances import TAG_CLIENT_TOKEN
from mark.cloud.aws.world import worker_fleet
from mark.config import ModelSpec, Settings
from mark.control.recorder import Recorder
from mark.errors import CloudError, MarkError
from mark.ports import InstanceInfo, InstanceRole, InstanceState, LaunchRequest
from mark.state import ProfileRecord, open_store
from mark.state.records import Decision

BOOTING = (InstanceState.PENDING, InstanceState.RUNNING)


class NotMeasured(CloudError):
    """The instance's agent did not report ready in time, or the instance ended first."""


@dataclass(frozen=True)
class Measured:
    instance_id: str
    latency: BatchLatency
    ready_after_s: float


async def measure_on_type(
    settings: Settings,
    spec: ModelSpec,
    instance_type: str,
    catalog: Catalog,
    timeout_s: float,
    progress: Callable[[str], None],
    *,
    poll_s: float = 1.0,
    warn: Callable[[str], None] = print,
) -> Measured:
    """Launch one on-demand ``instance_type`` for ``spec``, wait for its agent's profile,
    store it as measured, terminate the instance (always); ``NotMeasured`` on timeout."""
    fleet = worker_fleet(settings)
    store = await open_store(settings.db_url, upgrade=True)  # fails before any launch
    recorder = Recorder(store, catalog)
    token = f"{spec.name}/{instance_type}/profiling/{uuid.uuid4().hex[:12]}"
    request = LaunchRequest(
        spec.name, instance_type, Market.ON_DEMAND, 1, InstanceRole.PROFILING, token
    )
    try:
        async with fleet, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            try:
                progress(f"launching one {instance_type} for {spec.name}")
                (inst,) = await fleet.launch(request)
                now = time.time()
                await recorder.launched([inst], now, "mark profile --type")
                await store.record_decision(
                    Decision(
                        spec.name,
                        now,
                        "profile",
                        f"mark profile --type {instance_type}: measure {spec.name}'s T_b there",
                        instance_type,
                        Market.ON_DEMAND.value,
                        1,
                        inst.instance_id,
                    )
                )
                got = await _wait_ready(
                    fleet, http, inst, settings.aws.agent_port, timeout_s, poll_s, progress
                )
                await store.put_profile(
                    ProfileRecord(
                        spec.name, instance_type, "measured", got.latency.points, time.time()
                    )
                )
            except BaseException as exc:
                ended, left = await _end(fleet, recorder, spec.name, token, progress, warn)
                if left:
                    warn(left)
                elif isinstance(exc, MarkError) and ended:
                    raise MarkError(f"{exc}; {', '.join(ended)} terminated") from exc
                raise
            _, left = await _end(fleet, recorder, spec.name, token, progress, warn)
            if left:
                raise CloudError(left)
            return got
    finally:
        await store.close()


async def _wait_ready(
    fleet: AwsFleet,
    http: aiohttp.ClientSession,
    inst: InstanceInfo,
    port: int,
    timeout_s: float,
    poll_s: float,
    progress: Callable[[str], None],
) -> Measured:
    start = time.monotonic()
    iid = inst.instance_id
    task = asyncio.current_task()
    while True:
        _raise_if_cancelled(task)
        waited = time.monotonic() - start
        cur = next((i for i in await fleet.list() if i.instance_id == iid), None)
        if cur is None or cur.state not in BOOTING:
            state = cur.state.value if cur is not None else "terminated"
            raise NotMeasured(f"{iid} ({inst.instance_type}) is {state} before its agent was ready")
        if cur.state is InstanceState.RUNNING and cur.address:
            answer = await ready_agent(http, f"http://{cur.address}:{port}")
            if answer is not None:
                return Measured(iid, answer[0], waited)
        if waited >= timeout_s:
            raise NotMeasured(
                f"the agent on {iid} ({inst.instance_type}) did not report ready within "
                f"{timeout_s:g} s (--timeout)"
            )
        what = "booting" if cur.state is InstanceState.PENDING else "its agent loads and profiles"
        progress(f"{iid} ({inst.instance_type}) {what}: {waited:.0f} s of at most {timeout_s:g} s")
        await asyncio.sleep(poll_s)


def _raise_if_cancelled(task: asyncio.Task[Any] | None) -> None:
    """Ctrl-C cancels the command's task; a library that turns that cancellation into
    its own timeout (an HTTP client's ``TimeoutError`` raised in its place) would leave
    the poll running until ``--timeout``. A cancellation still requested is honoured here."""
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _end(
    fleet: AwsFleet,
    recorder: Recorder,
    model: str,
    token: str,
    progress: Callable[[str], None],
    warn: Callable[[str], None],
) -> tuple[list[str], str | None]:
    """Terminate what this run launched (found by its launch token, so an interrupted
    launch is found too) and bill it: the ids terminated, or why that failed."""
    try:
        mine = [i for i in await fleet.list() if i.tags.get(TAG_CLIENT_TOKEN) == token]
        ids = [i.instance_id for i in mine]
        if ids:
            progress(f"terminating {', '.join(ids)}")
            await fleet.terminate(ids)
    except CloudError as exc:
        return [], (
            f"could not terminate the profiling instance ({exc}): terminate the instance "
            f"tagged {TAG_CLIENT_TOKEN}={token} yourself"
        )
    try:
        await recorder.bill_retired(model, ids, mine, time.time())
    except Exception as exc:  # the instance is gone; only its record is missing
        warn(f"{', '.join(ids)} terminated, but recording its cost failed: {exc}")
    return ids, None
