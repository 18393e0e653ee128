"""The spill function decodes a batch as the model's dtype, on every path that reaches it.

An int or uint8 model's rows used to reach the handler without a dtype and were
decoded as float32. The model here is ``torch.nn.Identity``, so what comes back is
what the handler decoded: whole numbers stay ints in the JSON reply (``255``, not
``255.0``), and 2**40 + 1 survives as int64 where float32 would round it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from lambda_handlers import spill
from mark.cloud.aws.lambda_ import AwsLambda, chunk_events
from mark.cloud.local.lambda_ import LocalLambda
from mark.cloud.local.lambda_.events import encode_event
from mark.cloud.standins.lambda_api import LambdaApi
from mark.ports import SpillResult
from mark.serve.dispatcher import Dispatcher

IDENTITY = "torch.nn:Identity"
BIG = 2**40 + 1
"""Exact in int64; float32 rounds it to 2**40."""


def _ints(outputs: Any) -> bool:
    return all(type(v) is int for row in outputs for v in row)


# -- the handler ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64"])
def test_the_handler_decodes_the_rows_as_the_events_dtype(dtype: str) -> None:
    reply = spill.handler(
        {"model": "id", "instances": [[255, 3], [0, 7]], "source": IDENTITY, "dtype": dtype}, None
    )
    assert reply["outputs"] == [[255, 3], [0, 7]] and _ints(reply["outputs"])


def test_int64_rows_are_exact_and_float32_is_the_default_for_older_callers() -> None:
    event: dict[str, Any] = {"model": "id", "instances": [[BIG]], "source": IDENTITY}
    assert spill.handler({**event, "dtype": "int64"}, None)["outputs"] == [[BIG]]
    (rounded,) = spill.handler(event, None)["outputs"][0]  # no dtype: float32, as before
    assert isinstance(rounded, float) and rounded != BIG


# -- the adapters' events -------------------------------------------------------------------


def test_both_adapters_put_the_dtype_in_every_event() -> None:
    local = json.loads(encode_event("id", [[1, 2]], None, "uint8"))
    assert local["dtype"] == "uint8"
    rows = [[i] * 300 for i in range(40)]
    events = chunk_events("id", rows, "src", limit=4000, dtype="int32")
    assert len(events) > 1  # split under the payload limit: each chunk still says it
    assert all(json.loads(payload)["dtype"] == "int32" for payload, _ in events)


class Recording:
    def __init__(self) -> None:
        self.dtypes: list[str] = []

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        self.dtypes.append(dtype)
        return SpillResult([list(row) for row in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


async def test_the_dispatcher_hands_the_port_its_models_dtype() -> None:
    lam = Recording()
    async with aiohttp.ClientSession() as session:
        d = Dispatcher("pixels", 0.5, "uint8", time.time, session, lam)
        d.start()
        try:
            rows = np.array([[255, 3], [1, 2]], dtype=np.uint8)
            outcomes = await d.submit(rows)
            assert [o.output for o in outcomes] == [[255, 3], [1, 2]]
            again = await d.submit(rows[:1], spill_now=True)  # the endpoint's retry path
            assert again[0].output == [255, 3]
        finally:
            await d.close()
    assert lam.dtypes and set(lam.dtypes) == {"uint8"}


# -- real runtimes: the local adapter, and the aws adapter through the Invoke stand-in ------


async def test_local_and_aws_adapters_reach_the_runtime_with_the_dtype(
    project_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    local = LocalLambda({"id": IDENTITY}, cwd=project_root, memory_mb=1024, max_concurrency=1)
    await local.start()
    standin = LambdaApi("mark-spill", local)
    await standin.start()
    try:
        direct = await local.invoke("id", [[BIG, 2]], dtype="int64")
        assert direct.outputs == [[BIG, 2]] and _ints(direct.outputs)
        async with AwsLambda(
            "mark-spill", region="us-east-1", endpoint_url=standin.url, sources={"id": IDENTITY}
        ) as aws:
            via_aws = await asyncio.wait_for(aws.invoke("id", [[255, 0]], dtype="uint8"), 120)
        assert via_aws.outputs == [[255, 0]] and _ints(via_aws.outputs)
    finally:
        await standin.close()
        await local.close()
