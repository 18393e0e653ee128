"""Reading a request body with a deadline, and telling a slow client from a gone one.

aiohttp reads a body for as long as the client keeps the connection open: a client
that sends its headers and a few of the bytes it promised would hold a connection
(and a handler) indefinitely. ``read_body`` bounds that (``api.body_read_timeout_s``):
past it the answer is 408 and the connection is closed (``hang_up``), not kept alive
for aiohttp's lingering read of the rest. A client that disconnects mid-body is its
own choice, not the daemon's fault: an INFO line, no traceback, no 5xx (status 499,
nginx's "client closed request", which nobody receives but the access log records).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from mark.logs import REQUEST_ID, REQUEST_ID_HEADER
from mark.serve.codec import BadRequest

log = logging.getLogger("mark.api")

CLIENT_CLOSED = 499
"""The status recorded for a request whose client left before its answer."""


class BodyTimeout(BadRequest):
    """The body did not arrive within the read timeout: 408, then the connection closes."""

    def __init__(self, message: str) -> None:
        super().__init__(408, message)


class ClientGone(BadRequest):
    """The client closed its connection before its body arrived."""

    def __init__(self, message: str) -> None:
        super().__init__(CLIENT_CLOSED, message)


def _got(request: web.Request) -> str:
    got = request.content.total_bytes
    promised = request.content_length
    return f"{got} of {promised} bytes" if promised is not None else f"{got} bytes"


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, within ``timeout_s`` of the call; ``BodyTimeout`` (408) past it,
    ``ClientGone`` (499) when the client disconnects first. Bodies over the app's
    ``client_max_size`` still raise aiohttp's 413."""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        got = _got(request)
        log.info(
            "%s %s: body not complete in %g s (%s)", request.method, request.path, timeout_s, got
        )
        raise BodyTimeout(f"request body not complete within {timeout_s:g} s: got {got}") from None
    except ConnectionError:  # ConnectionResetError, aiohttp's ClientConnectionResetError
        got = _got(request)
        log.info("%s %s: client disconnected mid-body (%s)", request.method, request.path, got)
        raise ClientGone(f"the client disconnected after {got}") from None
    except asyncio.CancelledError:
        # The server cancels a handler whose client is gone (``handler_cancellation``).
        log.info(
            "%s %s: client disconnected mid-body (%s)", request.method, request.path, _got(request)
        )
        raise


async def hang_up(request: web.Request, response: web.Response) -> web.StreamResponse:
    """Send ``response`` now and close the connection: the unread rest of a body that
    timed out must not keep it open (aiohttp would otherwise linger reading it)."""
    response.force_close()
    rid = REQUEST_ID.get()
    if rid is not None:  # request_ids names an unprepared answer only
        response.headers[REQUEST_ID_HEADER] = rid
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass  # the client left meanwhile: nothing to send it
    finally:
        request.protocol.force_close()
    return response
