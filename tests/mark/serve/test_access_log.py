"""The access log: one ``mark.access`` record per request naming its id, status, model
and key; none when ``api.access_log`` is off; ``auto`` on exactly when logs are JSON."""

from __future__ import annotations

import io
import json
import logging
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mark.config import load_settings
from mark.logs import REQUEST_ID_HEADER, JsonFormatter
from mark.serve.access_log import enabled
from mark.serve.auth import KeyCache, issue
from mark.serve.endpoint import Served, build_app


def _access(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "mark.access"]


async def _client(access_log: bool | str) -> tuple[TestClient[Any, Any], str]:
    settings = load_settings(overrides={"api": {"access_log": access_log}})
    spec = settings.models[0]
    key, token = issue("loadgen", ["inference"], time.time())
    app = build_app(settings, {spec.name: Served(spec, None, None)}, keys=KeyCache.fixed([key]))
    client = TestClient(TestServer(app), headers={"Authorization": f"Bearer {token}"})
    await client.start_server()
    return client, key.id


async def test_each_request_gets_one_record_with_its_id_status_model_and_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    client, key_id = await _client(True)
    try:
        r = await client.get("/v1/models/digits", headers={REQUEST_ID_HEADER: "abc-1"})
        assert r.status == 200
        (rec,) = _access(caplog)
        assert rec.request_id == "abc-1" == r.headers[REQUEST_ID_HEADER]  # type: ignore[attr-defined]
        fields = json.loads(JsonFormatter().format(rec))  # the line a collector gets
        assert fields["logger"] == "mark.access"
        assert {k: fields[k] for k in ("method", "path", "status", "model", "key_id")} == {
            "method": "GET",
            "path": "/v1/models/digits",
            "status": 200,
            "model": "digits",
            "key_id": key_id,
        }
        assert fields["key_name"] == "loadgen" and fields["bytes_out"] == r.content_length
        assert fields["duration_ms"] >= 0 and fields["client"] == "127.0.0.1"

        caplog.clear()
        r = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        (rec,) = _access(caplog)  # refused by auth: still one record, its id, no key
        assert r.status == 401 and rec.status == 401  # type: ignore[attr-defined]
        assert rec.request_id == r.headers[REQUEST_ID_HEADER]  # type: ignore[attr-defined]
        assert rec.key_id is None  # type: ignore[attr-defined]
    finally:
        await client.close()


async def test_no_record_when_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    client, _ = await _client(False)
    try:
        assert (await client.get("/v1/models/digits")).status == 200
        assert _access(caplog) == []
    finally:
        await client.close()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_off_on_a_terminal_and_on_for_a_collector() -> None:
    auto = load_settings()
    assert auto.api.access_log == "auto"
    assert not enabled(auto, _Tty())  # text to a person: no line per request
    assert enabled(auto, io.StringIO())  # JSON to a collector
    assert enabled(load_settings(overrides={"api": {"access_log": True}}), _Tty())
    as_json = load_settings(overrides={"log_format": "json"})
    assert enabled(as_json, _Tty())
