"""The local world's Lambda: a Runtime API server of our own driving real awslambdaric runtimes.

Why not call the handler in-process? Because the spill path must behave as it
will on AWS: the handler runs in a separate process under the real Lambda
runtime interface client (``python -m awslambdaric lambda_handlers.spill.handler``),
which long-polls ``GET /2018-06-01/runtime/invocation/next`` and posts the
result or error back. So the event and reply go through JSON exactly as on AWS,
a cold start costs what it costs (a Python start and a torch import), and a
crashing or hanging handler is a dead or killed process, not an exception.

Each runtime gets its own listening socket on one aiohttp application. The
Runtime API carries no identity of the caller, and on AWS each execution
environment has its own endpoint; one port per runtime lets us route an
invocation to a chosen warm runtime and know which invocation a dying runtime
was holding.

The pool: ``invoke`` takes an idle (warm) runtime, the most recently used
first; if none is idle and fewer than ``max_concurrency`` exist, it starts a
new one (a cold start, counted); otherwise it queues in FIFO order for at most
``queue_timeout_s`` and then fails as throttled, as Lambda's concurrency limit
does. Nothing waits forever: a runtime that does not finish init in
``init_timeout_s`` or an invocation that runs past ``timeout_s`` is killed and
its caller gets an explicit error; a runtime that dies fails what it held.

Billing follows AWS: each invocation's duration (plus, on a cold start, the
init duration, which AWS bills since August 2025) rounded up to the
millisecond, times the configured memory, plus the per-request fee, priced by
``mark.billing.lambda_charge`` from the catalog. Not emulated: the memory
limit itself (CPU share is, roughly, through the thread count), idle runtimes
being reclaimed after some minutes, and the 10-second init limit (a torch
import on a busy laptop can exceed it; ``init_timeout_s`` defaults to 60).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import sys
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from mark.billing import LambdaCharge, LambdaCharges, gb_second_rate, lambda_charge
from mark.catalog import LambdaPrices, load_catalog
from mark.errors import CloudError, Throttled
from mark.ports import SpillResult
from mark.state.records import LedgerEntry

log = logging.getLogger(__name__)

API = "/2018-06-01/runtime"
DEFAULT_HANDLER = "lambda_handlers.spill.handler"
PAYLOAD_LIMIT = 6 * 1024 * 1024  # synchronous invoke: request and response, as on AWS
ACCOUNT_ID = "123456789012"
MB_PER_VCPU = 1769  # Lambda allocates one vCPU's worth of CPU per 1,769 MB
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
_TAIL_BYTES = 4096
_ROOT = Path(__file__).resolve().parents[3]  # holds both `mark` and `lambda_handlers`


class SpillError(CloudError):
    """The spill function did not return outputs; the message says why."""


class SpillRejected(SpillError):
    """The handler answered ``{"error": ...}``: the batch or model name is wrong, not the system."""


class FunctionError(SpillError):
    """The handler raised: Lambda's "Unhandled" function error, with its type and stack."""

    def __init__(self, error_type: str, message: str, stack: Sequence[str] = ()) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.stack = list(stack)


class RuntimeExited(SpillError):
    """The runtime process died (or failed its init) while holding the invocation."""


class SpillTimeout(SpillError):
    """The invocation ran past the function timeout; its runtime was killed, as on AWS."""


class SpillThrottled(SpillError, Throttled):
    """Every runtime was busy at the concurrency limit for longer than the queue allows."""


class PayloadTooLarge(SpillError):
    """Event or reply over Lambda's 6 MB synchronous payload limit."""


@dataclass(frozen=True, slots=True)
class LambdaUsage:
    """What the local Lambda has run and what AWS would charge for it, since it started."""

    requests: int
    errors: int
    cold_starts: int
    duration_ms: float
    billed_ms: int
    gb_seconds: float
    cost: float


@dataclass(frozen=True, slots=True)
class _Done:
    body: bytes
    duration_ms: float
    billed_ms: int
    cold: bool


