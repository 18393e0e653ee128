"""A cluster of frontends for the tests of issue #49: N ``mark up`` processes in the aws
world on one PostgreSQL and one fleet, behind HAProxy (from the OS packages).

The cloud is the aws-world end-to-end test's fixture (``tests/e2e/test_aws_world.py``
``cloud``): moto as EC2, SQS and EventBridge, ``Ec2Host`` booting a real agent for each
running instance (the cloud's, shared by every frontend, as on AWS), Lambda Invoke from
real awslambdaric runtimes. The load (``load``) gives every request an id, so an answer
lost or given twice is seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
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
from tests.e2e.test_aws_world import _free_port, _seed_load, _settings

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 6.0
"""The lease's TTL in these tests (the default is 15 s): a takeover within seconds."""
RATE_RPS = 20.0
NEEDS_HAPROXY = pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="needs haproxy (apt-get install haproxy)"
)


async def until(what: str, check: Callable[[], Awaitable[bool]], within: float) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.3)


async def ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{url}/v2/health/ready") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


@dataclass
class Load:
    """What a load sent, and what came back: answers per request id, and every other
    outcome (a status other than 200 with its error, or no answer at all)."""

    sent: int = 0
    answered: Counter[str] = field(default_factory=Counter)
    refused: list[tuple[int, str]] = field(default_factory=list)
    """Explicit errors: (status, the daemon's reason)."""
    lost: list[str] = field(default_factory=list)
    """No HTTP answer (a connection dropped under the request, a timeout)."""

    @property
    def twice(self) -> int:
        return sum(n - 1 for n in self.answered.values() if n > 1)


async def load(urls: list[str], key: str, rate: float, seconds: float, first_id: int = 0) -> Load:
    """Send ``rate`` × ``seconds`` V2 requests, open loop, each with its id, round robin
    over ``urls``."""
    out = Load(sent=int(rate * seconds))
    async with aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {key}"},
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=60),
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
            try:
                async with session.post(
                    f"{urls[k % len(urls)]}/v2/models/digits/infer", json=body
                ) as r:
                    raw = await r.text()
                    if r.status == 200:
                        out.answered[json.loads(raw)["id"]] += 1
                    else:  # the daemon's JSON error, or the balancer's own page
                        with contextlib.suppress(ValueError, AttributeError):
                            raw = str(json.loads(raw).get("error", ""))
                        out.refused.append((r.status, raw[:200]))
            except (aiohttp.ClientError, TimeoutError) as exc:
                out.lost.append(f"{rid}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(k) for k in range(out.sent)))
    return out


async def metrics(url: str, key: str) -> str:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as s,
        s.get(f"{url}/metrics") as r,
    ):
        assert r.status == 200
        return await r.text()


def counted(text: str, name: str) -> float:
    """The sum of a Prometheus counter's series."""
    return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M))


@dataclass
class Cluster:
    base: Settings
    pg_url: str
    key: str
    root: Path
    ports: list[int]
    procs: list[asyncio.subprocess.Process | None]
    proxy: subprocess.Popen[bytes] | None = None
    proxy_port: int = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def through(self) -> str:
        """The load balancer's address."""
        return f"http://127.0.0.1:{self.proxy_port}"

    def settings(self, k: int) -> Settings:
        return self.base.model_copy(update={"data_dir": self.root / f"fe{k}"})

    async def start(self, k: int) -> None:
        settings = self.settings(k)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        ensure_demo_model(settings.data_dir)
        config = settings.data_dir / "mark.yaml"
        config.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_none=True)))
        log = (settings.data_dir / "daemon.log").open("ab")
        self.procs[k] = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "mark.cli.main", "--config", str(config)),
            *("--log-format", "json", "up", "--port", str(self.ports[k])),
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        url = self.urls[k]
        await until(f"{url} is ready", lambda: ready(url), within=120)

    async def stop(self, k: int, sig: signal.Signals = signal.SIGTERM) -> None:
        proc = self.procs[k]
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def holder(self) -> str | None:
        """Who holds an unexpired lease now."""
        store = await open_store(self.pg_url)
        try:
            now = time.time()
            held = [lease.holder for lease in await store.leases() if lease.expires_at > now]
        finally:
            await store.close()
        return held[0] if held else None

    async def leader(self) -> int | None:
        """Which frontend holds an unexpired lease now, by its row's address."""
        holder = await self.holder()
        store = await open_store(self.pg_url)
        try:
            rows = await store.frontends(time.time() - 60.0)
        finally:
            await store.close()
        url = next((f.url for f in rows if f.id == holder), None)
        return next((k for k, p in enumerate(self.ports) if url and url.endswith(f":{p}")), None)

    async def launches(self, k: int) -> float:
        """What frontend ``k`` has launched since it started (its ``/metrics``)."""
        return counted(await metrics(self.urls[k], self.key), "mark_launches_total")

    async def deciders(self, among: list[int]) -> list[int]:
        """Those of ``among`` that recorded a decision since they started: a follower
        records none."""
        texts = [await metrics(self.urls[k], self.key) for k in among]
        return [k for k, t in zip(among, texts, strict=True) if counted(t, "mark_decisions_total")]

    def balance(self) -> None:
        cfg = self.root / "haproxy.cfg"
        servers = "\n".join(
            f"    server fe{k} 127.0.0.1:{p} check inter 500ms fall 2 rise 1"
            for k, p in enumerate(self.ports)
        )
        self.proxy_port = _free_port()
        cfg.write_text(
            "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n"
            "    timeout server 60s\n    retries 3\n    option redispatch\n"
            f"frontend mark\n    bind 127.0.0.1:{self.proxy_port}\n"
            "    default_backend frontends\n"
            "backend frontends\n    balance roundrobin\n"
            "    option httpchk GET /v2/health/ready\n"
            f"{servers}\n"
        )
        self.proxy = subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL)


@contextlib.asynccontextmanager
async def cluster(
    cloud: dict[str, Any], pg_url: str, root: Path, n: int = 3
) -> AsyncIterator[Cluster]:
    """``n`` frontends up and ready, HAProxy in front once they are, the store seeded with
    an hour at ``RATE_RPS`` (a fleet sized for the load to come) and an admin key."""
    base = _settings(cloud, root)
    base = base.model_copy(
        update={
            "database_url": pg_url,
            "control": base.control.model_copy(update={"lease_ttl_s": LEASE_TTL_S}),
        }
    )
    await _seed_load(base, rate=RATE_RPS)
    store = await open_store(pg_url, upgrade=True)
    try:
        _, key = await create_key(store, "e2e", ["inference", "admin"], time.time())
    finally:
        await store.close()
    c = Cluster(base, pg_url, key, root, [_free_port() for _ in range(n)], [None] * n)
    try:
        for k in range(n):
            await c.start(k)
        c.balance()
        await until("HAProxy sees the frontends", lambda: ready(c.through), within=20)
        yield c
    finally:
        if c.proxy is not None:
            c.proxy.terminate()
            c.proxy.wait(10)
        for k in range(n):
            await c.stop(k)
