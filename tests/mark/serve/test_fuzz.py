"""Fuzz the endpoint from its own OpenAPI document: no input may produce a 5xx.

Every call carries a valid key, so the fuzz reaches the handlers, not only the 401."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import aiohttp
import numpy as np
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck
from hypothesis import settings as hyp_settings
from schemathesis.checks import not_a_server_error

from mark.config import load_settings
from mark.ports import SpillResult
from mark.serve.auth import KeyCache, issue
from mark.serve.dispatcher import Dispatcher
from mark.serve.endpoint import Served, build_app
from mark.serve.openapi import openapi_document

SETTINGS = load_settings(overrides={"api": {"max_body_bytes": 65536}})
schema = schemathesis.openapi.from_dict(openapi_document(SETTINGS))
KEY, TOKEN = issue("fuzz", ["inference", "metrics"], 0.0)


class SumModel:
    """Serverless port answering each instance's sum, so the fuzz reaches real handlers."""

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        return SpillResult([[float(np.sum(x))] for x in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        import time

        session = aiohttp.ClientSession()
        spec = SETTINGS.models[0]
        disp = Dispatcher(spec.name, 1.0, "float32", time.time, session, SumModel())
        disp.start()
        app = build_app(SETTINGS, {spec.name: Served(spec, disp, None)}, keys=KeyCache.fixed([KEY]))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        holder.update(url=f"http://{host}:{port}", runner=runner, disp=disp, session=session)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(main(), loop).result(30)
    ready.wait(30)
    yield holder["url"]

    async def shutdown() -> None:
        await holder["disp"].close()
        await holder["runner"].cleanup()
        await holder["session"].close()

    asyncio.run_coroutine_threadsafe(shutdown(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@schema.parametrize()
@hyp_settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_produces_a_server_error(case: Any, live_url: str) -> None:
    case.call_and_validate(
        base_url=live_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[not_a_server_error],
    )
