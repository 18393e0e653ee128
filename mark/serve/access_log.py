"""The endpoint's access log: one record per request on the ``mark.access`` logger.

Each record's fields go in ``extra=``, so the JSON log format (``mark.logs``) writes
one object per request: ``request_id`` (the one the answer's ``X-Request-Id`` names),
``method``, ``path``, ``status``, ``duration_ms`` (until the answer was ready),
``bytes_in`` (body bytes received), ``bytes_out`` (the answer's body), ``model``
(model routes), ``key_id``/``key_name`` (the caller's API key, once it passed
auth) and ``client``. A client that left before its answer is recorded as 499.

``api.access_log: auto`` (the default) writes it when the daemon logs JSON (a log
collector keeps it) and not to a person's terminal, where a line per request
would bury everything else; ``true``/``false`` force it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import IO, Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from mark.config import Settings
from mark.logs import REQUEST_ID, choose_format
from mark.serve.auth import CALLER
from mark.serve.body import CLIENT_CLOSED

access = logging.getLogger("mark.access")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def enabled(settings: Settings, stream: IO[str] | None = None) -> bool:
    """``api.access_log``; ``auto``: on exactly when the daemon's log lines are JSON."""
    setting = settings.api.access_log
    if setting == "auto":
        return choose_format(settings.log_format, settings.world, stream) == "json"
    return bool(setting)


def _bytes_out(response: web.StreamResponse) -> int:
    if response.prepared:  # sent already (a hang-up): what went out
        return response.body_length
    return response.content_length or 0


def record(
    request: web.Request, status: int, started: float, response: web.StreamResponse | None
) -> None:
    """Write the access record of ``request``."""
    duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
    key = request.get(CALLER)
    fields: dict[str, Any] = {
        "request_id": REQUEST_ID.get(),
        "method": request.method,
        "path": request.path,
        "status": status,
        "duration_ms": duration_ms,
        "bytes_in": request.content.total_bytes,
        "bytes_out": _bytes_out(response) if response is not None else 0,
        "model": request.match_info.get("name"),
        "key_id": key.id if key is not None else None,
        "key_name": key.name if key is not None else None,
        "client": request.remote,
    }
    access.info("%s %s %d %.1f ms", request.method, request.path, status, duration_ms, extra=fields)


def access_log(settings: Settings) -> Middleware:
    """The middleware: it records each request when ``enabled(settings)``, else passes."""
    if not enabled(settings):

        @web.middleware
        async def off(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await handler(request)

        return off

    @web.middleware
    async def on(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a redirect errors_as_json lets through
            record(request, exc.status, started, None)
            raise
        except asyncio.CancelledError:  # the server cancelled it: its client left
            record(request, CLIENT_CLOSED, started, None)
            raise
        except BaseException:
            record(request, 500, started, None)
            raise
        record(request, response.status, started, response)
        return response

    return on
