"""Three frontends, one cluster (issue #49): three ``mark up`` processes in the aws world on
one PostgreSQL and one fleet, behind HAProxy (from the OS packages, started here).

The cloud is the aws-world end-to-end test's (``tests/e2e/test_aws_world.py``): moto as
EC2, SQS and EventBridge, ``Ec2Host`` booting a real agent for each running instance (the
cloud's, shared by every frontend), Lambda Invoke served from real awslambdaric
runtimes. Asserted:

- the arrivals the store holds for the load (what the forecast, ``mark status`` and
  ``mark report`` read) are what was sent through HAProxy, within 2 %, though each
  frontend counted only its share;
- ``mark status`` lists the three frontends, one leading;
- no follower launches or terminates anything (their ``/metrics`` count no launch);
- kill -9 of the leader: requests sent to the other two frontends meanwhile are all
  answered, once each; one of them holds the lease within the TTL and a renewal, and
  plans (its decisions counted) without buying the fleet again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from mark.config import Settings
from mark.demo import ensure_demo_model
from mark.demo.loadgen import fetch_model_input
from mark.serve.auth import create_key
from mark.state import open_store
from tests.e2e.test_aws_world import _free_port, _seed_load, _settings, _until, cloud  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 6.0
RATE_RPS = 20.0
pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy (apt-get install)"),
]


def _frontend_settings(base: Settings, pg_url: str, data_dir: Path) -> Settings:
    return base.model_copy(
        update={
            "database_url": pg_url,
            "data_dir": data_dir,
            "control": base.control.model_copy(update={"lease_ttl_s": LEASE_TTL_S}),
        }
    )


async def _mark_up(settings: Settings, port: int) -> asyncio.subprocess.Process:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    ensure_demo_model(settings.data_dir)
    config = settings.data_dir / "mark.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_none=True)))
    log = (settings.data_dir / "daemon.log").open("wb")
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "mark.cli.main", "--config", str(config)),
        *("--log-format", "json", "up", "--port", str(port)),
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )


async def _ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{url}/v2/health/ready") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def _haproxy(port: int, backends: list[int], where: Path) -> subprocess.Popen[bytes]:
    cfg = where / "haproxy.cfg"
    servers = "\n".join(
        f"    server fe{k} 127.0.0.1:{p} check inter 500ms fall 2 rise 1"
        for k, p in enumerate(backends)
    )
    cfg.write_text(
        "defaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n"
        "    timeout server 30s\n"
        f"frontend mark\n    bind 127.0.0.1:{port}\n    default_backend frontends\n"
        "backend frontends\n    balance roundrobin\n    option httpchk GET /v2/health/ready\n"
        f"{servers}\n"
    )
    return subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL)


async def _load(
    urls: list[str], key: str, rate: float, seconds: float, first_id: int = 0
) -> tuple[int, Counter[str], list[int]]:
    """Send ``rate`` × ``seconds`` requests, each with its id, spread over ``urls``; the
    number sent, how many answers each id got, and the statuses that were not 200."""
    n = int(rate * seconds)
    answered: Counter[str] = Counter()
    bad: list[int] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(
        headers=headers, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        inp = await fetch_model_input(session, urls[0], "digits")
        rng = np.random.default_rng(first_id)
        rows = [inp.random_row(rng).reshape(-1).tolist() for _ in range(16)]

        async def one(k: int) -> None:
            await asyncio.sleep(k / rate)
            rid = f"r{first_id + k}"
            body = {
                "id": rid,
                "inputs": [
                    {
                        "name": inp.name,
                        "shape": [1, *inp.shape],
                        "datatype": inp.datatype,
                        "data": rows[k % len(rows)],
                    }
                ],
            }
            url = urls[k % len(urls)]
            async with session.post(f"{url}/v2/models/digits/infer", json=body) as r:
                if r.status == 200:
                    answered[(await r.json())["id"]] += 1
                else:
                    bad.append(r.status)

        await asyncio.gather(*(one(k) for k in range(n)))
    return n, answered, bad


async def _metrics(url: str, key: str) -> str:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as s,
        s.get(f"{url}/metrics") as r,
    ):
        assert r.status == 200
        return await r.text()


def _counted(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M))


async def _by_source(pg_url: str, since: float) -> list[tuple[str, int, float, float]]:
    """Each frontend's arrivals since ``since``: (source, count, first, last window)."""
    from sqlalchemy import text

    store = await open_store(pg_url)
    try:
        async with store._session() as s:
            rows = await s.execute(
                text(
                    "SELECT source, SUM(count), MIN(window_start), MAX(window_start) FROM arrivals"
                    " WHERE window_start >= :t GROUP BY source"
                ),
                {"t": since - 5.0},
            )
            return [tuple(r) for r in rows]
    finally:
        await store.close()


async def _holder(pg_url: str) -> str | None:
    store = await open_store(pg_url)
    try:
        now = time.time()
        held = [lease.holder for lease in await store.leases() if lease.expires_at > now]
    finally:
        await store.close()
    return held[0] if held else None


