"""The endpoint in-process: every client mistake is a 4xx JSON body, never a 500.

The client holds an admin key with the inference scope (``tests/mark/serve/test_auth.py``
covers keys and scopes), so it also sees who served each request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bouncer.wire import SERVED_BY_HEADER
from mark.config import load_settings
from mark.ports import SpillResult
from mark.serve.auth import KeyCache, issue
from mark.serve.dispatcher import Dispatcher
from mark.serve.endpoint import Served, build_app
from mark.serve.telemetry import Telemetry


class EchoSum:
    """A Serverless port whose 'model' returns each instance's sum: enough to test the API."""

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        return SpillResult([[float(np.sum(x))] for x in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    import time

    import aiohttp

    settings = load_settings(overrides={"api": {"max_body_bytes": 4096}})
    spec = settings.models[0]
    async with aiohttp.ClientSession() as session:
        tel = Telemetry(spec.name, spec.slo.rt_max_ms)
        disp = Dispatcher(spec.name, 1.0, "float32", time.time, session, EchoSum(), tel)
        disp.start()
        key, token = issue("tests", ["inference", "admin"], time.time())
        app = build_app(settings, {spec.name: Served(spec, disp, tel)}, keys=KeyCache.fixed([key]))
        async with TestClient(TestServer(app), headers={"Authorization": f"Bearer {token}"}) as c:
            yield c
        await disp.close()


ZERO = [[[0.0] * 8] * 8]


async def test_v1_and_v2_predict(client: TestClient[Any, Any]) -> None:
    ones = [[[1.0] * 8] * 8]
    r = await client.post("/v1/models/digits:predict", json={"instances": [ZERO, ones]})
    assert r.status == 200 and (await r.json())["predictions"] == [[0.0], [64.0]]
    assert r.headers[SERVED_BY_HEADER] == "lambda"  # no instances: the spill function
    body = {
        "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [2.0] * 64}]
    }
    r = await client.post("/v2/models/digits/infer", json=body)
    out = (await r.json())["outputs"][0]
    assert r.status == 200 and out["data"] == [128.0] and out["shape"] == [1, 1]
    assert r.headers[SERVED_BY_HEADER] == "lambda"


@pytest.mark.parametrize(
    ("path", "data", "status"),
    [
        ("/v1/models/nope:predict", b'{"instances": []}', 404),
        ("/v2/models/nope/infer", b"{}", 404),
        ("/v1/models/digits:predict", b"{not json", 400),
        ("/v1/models/digits:predict", b'{"instances": [[1, 2]]}', 400),
        ("/v1/models/digits:predict", b'{"wrong": 1}', 400),
        ("/v2/models/digits/infer", b'{"inputs": [{"name": "x"}]}', 400),
        ("/v1/models/digits:predict", b'{"instances": [' + b"0," * 5000 + b"0]}", 413),
        ("/v1/models/digits:predict", b"null", 400),
        ("/v1/models/digits:predict", b'"text"', 400),
    ],
)
async def test_client_mistakes_are_4xx_json(
    client: TestClient[Any, Any], path: str, data: bytes, status: int
) -> None:
    r = await client.post(path, data=data, headers={"Content-Type": "application/json"})
    assert r.status == status
    assert "error" in await r.json()


async def test_metadata_health_metrics_and_openapi(client: TestClient[Any, Any]) -> None:
    meta = await (await client.get("/v2/models/digits")).json()
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}
    assert (await client.get("/v2/models/nope")).status == 404
    assert (await (await client.get("/v2/health/ready")).json())["ready"] is True
    await client.post("/v1/models/digits:predict", json={"instances": [ZERO]})
    text = await (await client.get("/metrics")).text()
    assert 'mark_requests_total{model="digits",outcome="spilled"} 1' in text
    r = await client.post("/v1/models/digits:predict", json={"instances": [ZERO] * 3})
    assert r.status == 200
    text = await (await client.get("/metrics")).text()
    # Two calls, 4 rows: each counted under its own name.
    assert 'mark_inference_requests_total{model="digits"} 2\n' in text
    assert 'mark_rows_total{model="digits"} 4\n' in text
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.") and "/v1/models/digits:predict" in doc["paths"]


async def test_a_compressed_body_is_limited_by_what_it_inflates_to(
    client: TestClient[Any, Any],
) -> None:
    import gzip

    bomb = gzip.compress(b'{"instances": [' + b" " * 100_000 + b"]}")
    assert len(bomb) < 4096
    r = await client.post(
        "/v2/models/digits/infer",
        data=bomb,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status == 413 and "limit is 4096 bytes" in (await r.json())["error"]


async def test_server_metadata_readiness_and_the_openapi_routes(
    client: TestClient[Any, Any],
) -> None:
    meta = await (await client.get("/v2")).json()
    assert meta["name"] == "mark" and meta["extensions"] == ["binary_tensor_data"]
    r = await client.get("/v2/models/digits/ready")  # the spill function can serve it
    assert r.status == 200 and await r.json() == {"name": "digits", "ready": True}
    r = await client.get("/v2/models/nope/ready")
    assert r.status == 404 and "error" in await r.json()
    doc = await (await client.get("/openapi.json")).json()
    for path in ("/v2", "/v2/models/{name}/ready", "/v1/models/{name}", "/v2/models/{name}/infer"):
        assert path in doc["paths"], path
    infer = doc["paths"]["/v2/models/{name}/infer"]["post"]
    assert "application/octet-stream" in infer["requestBody"]["content"]


@pytest.mark.parametrize(
    ("header", "data", "needle"),
    [
        ("abc", b"{}", "must be a byte count"),
        ("100", b"{}", "the body has only 2 bytes"),
        ("2", b"{}\x00\x00", "missing or empty field"),
    ],
)
async def test_binary_header_mistakes_are_400(
    client: TestClient[Any, Any], header: str, data: bytes, needle: str
) -> None:
    r = await client.post(
        "/v2/models/digits/infer", data=data, headers={"Inference-Header-Content-Length": header}
    )
    assert r.status == 400 and needle in (await r.json())["error"]


@pytest.mark.parametrize(
    ("dtype", "lo", "hi"),
    [("float32", -3.4028234663852886e38, 3.4028234663852886e38), ("uint8", 0, 255)],
)
def test_the_openapi_values_are_bounded_to_what_the_dtype_holds(
    dtype: str, lo: float, hi: float
) -> None:
    from mark.serve.openapi import _item

    item = _item(dtype)
    assert (item["minimum"], item["maximum"]) == (lo, hi)
    assert _item("bool") == {"type": "boolean"}
