"""kill -9 of the daemon under load, then a restart: the fleet and the answers survive.

The daemon runs as users run it, ``mark up`` in a process of its own, in the
local world with its EC2 (a moto server this test starts, ``local.ec2_endpoint``)
outside it and a fixed ``local.cluster``, so the fleet outlives the daemon as it
does on AWS. Under the fault suite's open-loop load (``tests/faults/client.py``)
the daemon is killed with SIGKILL once its fleet serves, and a new ``mark up`` on
the same configuration, store and port is started at once. It must adopt the
fleet by its tags, take the control lease (a new process is a new holder: once
the old lease lapses), start agents for the adopted instances and serve again; at
the end it is stopped with SIGTERM, as ``mark up`` is.

Counted as every scenario is (``harness.count``), except requests in flight at
the kill: the connection dropped under them, so they have no answer by
definition (``cut``, not ``lost``: taken before the kill and unanswered when it
struck). Requests sent while no daemon listens are refused at the TCP level:
an explicit error (nothing was taken). Asserted: nothing else lost, none
answered twice or wrongly, every error with a reason, the restart adopted every
instance the killed daemon ran (what it launched after is reported),
every process of the killed daemon (agents, Lambda runtimes, parser workers)
gone within seconds (``bouncer.parent_watch``; awslambdaric exits with its
runtime API), and no instance or process orphaned after the final stop.
Lambda's "twice" term comes from the store's ledger, which lacks the charges
the killed daemon had not flushed yet: it can hide a double invocation there,
never invent one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiobotocore.session import get_session

from bouncer.miss_budget import DECLINED_MARK
from mark.cloud.aws.instances import TAG_CLUSTER
from mark.demo import ensure_demo_model
from mark.logs import quiet_access_logs
from mark.serve.auth import create_key
from mark.state import open_store
from tests.faults.harness import (
    ROOT,
    _expected_outputs,
    count,
    orphans,
    record,
    scenario_settings,
    since,
)

pytestmark = pytest.mark.slow

REGION = "us-east-1"
CLIENT_TIMEOUT_S = 30.0
KILL_AT_S = 25.0
CUT_SLACK_S = 0.5
PROFILE = "0:12,80:12"
"""12 r/s for 80 s: two c5.large at the pinned speed (about 9 r/s each within RT_max)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, theirs, ...), from /proc."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parent[int(entry.name)] = int(fields[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.add(pid)
    return out


async def _gone(pids: set[int]) -> bool:
    return not alive(pids)


async def _until(what: str, within_s: float, ready: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + within_s
    while not await ready():
        assert time.monotonic() < deadline, f"{what}: not within {within_s:g} s"
        await asyncio.sleep(0.25)


async def _ready(url: str) -> bool:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s,
            s.get(f"{url}/v2/health/ready") as r,
        ):
            return r.status == 200
    return False


async def _moto_instances(endpoint: str, cluster: str) -> dict[str, str]:
    """Every instance the external moto holds with the cluster's tag, and its state."""
    async with get_session().create_client("ec2", region_name=REGION, endpoint_url=endpoint) as ec2:
        got = await ec2.describe_instances(
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
        )
    return {
        i["InstanceId"]: i["State"]["Name"] for r in got["Reservations"] for i in r["Instances"]
    }


async def _mark_up(config: Path, port: int, log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "mark.cli.main", "--config", str(config)),
            *("--log-format", "json", "up", "--port", str(port)),
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )


