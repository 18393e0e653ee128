"""The agent hears a spot reclaim from the instance metadata service (IMDSv2 stand-in)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bouncer.agent import ImdsPoller
from bouncer.agent_token import TOKEN_ENV, daemon_token, token_headers
from mark.cloud.standins.imds import TOKEN_HEADER, TTL_HEADER, ImdsStandin

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def imds() -> AsyncIterator[ImdsStandin]:
    standin = ImdsStandin("i-0123456789abcdef0")
    await standin.start()
    try:
        yield standin
    finally:
        await standin.close()


async def test_the_standin_speaks_imdsv2(imds: ImdsStandin) -> None:
    meta = f"{imds.url}/latest/meta-data"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{meta}/spot/instance-action") as r:
            assert r.status == 401  # tokens are required
        async with s.put(f"{imds.url}/latest/api/token") as r:
            assert r.status == 400  # a TTL is required
        async with s.put(f"{imds.url}/latest/api/token", headers={TTL_HEADER: "60"}) as r:
            token = await r.text()
        auth = {TOKEN_HEADER: token}
        async with s.get(f"{meta}/instance-id", headers=auth) as r:
            assert await r.text() == "i-0123456789abcdef0"
        async with s.get(f"{meta}/spot/instance-action", headers=auth) as r:
            assert r.status == 404  # nothing announced yet
        armed = imds.arm(in_s=120)
        async with s.get(f"{meta}/spot/instance-action", headers=auth) as r:
            assert r.status == 200 and await r.json() == armed
    assert armed["action"] == "terminate" and armed["time"].endswith("Z")


async def test_the_poller_reports_the_action_and_renews_its_token(imds: ImdsStandin) -> None:
    poller = ImdsPoller(imds.url, interval_s=0.05)
    async with aiohttp.ClientSession() as s:
        assert await poller.poll_once(s) is None
        imds._tokens.clear()  # the service restarted: the token is refused, a new one fetched
        assert await poller.poll_once(s) is None
        armed = imds.arm()
        assert await poller.poll_once(s) == armed
    assert imds.polls == 3


@pytest.mark.slow
async def test_a_running_agent_exposes_the_reclaim_on_health(imds: ImdsStandin) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bouncer.agent",
        "--model-source",
        "tests.lambda_rt.fixtures_model:tiny_mlp",
        "--input-shape",
        "4",
        "--imds-url",
        imds.url,
        "--imds-interval",
        "0.2",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1", TOKEN_ENV: daemon_token()},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        async with aiohttp.ClientSession(headers=token_headers()) as s:
            async with s.get(f"{url}/health") as r:
                assert (await r.json())["spot_action"] is None
            armed = imds.arm()
            deadline = time.monotonic() + 10
            while True:
                async with s.get(f"{url}/health") as r:
                    if (await r.json())["spot_action"] == armed:
                        break
                assert time.monotonic() < deadline, "the agent never reported the reclaim"
                await asyncio.sleep(0.1)
    finally:
        proc.terminate()
        await proc.wait()
