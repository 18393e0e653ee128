"""API keys on the endpoint: 401 without a valid key, 403 without the scope, 429 over a
key's limits; the health checks open; keys read from a real store, revoked within a
refresh, kept through a store outage; the token bucket's rule on explicit times."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import stat
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bouncer.wire import SERVED_BY_HEADER
from mark.config import Settings, load_settings
from mark.ports import SpillResult
from mark.serve import auth
from mark.serve.auth import (
    AUTH,
    KEY_FILE,
    Bucket,
    KeyCache,
    first_key,
    grants,
    issue,
    parse_scopes,
    take,
)
from mark.serve.dispatcher import Dispatcher
from mark.serve.endpoint import Served, build_app
from mark.serve.openapi import openapi_document
from mark.serve.telemetry import Telemetry
from mark.state import ApiKeyRecord, open_store

ZERO = [[[0.0] * 8] * 8]
PREDICT = "/v1/models/digits:predict"


class Gate:
    """A Serverless port answering each instance's sum once ``open`` is set."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.entered = asyncio.Event()

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        self.entered.set()
        await self.open.wait()
        return SpillResult([[float(np.sum(x))] for x in batch], 1.0, 1, 128, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


class Api:
    def __init__(
        self, client: TestClient[web.Request, web.Application], gate: Gate, settings: Settings
    ) -> None:
        self.client, self.gate, self.settings = client, gate, settings

    def clock(self, at: list[float]) -> None:
        """Drive the limiter's clock by hand."""
        self.client.app[AUTH].clock = lambda: at[0]

    async def get(
        self, path: str, token: str | None = None, header: str = "Authorization"
    ) -> aiohttp.ClientResponse:
        return await self.client.get(path, headers=_headers(token, header))

    async def predict(
        self, token: str | None, header: str = "Authorization"
    ) -> aiohttp.ClientResponse:
        return await self.client.post(
            PREDICT, json={"instances": [ZERO]}, headers=_headers(token, header)
        )


def _headers(token: str | None, header: str) -> dict[str, str]:
    if token is None:
        return {}
    return {header: f"Bearer {token}" if header == "Authorization" else token}


@asynccontextmanager
async def _api(keys: KeyCache, **api: Any) -> AsyncIterator[Api]:
    settings = load_settings(overrides={"api": api})
    spec = settings.models[0]
    gate = Gate()
    async with aiohttp.ClientSession() as session:
        tel = Telemetry(spec.name, spec.slo.rt_max_ms)
        disp = Dispatcher(spec.name, 10.0, "float32", time.time, session, gate, tel)
        disp.start()
        app = build_app(settings, {spec.name: Served(spec, disp, tel)}, keys=keys)
        async with TestClient(TestServer(app)) as c:
            yield Api(c, gate, settings)
        gate.open.set()
        await disp.close()


KEYS = {
    "inference": issue("client", ["inference"], 1.0),
    "metrics": issue("scraper", ["metrics"], 1.0),
    "admin": issue("operator", ["inference", "admin"], 1.0),
    "admin-only": issue("ops", ["admin"], 1.0),
    "slow": issue("slow", ["inference"], 1.0, rate_rps=1.0),
    "one": issue("one", ["inference"], 1.0, max_concurrency=1),
}


def token(name: str) -> str:
    return KEYS[name][1]


def every_key() -> KeyCache:
    return KeyCache.fixed(rec for rec, _ in KEYS.values())


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with _api(every_key()) as a:
        yield a


# -- who may call what ---------------------------------------------------------------


async def test_no_key_is_401_with_a_bearer_challenge_and_a_json_error(api: Api) -> None:
    for path in ("/v2", "/v2/models/digits", "/v1/models", "/openapi.json", "/metrics", "/nope"):
        r = await api.get(path)
        assert r.status == 401, path
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert "API key is required" in (await r.json())["error"]
    r = await api.predict(None)
    assert r.status == 401 and "error" in await r.json()
    assert api.gate.entered.is_set() is False  # nothing reached the spill function


@pytest.mark.parametrize(
    "bad",
    [
        "nonsense",
        "mark_",
        "mark_abc",
        "mark_0000000000_" + "0" * 64,  # unknown id
        pytest.param(
            token("inference")[:-1] + ("0" if token("inference")[-1] != "0" else "1"),
            id="wrong-secret",  # the key is made at import: its text differs run to run
        ),
    ],
)
async def test_a_mistyped_or_unknown_key_is_401(api: Api, bad: str) -> None:
    r = await api.predict(bad)
    assert r.status == 401 and 'error="invalid_token"' in r.headers["WWW-Authenticate"]
    assert "not valid" in (await r.json())["error"]


async def test_the_health_checks_are_open_and_say_nothing_else(api: Api) -> None:
    for t in (None, "mark_bogus_x"):
        live = await api.get("/v2/health/live", t)
        assert live.status == 200 and await live.json() == {"live": True}
        ready = await api.get("/v2/health/ready", t)
        assert ready.status == 200 and await ready.json() == {"ready": True}


async def test_scopes_inference_metrics_and_admin(api: Api) -> None:
    assert (await api.predict(token("inference"))).status == 200
    assert (await api.get("/v2/models/digits", token("inference"))).status == 200
    assert (await api.get("/openapi.json", token("inference"))).status == 200
    r = await api.get("/metrics", token("inference"))
    assert r.status == 403 and "'metrics' scope" in (await r.json())["error"]
    scraped = await api.get("/metrics", token("metrics"))
    assert scraped.status == 200 and "mark_requests_total" in await scraped.text()
    r = await api.predict(token("metrics"))
    assert r.status == 403 and "'inference' scope" in (await r.json())["error"]
    assert (await api.get("/metrics", token("admin-only"))).status == 200  # admin implies metrics
    assert (await api.predict(token("admin-only"))).status == 403  # but not inference
    refusals = await (await api.get("/metrics", token("metrics"))).text()
    assert f'mark_api_refused_total{{status="403",key="{KEYS["metrics"][0].id}"}} 1' in refusals
    assert f'mark_api_refused_total{{status="403",key="{KEYS["inference"][0].id}"}} 1' in refusals


async def test_x_api_key_is_accepted_too(api: Api) -> None:
    r = await api.predict(token("inference"), header="X-Api-Key")
    assert r.status == 200 and (await r.json())["predictions"] == [[0.0]]


async def test_who_served_a_request_is_told_to_admin_keys_only(api: Api) -> None:
    plain = await api.predict(token("inference"))
    assert plain.status == 200 and SERVED_BY_HEADER not in plain.headers
    body = {
        "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}]
    }
    v2 = await api.client.post(
        "/v2/models/digits/infer", json=body, headers=_headers(token("inference"), "Authorization")
    )
    assert v2.status == 200 and SERVED_BY_HEADER not in v2.headers
    assert "served_by" not in str(await v2.json())
    admin = await api.predict(token("admin"))
    assert admin.status == 200 and admin.headers[SERVED_BY_HEADER] == "lambda"


async def test_the_secret_is_compared_in_constant_time(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[object, object]] = []
    # auth calls hmac.compare_digest through the hmac module: patched there, it is seen.
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert (await api.predict(token("inference"))).status == 200
    rec = KEYS["inference"][0]
    assert seen == [
        (hashlib.sha256(token("inference").split("_", 2)[2].encode()).hexdigest(), rec.hash)
    ]


# -- limits ------------------------------------------------------------------------------


async def test_over_the_rate_is_429_with_retry_after(api: Api) -> None:
    now = [100.0]
    api.clock(now)
    assert (await api.predict(token("slow"))).status == 200  # a full bucket: one token
    r = await api.predict(token("slow"))
    assert r.status == 429 and r.headers["Retry-After"] == "1"
    assert "1 request(s) per second" in (await r.json())["error"]
    assert (await api.predict(token("inference"))).status == 200  # other keys are not slowed
    now[0] += 1.0
    assert (await api.predict(token("slow"))).status == 200
    assert (await api.predict(None)).status == 401
    text = await (await api.get("/metrics", token("metrics"))).text()
    assert f'mark_api_refused_total{{status="429",key="{KEYS["slow"][0].id}"}} 1' in text
    assert 'mark_api_refused_total{status="401",key=""} 1' in text


async def test_over_the_concurrency_cap_is_429_with_retry_after(api: Api) -> None:
    api.gate.open.clear()
    first = asyncio.create_task(api.predict(token("one")))
    await asyncio.wait_for(api.gate.entered.wait(), 5)
    r = await api.predict(token("one"))
    assert r.status == 429 and r.headers["Retry-After"] == "1"
    assert "1 request(s) in flight" in (await r.json())["error"]
    api.gate.open.set()
    assert (await first).status == 200
    assert (await api.predict(token("one"))).status == 200  # the slot is free again


async def test_keys_without_limits_take_the_configured_defaults() -> None:
    async with _api(every_key(), default_rate_rps=2.0, burst_s=1.0) as a:
        a.clock([5.0])
        codes = [(await a.predict(token("inference"))).status for _ in range(3)]
        assert codes == [200, 200, 429]


def test_the_token_bucket_rule_on_explicit_times() -> None:
    b, wait = take(None, rate=2.0, capacity=2.0, now=10.0)  # a new bucket is full
    assert (b, wait) == (Bucket(1.0, 10.0), 0.0)
    b, wait = take(b, 2.0, 2.0, 10.0)
    assert (b, wait) == (Bucket(0.0, 10.0), 0.0)
    refused, wait = take(b, 2.0, 2.0, 10.25)  # half a token back: not enough
    assert refused == Bucket(0.5, 10.25) and wait == pytest.approx(0.25)
    b, wait = take(refused, 2.0, 2.0, 10.5)
    assert wait == 0.0 and b.tokens == pytest.approx(0.0)
    b, _ = take(b, 2.0, 2.0, 1000.0)  # a long pause refills to the capacity, no more
    assert b.tokens == pytest.approx(1.0)
    b, wait = take(Bucket(0.0, 50.0), 1.0, 0.1, 49.0)  # a clock going back refills nothing
    assert wait == pytest.approx(1.0) and b.tokens == 0.0
    assert take(None, 0.5, 0.1, 0.0)[1] == 0.0  # the capacity is at least one request
    assert auth.retry_after(0.01) == "1" and auth.retry_after(2.2) == "3"


# -- keys ---------------------------------------------------------------------------


def test_a_key_is_mark_id_secret_with_256_random_bits_stored_as_sha256() -> None:
    rec, tok = issue("n", ["metrics", "inference"], 7.0, rate_rps=3.0, max_concurrency=2)
    prefix, key_id, secret = tok.split("_", 2)
    assert prefix == "mark" and key_id == rec.id and len(secret) == 64
    assert int(secret, 16) >= 0 and len(bytes.fromhex(secret)) * 8 == 256
    assert rec.hash == hashlib.sha256(secret.encode()).hexdigest() and secret not in repr(rec)
    assert rec.scopes == ("inference", "metrics") and rec.created_at == 7.0
    assert (rec.rate_rps, rec.max_concurrency, rec.revoked_at) == (3.0, 2, None)
    assert issue("n", ["inference"], 0.0)[1] != tok


def test_scopes_parse_and_imply() -> None:
    assert parse_scopes("admin, inference") == ("inference", "admin")
    with pytest.raises(ValueError, match="unknown scope root; allowed: inference, metrics, admin"):
        parse_scopes("inference,root")
    with pytest.raises(ValueError, match="at least one scope"):
        parse_scopes(" , ")
    assert grants(("admin",), "metrics") and grants(("admin",), "admin")
    assert not grants(("admin",), "inference") and not grants(("metrics",), "admin")


async def test_keys_from_a_real_store_a_revoke_within_a_refresh_an_outage_keeps_them(
    sqlite_url: str,
) -> None:
    store = await open_store(sqlite_url, upgrade=True)
    try:
        rec, tok = await auth.create_key(store, "app", ["inference"], time.time())
        failing = {"on": False}

        async def load() -> list[ApiKeyRecord]:
            if failing["on"]:
                raise OSError("database unreachable")
            return await store.api_keys(active_only=True)

        cache = KeyCache(load)
        await cache.refresh()
        async with _api(cache) as a:
            assert (await a.predict(tok)).status == 200
            failing["on"] = True
            await cache.refresh()  # the store is down: the last good keys stay
            assert (await a.predict(tok)).status == 200
            failing["on"] = False
            await store.revoke_api_key(rec.id, time.time())
            assert (await a.predict(tok)).status == 200  # until the next refresh
            await cache.refresh()
            r = await a.predict(tok)
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    finally:
        await store.close()


async def test_refresh_runs_on_its_period(sqlite_url: str) -> None:
    store = await open_store(sqlite_url, upgrade=True)
    try:
        cache = KeyCache.of_store(store)
        task = asyncio.create_task(cache.run(0.05))
        rec, _ = await auth.create_key(store, "late", ["inference"], time.time())
        for _ in range(100):
            if cache.get(rec.id) is not None:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        assert cache.get(rec.id) == rec
    finally:
        await store.close()


async def test_no_keys_given_means_no_key_is_valid() -> None:
    async with _api(KeyCache()) as a:
        assert (await a.predict(token("inference"))).status == 401
        assert (await a.get("/v2/health/ready")).status == 200


async def test_auth_off_needs_no_key_and_says_who_served() -> None:
    async with _api(KeyCache(), auth=False) as a:
        r = await a.predict(None)
        assert r.status == 200 and r.headers[SERVED_BY_HEADER] == "lambda"
        assert (await a.get("/metrics")).status == 200


async def test_auth_off_is_a_warning_at_start(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from mark.daemon import _api_keys

    store = await open_store(sqlite_url, upgrade=True)
    try:
        with caplog.at_level(logging.WARNING, logger="mark.daemon"):
            keys, key = await _api_keys(load_settings(overrides={"api": {"auth": False}}), store, 0)
        assert (keys, key) == (None, None) and await store.api_keys() == []
        assert "api.auth is false" in caplog.text
    finally:
        await store.close()


async def test_the_first_key_is_made_once_saved_0600_and_reused(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = await open_store(sqlite_url, upgrade=True)
    data = tmp_path / "data"
    try:
        tok = await first_key(store, data, 10.0)
        assert tok is not None and (data / KEY_FILE).read_text().strip() == tok
        assert stat.S_IMODE((data / KEY_FILE).stat().st_mode) == 0o600
        (rec,) = await store.api_keys()
        assert rec.scopes == ("inference", "metrics") and rec.name == "mark up"
        assert await first_key(store, data, 20.0) == tok  # a restart: the same key
        assert len(await store.api_keys()) == 1
        other = tmp_path / "elsewhere"
        assert await first_key(store, other, 30.0) is None  # keys exist, none saved there
        assert not (other / KEY_FILE).exists()
        await store.revoke_api_key(rec.id, 40.0)
        fresh = await first_key(store, data, 50.0)  # this store revoked it: a new one
        assert fresh is not None and fresh != tok
        assert (data / KEY_FILE).read_text().strip() == fresh
        assert stat.S_IMODE((data / KEY_FILE).stat().st_mode) == 0o600
    finally:
        await store.close()


async def test_a_fresh_store_beside_the_data_dir_adopts_its_saved_key(tmp_path: Path) -> None:
    """The ramp demo's own store must not replace the key `mark up`'s store uses."""
    data = tmp_path / "data"
    main = await open_store(f"sqlite+aiosqlite:///{tmp_path}/main.db", upgrade=True)
    other = await open_store(f"sqlite+aiosqlite:///{tmp_path}/other.db", upgrade=True)
    try:
        tok = await first_key(main, data, 1.0)
        assert tok is not None
        assert await first_key(other, data, 2.0) == tok  # recorded there, file untouched
        (adopted,) = await other.api_keys()
        (original,) = await main.api_keys()
        assert (adopted.id, adopted.hash, adopted.scopes) == (
            original.id,
            original.hash,
            original.scopes,
        )
        assert await first_key(main, data, 3.0) == tok
        (data / KEY_FILE).write_text("mark_abc_tooshort\n")  # not one `issue` made: not adopted
        third = await open_store(f"sqlite+aiosqlite:///{tmp_path}/third.db", upgrade=True)
        try:
            made = await first_key(third, data, 4.0)
            assert made is not None and made != "mark_abc_tooshort"
        finally:
            await third.close()
    finally:
        await main.close()
        await other.close()


def test_the_openapi_document_declares_the_key() -> None:
    doc = openapi_document(load_settings())
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-Api-Key"}
    assert doc["security"] == [{"bearer": []}, {"apiKey": []}]
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert doc["paths"][path]["get"]["security"] == []
    infer = doc["paths"]["/v2/models/{name}/infer"]["post"]
    assert {"401", "403", "429"} <= set(infer["responses"]) and "security" not in infer
    assert "Retry-After" in infer["responses"]["429"]["headers"]
    off = openapi_document(load_settings(overrides={"api": {"auth": False}}))
    assert "security" not in off and "components" not in off