async def test_kill_9_of_the_daemon_under_load_and_restart(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.server import ThreadedMotoServer

    began = time.monotonic()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # moto takes any; never real
        monkeypatch.setenv(name, "mark-local")
    quiet_access_logs()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, moto_port = moto.get_host_and_port()
    endpoint = f"http://{host}:{moto_port}"
    cluster = f"fault-kill-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    settings = scenario_settings(
        data_dir, {"local": {"ec2_endpoint": endpoint, "cluster": cluster}}
    )
    config = data_dir / "mark.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_none=True)))
    log = data_dir / "daemon.log"
    ensure_demo_model(settings.data_dir)
    store = await open_store(settings.db_url, upgrade=True)
    try:
        _, key = await create_key(store, "fault-test", ["inference", "admin"], time.time())
    finally:
        await store.close()

    first = await _mark_up(config, port, log)
    second: asyncio.subprocess.Process | None = None
    client: asyncio.subprocess.Process | None = None
    out = data_dir / "outcomes.json"
    first_children: set[int] = set()
    second_children: set[int] = set()
    try:
        await _until("the first daemon was ready", 120, lambda: _ready(url))
        client = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.faults.client", url, PROFILE, "7"),
            *(str(CLIENT_TIMEOUT_S), str(out)),
            cwd=ROOT,
            env={**os.environ, "MARK_API_KEY": key},
            stdout=asyncio.subprocess.PIPE,
        )
        assert client.stdout is not None
        line = await asyncio.wait_for(client.stdout.readline(), 60)
        assert line.strip() == b"START", f"the client did not start: {line!r}"
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def fleet_serves() -> bool:  # an agent answered: the store has it ready
            s = await open_store(settings.db_url)
            try:
                return any(i.state == "ready" for i in await s.instances())
            finally:
                await s.close()

        await _until("the first daemon's fleet served", 60, fleet_serves)
        await asyncio.sleep(max(0.0, t0 + KILL_AT_S - loop.time()))
        live_at_kill = {
            i for i, st in (await _moto_instances(endpoint, cluster)).items() if st == "running"
        }
        first_children = descendants(first.pid)
        killed_at = time.time()
        struck = loop.time() - t0
        os.kill(first.pid, signal.SIGKILL)
        await first.wait()
        second = await _mark_up(config, port, log)
        await _until("the restarted daemon was ready", 120, lambda: _ready(url))
        ready_again = loop.time() - t0
        await _until("the killed daemon's processes ended", 15, lambda: _gone(first_children))
        await asyncio.wait_for(client.wait(), 80 + CLIENT_TIMEOUT_S + 60)
        assert client.returncode == 0, f"the client failed ({client.returncode})"
        second_children = descendants(second.pid)
        second.send_signal(signal.SIGTERM)  # mark up drains and stops
        await asyncio.wait_for(second.wait(), 90)
        await _until("the restarted daemon's processes ended", 15, lambda: _gone(second_children))
    finally:
        for proc in (client, first, second):
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for pid in alive(first_children | second_children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    results = json.loads(out.read_text())
    expected = await _expected_outputs(str(ensure_demo_model(settings.data_dir)), results["bodies"])
    rt_max_ms = settings.models[0].slo.rt_max_ms
    moto_states = await _moto_instances(endpoint, cluster)
    store = await open_store(settings.db_url)
    try:
        store_states = {r.instance_id: r.state for r in await store.instances()}
        decisions = await store.decisions(0, 1e12)
        ledger = await store.ledger()
    finally:
        await store.close()
    warmups = 2 * settings.local.lambda_concurrency  # each daemon warms every runtime once
    invocations = sum(e.requests for e in ledger if e.kind == "lambda") - warmups
    tally = count("kill -9 daemon", results, expected, rt_max_ms, max(0, invocations))
    # In flight at the kill: no answer, sent before it (or within CUT_SLACK_S after, on a
    # kept-alive connection the client had not yet seen die), the error after it.
    cut = [
        o
        for o in results["outcomes"]
        if o["status"] == 0
        and o["sent_at"] <= killed_at + CUT_SLACK_S
        and o["sent_at"] + o["latency_s"] >= killed_at - 0.05
    ]
    tally.cut, tally.lost = len(cut), tally.lost - len(cut)
    tally.fault = (
        f"kill -9 of the daemon at {struck:.0f} s ({len(live_at_kill)} instance(s) running), "
        f"a new mark up serving again at {ready_again:.0f} s"
    )
    relaunched = sum(d.count for d in decisions if d.action == "launch" and d.at >= killed_at)
    tally.after_fault = (
        f"{since(results['outcomes'], struck, rt_max_ms)}; once the restart was ready: "
        f"{since(results['outcomes'], ready_again, rt_max_ms)}; launched after the restart: "
        f"{relaunched}"
    )
    tally.moto_states, tally.store_states, tally.decisions = moto_states, store_states, decisions
    left = alive(first_children | second_children)
    tally.orphan_detail = orphans(moto_states, store_states, sorted(left))
    tally.orphans = len(tally.orphan_detail)
    tally.took_s = time.monotonic() - began
    moto.stop()
    record(tally)
    tally.check()

    # The restart adopted every instance the killed daemon ran, and bought none of them twice.
    adopted = [d for d in decisions if d.action == "adopt" and d.at >= killed_at]
    assert adopted, "the restarted daemon adopted nothing"
    assert sum(d.count for d in adopted) >= len(live_at_kill), adopted
    # Refused only while no daemon listened (and a second of slack on each side).
    for o in results["outcomes"]:
        if o["status"] == -1:
            assert struck - 1.0 <= o["sent_s"] <= ready_again + 1.0, o
    served_after = [o for o in results["outcomes"] if o["sent_s"] > ready_again + 1.0]
    answered = [o for o in served_after if DECLINED_MARK not in (o["error"] or "")]  # or declined
    assert answered and all(o["status"] == 200 for o in answered), [
        (o["status"], o["error"]) for o in served_after if o["status"] != 200
    ][:5]
