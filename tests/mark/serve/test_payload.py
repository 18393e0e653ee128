"""A request whose one row cannot fit a spill event is refused up front with 413."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from mark.config import SLO, InputSchema, ModelSpec, load_settings
from mark.ports import SPILL_PAYLOAD_LIMIT, SpillResult
from mark.serve.binary_tensors import HEADER_LENGTH
from mark.serve.codec import BadRequest, Tensor
from mark.serve.dispatcher import Dispatcher
from mark.serve.endpoint import Served, build_app
from mark.serve.payload import refuse_unspillable


def test_rows_that_fit_pass_and_one_that_does_not_is_413() -> None:
    zeros = Tensor({"x": np.zeros((3, 500_000), np.float32)})  # bound over, exact 2 MB each
    refuse_unspillable(zeros, SPILL_PAYLOAD_LIMIT, "m")
    many_small = Tensor({"x": np.random.default_rng(0).random((1000, 100), np.float32)})
    refuse_unspillable(many_small, SPILL_PAYLOAD_LIMIT, "m")
    big = Tensor({"x": np.random.default_rng(1).random((1, 700_000), np.float32)})
    with pytest.raises(BadRequest) as err:
        refuse_unspillable(big, SPILL_PAYLOAD_LIMIT, "m")
    assert err.value.status == 413 and "one instance of 'm'" in err.value.message


class _Spill:
    def __init__(self) -> None:
        self.calls = 0

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        self.calls += 1
        return SpillResult([[0.0] for _ in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


async def test_the_endpoint_refuses_an_unspillable_request_before_it_runs() -> None:
    settings = load_settings(overrides={"api": {"auth": False}})
    spec = ModelSpec(
        name="big",
        source="m.pt",
        input=InputSchema(shape=(600_000,)),
        slo=SLO(rt_max_ms=500, sl_min=0.9),
    )
    spill = _Spill()
    async with aiohttp.ClientSession() as session:
        disp = Dispatcher("big", 0.5, "float32", time.time, session, spill)
        disp.start()
        app = build_app(settings, {"big": Served(spec, disp, None)})
        async with TestClient(TestServer(app)) as client:
            x = np.random.default_rng(2).random((1, 600_000), np.float32)  # 2.4 MB binary
            head = (
                b'{"inputs":[{"name":"input","shape":[1,600000],"datatype":"FP32",'
                b'"parameters":{"binary_data_size":2400000}}]}'
            )
            r = await client.post(
                "/v2/models/big/infer",
                data=head + x.tobytes(),
                headers={HEADER_LENGTH: str(len(head))},
            )
            assert r.status == 413 and "Lambda takes at most" in (await r.json())["error"]
        await disp.close()
    assert spill.calls == 0
