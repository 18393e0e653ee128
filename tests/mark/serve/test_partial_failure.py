"""A request whose rows partly fail: the failed rows are retried once on the spill function
and the rows that succeeded are kept; what still fails is a 503 with ``Retry-After`` that
names the rows (``mark.serve.endpoint``'s docstring says why, for V1 and V2 alike).

The spill function here fails chosen rows (a row is known by its first value); each
spilled row is its own invocation (no spill batch curve: ``spill_chunks``), so a request's
rows fail apart.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bouncer.miss_budget import MissBudget
from bouncer.routing import spill_chunks
from mark.config import load_settings
from mark.errors import SpillError
from mark.ports import SpillResult
from mark.serve.auth import KeyCache, issue
from mark.serve.dispatcher import DECLINED, Dispatcher
from mark.serve.endpoint import STATE, Served, build_app
from mark.serve.telemetry import Telemetry


class Flaky:
    """Answers each row's sum; fails the rows in ``once`` on their first invocation and
    those in ``always`` every time. ``gate`` holds failures until it is set."""

    def __init__(self, once: Sequence[float] = (), always: Sequence[float] = ()) -> None:
        self.once, self.always = set(once), set(always)
        self.calls: Counter[float] = Counter()
        self.gate = asyncio.Event()
        self.gate.set()

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        keys = [float(np.asarray(row).ravel()[0]) for row in batch]
        for k in keys:
            self.calls[k] += 1
        failing = [k for k in keys if k in self.always or (k in self.once and self.calls[k] == 1)]
        if failing:
            await self.gate.wait()
            raise SpillError(f"row {failing[0]:g} failed")
        return SpillResult([[float(np.sum(row))] for row in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


class Api:
    def __init__(self, client: TestClient[Any, Any], telemetry: Telemetry) -> None:
        self.client, self.telemetry = client, telemetry


def _api(lam: Flaky, budget: MissBudget | None = None) -> Any:
    async def make() -> AsyncIterator[Api]:
        settings = load_settings()
        spec = settings.models[0]
        async with aiohttp.ClientSession() as session:
            tel = Telemetry(spec.name, spec.slo.rt_max_ms)
            disp = Dispatcher(
                spec.name, 1.0, "float32", time.time, session, lam, tel, budget=budget
            )
            disp.start()
            key, token = issue("tests", ["inference"], time.time())
            app = build_app(settings, {spec.name: Served(spec, disp, tel)}, KeyCache.fixed([key]))
            headers = {"Authorization": f"Bearer {token}"}
            async with TestClient(TestServer(app), headers=headers) as c:
                yield Api(c, tel)
            lam.gate.set()
            await disp.close()

    return make()


def _image(value: float) -> list[list[list[float]]]:
    """One digits instance whose first value names it; its sum is ``value`` + 1."""
    img = [[[0.0] * 8 for _ in range(8)]]
    img[0][0][0] = value
    img[0][7][7] = 1.0
    return img


def test_each_spilled_row_is_its_own_invocation() -> None:
    # What lets the rows of a request fail apart here: no curve, one row per invocation.
    assert spill_chunks(0.0, [1.0, 1.0, 1.0], None) == [[0], [1], [2]]


async def _v1(api: Api, values: Sequence[float]) -> tuple[int, dict[str, Any], str | None]:
    body = {"instances": [_image(v) for v in values]}
    async with api.client.post("/v1/models/digits:predict", json=body) as r:
        return r.status, await r.json(), r.headers.get("Retry-After")


async def _v2(api: Api, values: Sequence[float]) -> tuple[int, dict[str, Any], str | None]:
    data = [x for v in values for x in np.ravel(_image(v)).tolist()]
    tensor = {"name": "input", "shape": [len(values), 1, 8, 8], "datatype": "FP32", "data": data}
    async with api.client.post("/v2/models/digits/infer", json={"inputs": [tensor]}) as r:
        return r.status, await r.json(), r.headers.get("Retry-After")


@pytest.mark.parametrize("protocol", ["v1", "v2"])
async def test_a_row_that_fails_once_is_retried_and_the_others_are_kept(protocol: str) -> None:
    lam = Flaky(once=[12.0])
    async for api in _api(lam):
        status, body, _ = await (_v1 if protocol == "v1" else _v2)(api, [10.0, 11.0, 12.0, 13.0])
        assert status == 200, body
        got = (
            [p[0] for p in body["predictions"]] if protocol == "v1" else body["outputs"][0]["data"]
        )
        assert got == [11.0, 12.0, 13.0, 14.0]
        # The failed row ran twice (its one retry), every other row once.
        assert lam.calls == {10.0: 1, 11.0: 1, 12.0: 2, 13.0: 1}
        # A retry is not a new arrival; its failure and its success are both outcomes.
        counts = api.telemetry.counts
        assert (counts["spilled"], counts["error"], counts["served"]) == (4, 1, 0)
        windows, _ = api.telemetry.drain(time.time(), everything=True)
        assert sum(w.count for w in windows) == 4


async def test_rows_that_fail_again_are_a_503_naming_them_with_retry_after() -> None:
    lam = Flaky(always=[21.0, 23.0])
    async for api in _api(lam):
        for call in (_v1, _v2):
            status, body, retry_after = await call(api, [20.0, 21.0, 22.0, 23.0])
            assert status == 503 and retry_after is not None and int(retry_after) >= 1
            error = body["error"]
            assert error.startswith("2 of 4 instances failed (retried once on the spill function)")
            assert "rows 1, 3" in error and "failed" in error
        assert lam.calls == {20.0: 2, 21.0: 4, 22.0: 2, 23.0: 4}  # two requests, one retry each


async def test_a_request_whose_every_row_failed_is_not_retried() -> None:
    lam = Flaky(always=[30.0, 31.0, 32.0])
    async for api in _api(lam):
        status, body, retry_after = await _v1(api, [30.0, 31.0])
        assert status == 503 and retry_after is not None
        assert body["error"].startswith("2 of 2 instances failed, rows 0, 1: spill failed: row 3")
        (status, body, retry_after) = await _v2(api, [32.0])
        assert status == 503 and retry_after is not None and "retried" not in body["error"]
        assert lam.calls == {30.0: 1, 31.0: 1, 32.0: 1}


async def test_no_retry_while_the_endpoint_drains() -> None:
    lam = Flaky(once=[41.0])
    lam.gate.clear()  # the failure comes once the drain has begun
    async for api in _api(lam):
        call = asyncio.create_task(_v1(api, [40.0, 41.0]))
        deadline = time.monotonic() + 10
        while lam.calls[41.0] == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        api.client.server.app[STATE].intake.drain()
        lam.gate.set()
        status, body, retry_after = await asyncio.wait_for(call, 10)
        assert status == 503 and retry_after is not None
        assert body["error"].startswith("1 of 2 instances failed, rows 1:")
        assert lam.calls == {40.0: 1, 41.0: 1}


@pytest.mark.parametrize("protocol", ["v1", "v2"])
async def test_a_declined_request_is_a_503_and_is_not_spilled_on_retry(protocol: str) -> None:
    # SL_min 50 %, share 0.5, no instance: everything would spill. A request of four rows
    # is never declined (one declined row would fail it all); after it, five requests
    # allow one decline, and the next one-row request gets it, without a Lambda retry.
    lam = Flaky()
    call = _v1 if protocol == "v1" else _v2
    async for api in _api(lam, MissBudget(sl_min=0.5, share=0.5)):
        status, _, _ = await call(api, [50.0, 51.0, 52.0, 53.0])
        assert status == 200
        status, body, retry_after = await call(api, [54.0])
        assert status == 503 and retry_after is not None and int(retry_after) >= 1
        assert body["error"].startswith("1 of 1 instances failed, rows 0: ")
        assert body["error"].endswith(DECLINED)
        assert lam.calls == {50.0: 1, 51.0: 1, 52.0: 1, 53.0: 1}
        assert api.telemetry.counts["declined"] == 1