@dataclass(eq=False)
class _Invocation:
    request_id: str
    model: str
    payload: bytes
    future: asyncio.Future[_Done]
    delivered: float = 0.0  # perf_counter when the runtime took it
    started_at: float = 0.0  # wall clock, for the ledger
    cold: bool = False
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class _Runtime:
    index: int
    port: int
    site: web.SockSite
    inbox: asyncio.Queue[_Invocation | None] = field(default_factory=asyncio.Queue)
    proc: asyncio.subprocess.Process | None = None
    spawned: float = 0.0
    ready: bool = False  # has asked for its first invocation: init is over
    init_ms: float = 0.0
    served: int = 0
    current: _Invocation | None = None
    dead: bool = False
    exit_reason: str | None = None
    init_error: str | None = None
    tail: bytearray = field(default_factory=bytearray)
    watcher: asyncio.Task[None] | None = None
    init_timer: asyncio.TimerHandle | None = None


class LocalLambda:
    """The ``Serverless`` port of the local world: a pool of real awslambdaric runtimes.

    ``models`` maps a model name to its source (TorchScript path or
    ``pkg.mod:factory``); it is sent in each event so one function serves every
    model, as the spill handler expects.
    """

    def __init__(
        self,
        models: Mapping[str, str] | None = None,
        *,
        handler: str = DEFAULT_HANDLER,
        function_name: str = "mark-spill",
        memory_mb: int = 2048,
        timeout_s: float = 30.0,
        init_timeout_s: float = 60.0,
        max_concurrency: int = 4,
        queue_timeout_s: float | None = None,
        region: str = "us-east-1",
        arch: str = "x86_64",
        prices: LambdaPrices | None = None,
        bill_init: bool = True,
        python: str = sys.executable,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not 128 <= memory_mb <= 10240:
            raise ValueError(f"memory_mb must be within Lambda's 128..10240, got {memory_mb}")
        if timeout_s <= 0 or init_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self.init_timeout_s = init_timeout_s
        self.max_concurrency = max_concurrency
        self.queue_timeout_s = timeout_s if queue_timeout_s is None else queue_timeout_s
        self.function_name = function_name
        self.function_arn = f"arn:aws:lambda:{region}:{ACCOUNT_ID}:function:{function_name}"
        self._models = {name: _absolute_source(src) for name, src in (models or {}).items()}
        self._handler = handler
        self._region = region
        self._arch = arch
        self._prices = prices if prices is not None else load_catalog().lambda_prices
        self._bill_init = bill_init
        self._python = python
        self._cwd = cwd if cwd is not None else _ROOT
        self._extra_env = dict(env or {})

        self._runner: web.AppRunner | None = None
        self._by_port: dict[int, _Runtime] = {}
        self._idle: list[_Runtime] = []  # a stack: reuse the most recently used runtime
        self._waiters: deque[asyncio.Future[_Runtime | None]] = deque()
        self._live = 0  # runtimes started or starting and not dead (and reserved spawns)
        self._spawned = 0
        self._closed = False

        self._requests = 0
        self._errors = 0
        self._duration_ms = 0.0
        self._billed_ms = 0
        self._gb_seconds = 0.0
        self._cost = 0.0
        self._charges = LambdaCharges(gb_second_rate(self._prices, self._arch))

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Set up the Runtime API application; runtimes start on demand."""
        if self._runner is not None:
            return
        app = web.Application(client_max_size=2 * PAYLOAD_LIMIT)
        app.router.add_get(f"{API}/invocation/next", self._next)
        app.router.add_post(f"{API}/invocation/{{request_id}}/response", self._response)
        app.router.add_post(f"{API}/invocation/{{request_id}}/error", self._error)
        app.router.add_post(f"{API}/init/error", self._init_error)
        # close() has killed every runtime before cleanup, so nothing is worth waiting for.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner

    async def close(self) -> None:
        """Kill every runtime (their whole process groups), fail what waits, stop serving."""
        if self._closed:
            return
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(SpillError("the local Lambda was closed"))
        runtimes = list(self._by_port.values())
        for rt in runtimes:
            rt.exit_reason = rt.exit_reason or "the local Lambda was closed"
            _kill(rt)
        watchers = [rt.watcher for rt in runtimes if rt.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=10.0)
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> LocalLambda:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- the Serverless port -------------------------------------------------------------

    async def invoke(self, model: str, batch: Sequence[Any]) -> SpillResult:
        """Run one batch on a runtime (warm if one is idle); raise a ``SpillError`` otherwise."""
        done = await self._run(model, self._event(model, [_plain(x) for x in batch]))
        return self._result(model, done)

    async def warm_up(self, model: str, concurrency: int) -> None:
        """Make ``concurrency`` runtimes (at most the limit) warm with ``model`` loaded.

        Idle runtimes are pinged and new ones started up to the target, all at
        once and each with its own ping, so that many distinct runtimes end up
        warm; runtimes busy serving count as warm and are left alone.
        """
        target = min(concurrency, self.max_concurrency)
        busy = self._live - len(self._idle)
        taken: list[_Runtime] = []
        while len(taken) + busy < target:
            rt = await self._acquire(wait=False)
            if rt is None:
                break
            taken.append(rt)
        if not taken:
            return
        payload = self._event(model, [])
        results = await asyncio.gather(
            *(self._dispatch_to(rt, model, payload) for rt in taken), return_exceptions=True
        )
        for res in results:
            if isinstance(res, BaseException):
                raise res
            self._result(model, res)  # raises if the handler could not load the model

    # ---- accounting ----------------------------------------------------------------------

    @property
    def cold_starts(self) -> int:
        """Runtimes started so far (each one's first invocation is a cold start)."""
        return self._spawned

    @property
    def runtimes(self) -> int:
        """Runtimes alive now (starting, idle or busy)."""
        return sum(1 for rt in self._by_port.values() if not rt.dead)

    def child_pids(self) -> list[int]:
        """Process ids of the runtimes alive now."""
        return [
            rt.proc.pid
            for rt in self._by_port.values()
            if rt.proc is not None and rt.proc.returncode is None
        ]

    def usage(self) -> LambdaUsage:
        """Totals since start: requests, errors, cold starts, billed duration, GB-s, cost."""
        return LambdaUsage(
            requests=self._requests,
            errors=self._errors,
            cold_starts=self._spawned,
            duration_ms=self._duration_ms,
            billed_ms=self._billed_ms,
            gb_seconds=self._gb_seconds,
            cost=self._cost,
        )

    def take_charges(self) -> list[LedgerEntry]:
        """Charges since the last call, one ledger entry per model, for ``Store.add_charges``."""
        return self._charges.take()

    # ---- invocations ---------------------------------------------------------------------

    def _event(self, model: str, instances: list[Any]) -> bytes:
        event: dict[str, Any] = {"model": model, "instances": instances}
        source = self._models.get(model)
        if source is not None:
            event["source"] = source
        try:
            payload = json.dumps(event, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise SpillRejected(f"the batch for {model!r} is not JSON-serialisable: {exc}") from exc
        if len(payload) > PAYLOAD_LIMIT:
            raise PayloadTooLarge(
                f"event of {len(payload)} bytes is over Lambda's {PAYLOAD_LIMIT}-byte limit"
            )
        return payload

    async def _run(self, model: str, payload: bytes) -> _Done:
        rt = await self._acquire(wait=True)
        assert rt is not None
        return await self._dispatch_to(rt, model, payload)

    async def _dispatch_to(self, rt: _Runtime, model: str, payload: bytes) -> _Done:
        """Hand the event to a reserved runtime and wait; the platform's timers bound the wait."""
        loop = asyncio.get_running_loop()
        inv = _Invocation(str(uuid.uuid4()), model, payload, loop.create_future())
        rt.inbox.put_nowait(inv)
        # Init and invocation timeouts kill the runtime, whose death settles the future;
        # this outer bound only guards against a bug in that machinery.
        guard = self.init_timeout_s + self.timeout_s + 10.0
        try:
            return await asyncio.wait_for(asyncio.shield(inv.future), guard)
        except TimeoutError:
            rt.exit_reason = "the invocation was lost (no reply and no exit)"
            _kill(rt)
            raise SpillTimeout(f"no reply from runtime {rt.index} within {guard:.0f} s") from None
        except asyncio.CancelledError:
            inv.future.cancel()  # undelivered: the runtime skips it; delivered: reply is dropped
            raise

    def _result(self, model: str, done: _Done) -> SpillResult:
        try:
            reply = json.loads(done.body)
        except ValueError:
            raise SpillError(f"the spill function's reply for {model!r} is not JSON") from None
        if not isinstance(reply, dict):
            raise SpillError(f"the spill function replied {type(reply).__name__}, not an object")
        if "error" in reply:
            raise SpillRejected(f"{model}: {reply['error']}")
        outputs = reply.get("outputs")
        if not isinstance(outputs, list):
            raise SpillError(f"the spill function's reply for {model!r} has no 'outputs' list")
        cold = done.cold or bool(reply.get("cold_start", False))
        return SpillResult(outputs, done.duration_ms, done.billed_ms, self.memory_mb, cold)

    # ---- the pool ------------------------------------------------------------------------

    async def _acquire(self, *, wait: bool) -> _Runtime | None:
        """Reserve a runtime: idle, else a new one under the limit, else queue (if ``wait``)."""
        if self._closed or self._runner is None:
            raise SpillError("the local Lambda is not running (call start())")
        while self._idle:
            rt = self._idle.pop()
            if not rt.dead:
                return rt
        if self._live < self.max_concurrency:
            self._live += 1
            return await self._spawn()
        if not wait:
            return None
        waiter: asyncio.Future[_Runtime | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                got = await waiter
        except TimeoutError:
            raise SpillThrottled(
                f"all {self.max_concurrency} runtimes busy for {self.queue_timeout_s:g} s"
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())
            else:
                waiter.cancel()
            raise
        if got is None:  # capacity freed by a dead runtime, reserved for us
            return await self._spawn()
        return got

    def _give_back(self, rt: _Runtime | None) -> None:
        if rt is None:
            self._live -= 1
        elif not rt.dead:
            self._idle.append(rt)
        self._match()

    def _release(self, rt: _Runtime) -> None:
        if not rt.dead and not self._closed:
            self._idle.append(rt)
            self._match()

    def _match(self) -> None:
        """Give idle runtimes, then free capacity, to waiters in arrival order."""
        while self._waiters:
            waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self._idle:
                waiter.set_result(self._idle.pop())
            elif self._live < self.max_concurrency and not self._closed:
                self._live += 1
                waiter.set_result(None)
            else:
                return
            self._waiters.popleft()

    async def _spawn(self) -> _Runtime:
        """Start a runtime process on its own Runtime API socket (``_live`` already counts it)."""
        assert self._runner is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            site = web.SockSite(self._runner, sock)
            await site.start()
        except BaseException:
            sock.close()
            self._live -= 1
            self._match()
            raise
        self._spawned += 1
        rt = _Runtime(index=self._spawned, port=port, site=site)
        self._by_port[port] = rt
        try:
            rt.proc = await asyncio.create_subprocess_exec(
                self._python,
                "-m",
                "awslambdaric",
                self._handler,
                cwd=self._cwd,
                env=self._env(port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, so close() kills it whole
            )
        except BaseException as exc:
            rt.dead = True
            del self._by_port[port]
            self._live -= 1
            await site.stop()
            self._match()
            if isinstance(exc, OSError):
                raise SpillError(f"cannot start a Lambda runtime: {exc}") from exc
            raise
        rt.spawned = time.perf_counter()
        if self._closed:  # close() ran while the process was starting: it must not outlive us
            rt.exit_reason = "the local Lambda was closed"
            _kill(rt)
            await rt.proc.wait()
            rt.dead = True
            self._by_port.pop(port, None)
            with contextlib.suppress(RuntimeError):
                await site.stop()
            raise SpillError("the local Lambda was closed")
        log.info("lambda runtime %d started (pid %d, port %d)", rt.index, rt.proc.pid, port)
        rt.watcher = asyncio.create_task(self._watch(rt), name=f"lambda-runtime-{rt.index}")
        rt.init_timer = asyncio.get_running_loop().call_later(
            self.init_timeout_s, self._init_expired, rt
        )
        return rt

    def _env(self, port: int) -> dict[str, str]:
        """A clean environment, like Lambda's: its variables plus what Python needs to run."""
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        vcpus = max(1, min(6, math.ceil(self.memory_mb / MB_PER_VCPU), os.cpu_count() or 1))
        stream = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{secrets.token_hex(16)}"
        env.update(
            {
                "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{port}",
                "AWS_LAMBDA_FUNCTION_NAME": self.function_name,
                "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.memory_mb),
                "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{self.function_name}",
                "AWS_LAMBDA_LOG_STREAM_NAME": stream,
                "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
                "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11",
                "AWS_REGION": self._region,
                "AWS_DEFAULT_REGION": self._region,
                "_HANDLER": self._handler,
                "LAMBDA_TASK_ROOT": str(self._cwd),
                "TZ": ":UTC",
                "OMP_NUM_THREADS": str(vcpus),
                "MKL_NUM_THREADS": str(vcpus),
            }
        )
        env.update(self._extra_env)
        return env

    async def _watch(self, rt: _Runtime) -> None:
        """Collect the runtime's output; when it exits, fail what it held and free its slot."""
        assert rt.proc is not None and rt.proc.stdout is not None
        out = rt.proc.stdout
        while chunk := await out.read(65536):
            rt.tail += chunk
            del rt.tail[:-_TAIL_BYTES]
            log.debug("lambda runtime %d: %s", rt.index, chunk.decode(errors="replace").rstrip())
        code = await rt.proc.wait()
        rt.dead = True
        self._live -= 1
        if rt.init_timer is not None:
            rt.init_timer.cancel()
        with contextlib.suppress(ValueError):
            self._idle.remove(rt)
        reason = rt.exit_reason or (
            f"init failed: {rt.init_error}" if rt.init_error else f"exited with code {code}"
        )
        tail = rt.tail.decode(errors="replace").replace("\r", "\n").strip()
        message = f"Lambda runtime {rt.index} {reason}" + (
            f"; its last output:\n{tail[-1500:]}" if tail else ""
        )
        log.info("lambda runtime %d gone: %s", rt.index, reason)
        if rt.current is not None:
            self._settle(rt, rt.current, error=RuntimeExited(message), release=False)
        while not rt.inbox.empty():
            inv = rt.inbox.get_nowait()
            if inv is not None and not inv.future.done():
                inv.future.set_exception(RuntimeExited(message))
        rt.inbox.put_nowait(None)  # unblock a /next still waiting for this runtime
        self._by_port.pop(rt.port, None)
        await rt.site.stop()
        self._match()

    def _init_expired(self, rt: _Runtime) -> None:
        if not rt.ready and not rt.dead:
            rt.exit_reason = f"did not finish init within {self.init_timeout_s:g} s"
            _kill(rt)

    def _invocation_expired(self, rt: _Runtime, inv: _Invocation) -> None:
        if rt.current is inv:
            rt.exit_reason = f"was killed: invocation timed out after {self.timeout_s:g} s"
            self._settle(
                rt,
                inv,
                error=SpillTimeout(
                    f"{inv.request_id} Task timed out after {self.timeout_s:.2f} seconds"
                ),
                release=False,
            )
            _kill(rt)

    def _settle(
        self,
        rt: _Runtime,
        inv: _Invocation,
        *,
        body: bytes | None = None,
        error: SpillError | None = None,
        release: bool = True,
    ) -> None:
        """Finish a delivered invocation: bill it, answer its caller, free its runtime."""
        if inv.timer is not None:
            inv.timer.cancel()
        if rt.current is inv:
            rt.current = None
        duration_ms = (time.perf_counter() - inv.delivered) * 1000.0
        billable = duration_ms + (rt.init_ms if inv.cold and self._bill_init else 0.0)
        charge = lambda_charge(self._prices, billable, self.memory_mb, 1, self._arch)
        self._account(inv, duration_ms, charge, failed=error is not None)
        if not inv.future.done():
            if error is not None:
                inv.future.set_exception(error)
            else:
                inv.future.set_result(_Done(body or b"", duration_ms, charge.billed_ms, inv.cold))
        if release:
            self._release(rt)

    def _account(
        self, inv: _Invocation, duration_ms: float, charge: LambdaCharge, *, failed: bool
    ) -> None:
        self._requests += charge.requests
        self._errors += int(failed)
        self._duration_ms += duration_ms
        self._billed_ms += charge.billed_ms
        self._gb_seconds += charge.gb_seconds
        self._cost += charge.cost
        end = time.time()
        self._charges.add(inv.model, inv.started_at, end, duration_ms, charge)

    # ---- the Runtime API -----------------------------------------------------------------

    def _runtime_of(self, request: web.Request) -> _Runtime | None:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        rt = self._by_port.get(sockname[1]) if sockname else None
        return rt if rt is not None and not rt.dead else None

    async def _next(self, request: web.Request) -> web.StreamResponse:
        """Long-poll: answer when this runtime has an invocation to run."""
        rt = self._runtime_of(request)
        if rt is None:
            return _api_error(403, "Runtime.Unknown", "no such runtime")
        if rt.current is not None:  # it moved on without answering: that answer is lost
            self._settle(
                rt, rt.current, error=RuntimeExited(f"Lambda runtime {rt.index} dropped it")
            )
        if not rt.ready:
            rt.ready = True
            rt.init_ms = (time.perf_counter() - rt.spawned) * 1000.0
            if rt.init_timer is not None:
                rt.init_timer.cancel()
            log.info("lambda runtime %d ready after %.0f ms", rt.index, rt.init_ms)
        while True:
            inv = await rt.inbox.get()
            if inv is None:
                return _api_error(410, "Runtime.Gone", "this runtime was shut down")
            if not inv.future.done():
                break
            self._release(rt)  # its caller gave up before the runtime took it
        inv.delivered = time.perf_counter()
        inv.started_at = time.time()
        inv.cold = rt.served == 0
        rt.served += 1
        rt.current = inv
        inv.timer = asyncio.get_running_loop().call_later(
            self.timeout_s, self._invocation_expired, rt, inv
        )
        deadline_ms = int((inv.started_at + self.timeout_s) * 1000)
        headers = {
            "Lambda-Runtime-Aws-Request-Id": inv.request_id,
            "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
            "Lambda-Runtime-Invoked-Function-Arn": self.function_arn,
            # awslambdaric's C extension crashes without a trace id; Lambda always sends one.
            "Lambda-Runtime-Trace-Id": _trace_id(inv.started_at),
        }
        return web.Response(body=inv.payload, headers=headers, content_type="application/json")

    def _delivered(self, request: web.Request) -> tuple[_Runtime, _Invocation] | None:
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
            rt.exit_reason = "was reset after a reply over the payload limit"
            error = PayloadTooLarge(
                f"reply of {len(body)} bytes is over Lambda's {PAYLOAD_LIMIT}-byte limit"
            )
            self._settle(rt, inv, error=error, release=False)
            _kill(rt)  # awslambdaric exits on a failed post anyway; do not hand it new work
            return _api_error(413, "RequestEntityTooLarge", str(error))
        self._settle(rt, inv, body=body)
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
        self._settle(rt, inv, error=FunctionError(error_type or "Unhandled", message, stack_lines))
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


def _kill(rt: _Runtime) -> None:
    """SIGKILL the runtime's process group (the runtime and anything it started)."""
    proc = rt.proc
    if proc is None or proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _absolute_source(source: str) -> str:
    """A TorchScript path made absolute, since the runtimes run in another directory."""
    if ":" in source and not Path(source).exists():
        return source  # pkg.mod:factory
    return str(Path(source).expanduser().resolve())


def _plain(x: Any) -> Any:
    """Numpy arrays and tensors to lists, so a batch of either serialises as JSON."""
    tolist = getattr(x, "tolist", None)
    return tolist() if callable(tolist) else x