async def test_three_frontends_behind_haproxy_are_one_cluster(
    cloud: dict[str, Any],  # noqa: F811
    pg_url: str,
    tmp_path: Path,
) -> None:
    base = _frontend_settings(_settings(cloud, tmp_path), pg_url, tmp_path / "fe0")
    await _seed_load(base, rate=RATE_RPS)  # the load it will see: a fleet sized for it
    store = await open_store(pg_url, upgrade=True)
    try:
        _, key = await create_key(store, "e2e", ["inference", "admin"], time.time())
    finally:
        await store.close()
    ports = [_free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs: list[asyncio.subprocess.Process] = []
    proxy: subprocess.Popen[bytes] | None = None
    try:
        for k, port in enumerate(ports):
            procs.append(
                await _mark_up(base.model_copy(update={"data_dir": tmp_path / f"fe{k}"}), port)
            )
        for url in urls:
            await _until(f"{url} is ready", lambda u=url: _ready(u), within=120)  # type: ignore[misc]
        proxy_port = _free_port()
        proxy = _haproxy(proxy_port, ports, tmp_path)
        through = f"http://127.0.0.1:{proxy_port}"
        await _until("HAProxy sees the frontends", lambda: _ready(through), within=20)

        # One cluster's load through the balancer, each frontend counting its share.
        t0 = time.time()
        sent, answered, bad = await _load([through], key, RATE_RPS, 30.0)
        assert not bad and sum(answered.values()) == sent
        assert set(answered.values()) == {1}
        model = base.models[0].name
        counts: list[int] = []

        async def counted() -> bool:
            """Closed windows are flushed every P_s, a minute's roll-up once it closes."""
            store = await open_store(pg_url)
            try:
                windows = await store.arrivals(model, t0 - 5.0, time.time())
                rollups = await store.latency_rollups(model, t0 - 60.0, time.time())
            finally:
                await store.close()
            counts[:] = [sum(w.count for w in windows), sum(r.requests for r in rollups)]
            return min(counts) >= 0.98 * sent

        with contextlib.suppress(AssertionError):
            await _until("the frontends' counts are in the store", counted, within=90)
        assert all(abs(c - sent) <= 0.02 * sent for c in counts), (
            counts,
            sent,
            await _by_source(pg_url, t0),
        )

        # `mark status` counts them together and lists the three frontends, one leading.
        cmd = [
            sys.executable,
            "-m",
            "mark.cli.main",
            "--config",
            str(tmp_path / "fe0" / "mark.yaml"),
        ]
        shown = await asyncio.create_subprocess_exec(
            *cmd,
            "status",
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "250"},
            stdout=asyncio.subprocess.PIPE,
        )
        status = (await shown.communicate())[0].decode()
        assert shown.returncode == 0, status
        assert "frontends (3 live)" in status, status
        assert len(re.findall(r"│ yes\s*│", status)) == 1, status
        seen = int(re.search(r"│ digits\s*│\s*(\d+)\s*│", status).group(1))  # type: ignore[union-attr]
        assert abs(seen - sent) <= 0.02 * sent, (seen, sent)

        # Only the leader plans: no follower launched anything.
        leader = await _holder(pg_url)
        metrics = [await _metrics(u, key) for u in urls]
        launched = [_counted(m, "mark_launches_total") for m in metrics]
        leading = [k for k, m in enumerate(metrics) if _counted(m, "mark_decisions_total") > 0]
        assert leader is not None and len(leading) == 1, (leader, launched)
        assert launched[leading[0]] > 0 and sum(launched) == launched[leading[0]]

        # kill -9 of the leader under load sent to the other two.
        others = [urls[k] for k in range(3) if k != leading[0]]
        load = asyncio.create_task(_load(others, key, RATE_RPS, 20.0, first_id=100_000))
        await asyncio.sleep(3.0)
        killed_at, killed_wall = time.monotonic(), time.time()
        procs[leading[0]].send_signal(signal.SIGKILL)
        await procs[leading[0]].wait()

        async def taken_over() -> bool:
            holder = await _holder(pg_url)
            return holder is not None and holder != leader

        await _until("another frontend leads", taken_over, within=LEASE_TTL_S * 3)
        took_s = time.monotonic() - killed_at
        assert took_s <= LEASE_TTL_S + LEASE_TTL_S / 3 + base.timings.update_period_s + 2.0
        sent, answered, bad = await load
        assert not bad and sum(answered.values()) == sent  # lost = 0
        assert set(answered.values()) == {1}  # answered twice = 0

        async def plans() -> bool:
            store = await open_store(pg_url)
            try:
                newest = await store.plans(base.models[0].name, limit=1)
            finally:
                await store.close()
            return bool(newest) and newest[0].at > killed_wall

        await _until("the new leader plans", plans, within=2 * base.timings.update_period_s)
        after = [await _metrics(u, key) for u in others]
        bought = [
            ln for m in after for ln in m.splitlines() if ln.startswith("mark_launches_total")
        ]
        assert not bought, bought  # adopted, not bought
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.wait(), 60)
            if p.returncode is None:
                p.kill()
