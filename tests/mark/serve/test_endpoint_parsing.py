"""Big request bodies are parsed off the event loop (``mark.serve.endpoint.Parsing``).

The loop test asserts on order, not milliseconds: the big "parse" waits, in the
parser process, for a file that only a task on the event loop writes after ticking.
Run on the loop, it would wait out its own bound and report so."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from mark.config import load_settings
from mark.ports import SpillResult
from mark.serve.auth import KeyCache, issue
from mark.serve.binary_tensors import HEADER_LENGTH
from mark.serve.codec import BadRequest
from mark.serve.dispatcher import Dispatcher
from mark.serve.endpoint import STATE, Parsing, Served, build_app
from mark.serve.telemetry import Telemetry


def wait_for_file(path: Path) -> list[str]:
    """A command that exits 0 once ``path`` exists, 1 if it did not within 30 s. (The
    parser process runs stdlib callables only: it cannot import this test module.)"""
    script = 'for i in $(seq 600); do [ -e "$0" ] && exit 0; sleep 0.05; done; exit 1'
    return ["sh", "-c", script, str(path)]


@pytest.fixture
async def parsing() -> AsyncIterator[Parsing]:
    p = Parsing(inline_bytes=1024)
    yield p
    p.close()


async def test_small_bodies_inline_big_ones_in_a_parser_process(parsing: Parsing) -> None:
    assert await parsing.run(1024, os.getpid) == os.getpid()
    assert await parsing.run(1025, os.getpid) != os.getpid()


async def test_the_loop_ticks_while_a_big_body_parses(parsing: Parsing, tmp_path: Path) -> None:
    release = tmp_path / "release"
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        for _ in range(5):  # the loop keeps running other work meanwhile
            await asyncio.sleep(0)
            ticks += 1
        release.write_text("go")

    big = asyncio.create_task(parsing.run(10**6, subprocess.call, wait_for_file(release)))
    await ticker()
    assert await big == 0, "the parse never saw the file: it blocked the event loop"
    assert ticks == 5


async def test_a_dead_parser_is_a_503_and_the_next_body_gets_a_new_one(
    parsing: Parsing,
) -> None:
    with pytest.raises(BadRequest) as err:
        await parsing.run(10**6, os._exit, 1)  # the parser process dies mid-request
    assert err.value.status == 503
    assert await parsing.run(10**6, os.getpid) != os.getpid()


async def test_a_flood_of_big_bodies_is_refused_past_the_queue_not_held(
    tmp_path: Path,
) -> None:
    parsing = Parsing(inline_bytes=1024, processes=1, max_queued=2)
    release = tmp_path / "release"
    try:
        held = [
            asyncio.create_task(parsing.run(10**6, subprocess.call, wait_for_file(release)))
            for _ in range(2)
        ]
        await asyncio.sleep(0)  # both taken: one in the parser, one waiting for it
        with pytest.raises(BadRequest) as err:
            await parsing.run(10**6, os.getpid)
        assert err.value.status == 503 and "retry" in err.value.message
        assert await parsing.run(10, os.getpid) == os.getpid()  # small bodies never wait
        release.write_text("go")
        assert await asyncio.gather(*held) == [0, 0]
        assert await parsing.run(10**6, os.getpid) != os.getpid()  # room again
    finally:
        parsing.close()


class EchoSum:
    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        return SpillResult([[float(np.sum(x))] for x in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    settings = load_settings()
    spec = settings.models[0]
    async with aiohttp.ClientSession() as session:
        tel = Telemetry(spec.name, spec.slo.rt_max_ms)
        disp = Dispatcher(spec.name, 1.0, "float32", time.time, session, EchoSum(), tel)
        disp.start()
        key, token = issue("tests", ["inference"], time.time())
        app = build_app(settings, {spec.name: Served(spec, disp, tel)}, keys=KeyCache.fixed([key]))
        app[STATE].parsing = Parsing(inline_bytes=1024)
        async with TestClient(TestServer(app), headers={"Authorization": f"Bearer {token}"}) as c:
            yield c
        await disp.close()


ONES = [[[1.0] * 8] * 8]


async def test_big_bodies_are_answered_and_their_mistakes_are_400s(
    client: TestClient[Any, Any],
) -> None:
    r = await client.post("/v1/models/digits:predict", json={"instances": [ONES] * 40})
    assert r.status == 200 and (await r.json())["predictions"] == [[64.0]] * 40

    head = orjson.dumps(
        {
            "id": "big",
            "inputs": [
                {
                    "name": "input",
                    "shape": [40, 1, 8, 8],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 40 * 64 * 4},
                }
            ],
        }
    )
    raw = np.ones((40, 1, 8, 8), dtype="<f4").tobytes()
    r = await client.post(
        "/v2/models/digits/infer", data=head + raw, headers={HEADER_LENGTH: str(len(head))}
    )
    body = await r.json()
    assert r.status == 200 and body["id"] == "big" and body["outputs"][0]["data"] == [64.0] * 40

    junk = orjson.dumps({"instances": [[0.5] * 100] * 40})
    r = await client.post("/v1/models/digits:predict", data=junk)
    assert r.status == 400 and "instance shape [100]" in (await r.json())["error"]
