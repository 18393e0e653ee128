"""The Lambda Runtime API that the local runtimes long-poll, one listening socket per runtime.

The Runtime API carries no identity of the caller, and on AWS each execution
environment has its own endpoint; so each runtime gets its own socket on one
aiohttp application, and the port a request arrived on says which runtime sent
it. That is how an invocation goes to a chosen warm runtime and how we know which
invocation a dying runtime was holding. The routes: ``GET invocation/next``,
``POST invocation/{id}/response``, ``POST invocation/{id}/error``,
``POST init/error``; what they mean for a runtime is up to its ``RuntimeHost``.
"""

from __future__ import annotations

import json
import secrets
import socket
from typing import Protocol

from aiohttp import web

from mark.cloud.local.lambda_.events import PAYLOAD_LIMIT
from mark.cloud.local.lambda_.records import Invocation, Runtime
from mark.errors import PayloadTooLarge, RuntimeExited, SpillError, SpillFunctionError

API = "/2018-06-01/runtime"


class RuntimeHost(Protocol):
    """What the Runtime API needs from whoever runs the runtimes."""

    def runtime_at(self, port: int) -> Runtime | None:
        """The live runtime listening on ``port``, if any."""
        ...

    def init_done(self, rt: Runtime) -> None:
        """``rt`` asked for its first invocation: its init is over."""
        ...

    def deliver(self, rt: Runtime, inv: Invocation) -> None:
        """``rt`` takes ``inv`` now: start its clock."""
        ...

    def release(self, rt: Runtime) -> None:
        """``rt`` is free for another invocation."""
        ...

    def settle(
        self,
        rt: Runtime,
        inv: Invocation,
        *,
        body: bytes | None = None,
        error: SpillError | None = None,
        release: bool = True,
    ) -> None:
        """``inv`` is over: bill it and answer its caller (and free ``rt`` if ``release``)."""
        ...

    def reset(self, rt: Runtime, reason: str) -> None:
        """Kill ``rt``, whose exit will be reported with ``reason``."""
        ...


class RuntimeApi:
    """The aiohttp application behind every runtime's socket."""

    def __init__(self, host: RuntimeHost, *, function_arn: str, timeout_s: float) -> None:
        self._host = host
        self._function_arn = function_arn
        self._timeout_s = timeout_s
        self._runner: web.AppRunner | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=2 * PAYLOAD_LIMIT)
        app.router.add_get(f"{API}/invocation/next", self._next)
        app.router.add_post(f"{API}/invocation/{{request_id}}/response", self._response)
        app.router.add_post(f"{API}/invocation/{{request_id}}/error", self._error)
        app.router.add_post(f"{API}/init/error", self._init_error)
        # Every runtime is killed before cleanup, so nothing is worth waiting for.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def open_site(self) -> tuple[int, web.SockSite]:
        """A new listening socket on loopback for one runtime: its port and site."""
        assert self._runner is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            site = web.SockSite(self._runner, sock)
            await site.start()
        except BaseException:
            sock.close()
            raise
        return port, site

    def _runtime_of(self, request: web.Request) -> Runtime | None:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return self._host.runtime_at(sockname[1]) if sockname else None

    async def _next(self, request: web.Request) -> web.StreamResponse:
        """Long-poll: answer when this runtime has an invocation to run."""
        rt = self._runtime_of(request)
        if rt is None:
            return _api_error(403, "Runtime.Unknown", "no such runtime")
        if rt.current is not None:  # it moved on without answering: that answer is lost
            self._host.settle(
                rt, rt.current, error=RuntimeExited(f"Lambda runtime {rt.index} dropped it")
            )
        if not rt.ready:
            self._host.init_done(rt)
        while True:
            inv = await rt.inbox.get()
            if inv is None:
                return _api_error(410, "Runtime.Gone", "this runtime was shut down")
            if not inv.future.done():
                break
            self._host.release(rt)  # its caller gave up before the runtime took it
        self._host.deliver(rt, inv)
        deadline_ms = int((inv.started_at + self._timeout_s) * 1000)
        headers = {
            "Lambda-Runtime-Aws-Request-Id": inv.request_id,
            "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
            "Lambda-Runtime-Invoked-Function-Arn": self._function_arn,
            # awslambdaric's C extension crashes without a trace id; Lambda always sends one.
            "Lambda-Runtime-Trace-Id": _trace_id(inv.started_at),
        }
        return web.Response(body=inv.payload, headers=headers, content_type="application/json")

    def _delivered(self, request: web.Request) -> tuple[Runtime, Invocation] | None:
        rt = self._runtime_of(request)
        if rt is None or rt.current is None:
            return None
        if rt.current.request_id != request.match_info["request_id"]:
            return None
        return rt, rt.current

    async def _response(self, request: web.Request) -> web.StreamResponse:
        found = self._delivered(request)
        if found is None:
            return _api_error(400, "InvalidRequestID", "no such invocation in progress")
        rt, inv = found
        body = await request.read()
        if len(body) > PAYLOAD_LIMIT:
            error = PayloadTooLarge(
                f"reply of {len(body)} bytes is over Lambda's {PAYLOAD_LIMIT}-byte limit"
            )
            self._host.settle(rt, inv, error=error, release=False)
            # awslambdaric exits on a failed post anyway; do not hand it new work
            self._host.reset(rt, "was reset after a reply over the payload limit")
            return _api_error(413, "RequestEntityTooLarge", str(error))
        self._host.settle(rt, inv, body=body)
        return web.json_response({"status": "OK"}, status=202)

    async def _error(self, request: web.Request) -> web.StreamResponse:
        found = self._delivered(request)
        if found is None:
            return _api_error(400, "InvalidRequestID", "no such invocation in progress")
        rt, inv = found
        raw = await request.read()
        try:
            err = json.loads(raw)
        except ValueError:
            err = {}
        if not isinstance(err, dict):
            err = {}
        error_type = str(
            err.get("errorType") or request.headers.get("Lambda-Runtime-Function-Error-Type", "")
        )
        message = str(err.get("errorMessage") or raw.decode(errors="replace"))
        stack = err.get("stackTrace")
        stack_lines = [str(s) for s in stack] if isinstance(stack, list) else []
        error = SpillFunctionError(error_type or "Unhandled", message, stack_lines)
        self._host.settle(rt, inv, error=error)
        return web.json_response({"status": "OK"}, status=202)

    async def _init_error(self, request: web.Request) -> web.StreamResponse:
        rt = self._runtime_of(request)
        if rt is None:
            return _api_error(403, "Runtime.Unknown", "no such runtime")
        raw = await request.read()
        try:
            err = json.loads(raw)
        except ValueError:
            err = {}
        if isinstance(err, dict) and err:
            rt.init_error = f"{err.get('errorType', '')}: {err.get('errorMessage', '')}"
        else:
            rt.init_error = raw.decode(errors="replace")
        return web.json_response({"status": "OK"}, status=202)


def _api_error(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response({"errorType": error_type, "errorMessage": message}, status=status)


def _trace_id(now: float) -> str:
    """An X-Ray trace header in Lambda's format (root, parent, not sampled)."""
    return (
        f"Root=1-{int(now):08x}-{secrets.token_hex(12)};"
        f"Parent={secrets.token_hex(8)};Sampled=0;Lineage=1:{secrets.token_hex(4)}:0"
    )
