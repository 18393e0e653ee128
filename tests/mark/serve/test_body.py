"""Request bodies on the real aiohttp server, from a raw socket client: a body slower
than ``api.body_read_timeout_s`` gets 408 and its connection closed; a client that
disconnects mid-body is logged at INFO, recorded as 499, and never turned into a 500."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from mark.config import load_settings
from mark.serve.endpoint import Served, build_app

TIMEOUT_S = 0.5
SLACK_S = 5.0
"""Generous: the bound proves "cut off near the timeout", not "after aiohttp's 10 s
lingering" or "never"; a busy 2-core machine must not make it flaky."""
PROMISED = 1000


@pytest.fixture(params=[False, True], ids=["as-the-daemon-runs", "handler-cancellation"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, int]]:
    """The app on a real socket: the daemon's server settings (a gone client's body read
    fails with ConnectionResetError), or with aiohttp's handler cancellation (the
    handler is cancelled instead)."""
    settings = load_settings(
        overrides={"api": {"auth": False, "body_read_timeout_s": TIMEOUT_S, "access_log": True}}
    )
    spec = settings.models[0]
    # No dispatcher: the body is read (and times out) before anything would run.
    app = build_app(settings, {spec.name: Served(spec, None, None)})
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, handler_cancellation=request.param
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield str(host), int(port)
    finally:
        await runner.cleanup()


async def _send_partial(
    address: tuple[str, int],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Headers promising ``PROMISED`` body bytes, and 10 of them."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(
        b"POST /v1/models/digits:predict HTTP/1.1\r\n"
        b"Host: test\r\nContent-Type: application/json\r\nX-Request-Id: slow-1\r\n"
        + f"Content-Length: {PROMISED}\r\n\r\n".encode()
        + b'{"instanc'
        + b"e"
    )
    await writer.drain()
    return reader, writer


class _Recorded(logging.Handler):
    """Sets ``event`` on the first record it handles."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def _access(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "mark.access"]


async def test_a_slow_body_gets_408_and_is_cut_off_within_the_timeout(
    server: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    start = time.monotonic()
    reader, writer = await _send_partial(server)
    try:
        # Everything until the server closes the connection: the 408 and then EOF.
        answer = await asyncio.wait_for(reader.read(), TIMEOUT_S + SLACK_S)
    finally:
        writer.close()
    elapsed = time.monotonic() - start
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"x-request-id: slow-1" in head.lower()
    assert b"0.5 s" in body and f"got 10 of {PROMISED} bytes".encode() in body
    assert elapsed < TIMEOUT_S + SLACK_S
    assert _errors(caplog) == []
    (rec,) = _access(caplog)
    assert (rec.status, rec.request_id, rec.bytes_in) == (408, "slow-1", 10)  # type: ignore[attr-defined]


async def test_a_client_gone_mid_body_is_info_not_a_logged_500(
    server: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    recorded = _Recorded()
    logging.getLogger("mark.access").addHandler(recorded)
    try:
        _, writer = await _send_partial(server)
        await asyncio.sleep(0.05)  # the server has the headers and is reading the body
        writer.transport.abort()  # a reset, as a crashed or impatient client leaves
        await asyncio.wait_for(recorded.event.wait(), SLACK_S)
    finally:
        logging.getLogger("mark.access").removeHandler(recorded)
    (rec,) = _access(caplog)
    assert rec.status == 499  # type: ignore[attr-defined]
    assert any("client disconnected mid-body" in r.getMessage() for r in caplog.records)
    assert _errors(caplog) == []
