"""Supervision of the local Lambda's runtimes: start, watch, time out, and settle what they hold.

Nothing waits forever: a runtime that does not finish init in ``init_timeout_s``
or an invocation that runs past ``timeout_s`` is killed and its caller gets an
explicit error; a runtime that dies fails what it held. Every finished
invocation, failed or not, is billed (``LambdaMeter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from mark.cloud.local.lambda_.metering import LambdaMeter
from mark.cloud.local.lambda_.pool import RuntimePool
from mark.cloud.local.lambda_.process import RuntimeLauncher, collect_output, kill
from mark.cloud.local.lambda_.records import Done, Invocation, Runtime
from mark.cloud.local.lambda_.runtime_api import RuntimeApi
from mark.errors import RuntimeExited, SpillError, SpillTimeout

log = logging.getLogger(__name__)


class RuntimeSupervisor:
    """The runtimes of one local function, each behind its own ``RuntimeApi`` socket;
    it is the ``RuntimeHost`` of that API."""

    def __init__(
        self,
        launcher: RuntimeLauncher,
        pool: RuntimePool,
        meter: LambdaMeter,
        *,
        function_arn: str,
        timeout_s: float,
        init_timeout_s: float,
    ) -> None:
        self.api = RuntimeApi(self, function_arn=function_arn, timeout_s=timeout_s)
        self.spawned = 0  # runtimes started so far
        self._launcher = launcher
        self._pool = pool
        self._meter = meter
        self._timeout_s = timeout_s
        self._init_timeout_s = init_timeout_s
        self._by_port: dict[int, Runtime] = {}

    @property
    def alive(self) -> int:
        return sum(1 for rt in self._by_port.values() if not rt.dead)

    def child_pids(self) -> list[int]:
        return [
            rt.proc.pid
            for rt in self._by_port.values()
            if rt.proc is not None and rt.proc.returncode is None
        ]

    async def close(self) -> None:
        """Kill every runtime (their whole process groups), wait for them, stop serving."""
        runtimes = list(self._by_port.values())
        for rt in runtimes:
            rt.exit_reason = rt.exit_reason or "the local Lambda was closed"
            kill(rt)
        watchers = [rt.watcher for rt in runtimes if rt.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=10.0)
        await self.api.close()

    async def spawn(self) -> Runtime:
        """Start a runtime process on its own Runtime API socket (the pool already counts it)."""
        try:
            port, site = await self.api.open_site()
        except BaseException:
            self._pool.free_slot()
            self._pool.match()
            raise
        self.spawned += 1
        rt = Runtime(index=self.spawned, port=port, site=site)
        self._by_port[port] = rt
        try:
            rt.proc = await self._launcher.start(port)
        except BaseException as exc:
            rt.dead = True
            del self._by_port[port]
            self._pool.free_slot()
            await site.stop()
            self._pool.match()
            if isinstance(exc, OSError):
                raise SpillError(f"cannot start a Lambda runtime: {exc}") from exc
            raise
        rt.spawned = time.perf_counter()
        if self._pool.closed:  # close() ran while the process was starting: it must not outlive us
            rt.exit_reason = "the local Lambda was closed"
            kill(rt)
            await rt.proc.wait()
            rt.dead = True
            self._by_port.pop(port, None)
            with contextlib.suppress(RuntimeError):
                await site.stop()
            raise SpillError("the local Lambda was closed")
        log.info("lambda runtime %d started (pid %d, port %d)", rt.index, rt.proc.pid, port)
        rt.watcher = asyncio.create_task(self._watch(rt), name=f"lambda-runtime-{rt.index}")
        rt.init_timer = asyncio.get_running_loop().call_later(
            self._init_timeout_s, self._init_expired, rt
        )
        return rt

    async def _watch(self, rt: Runtime) -> None:
        """Collect the runtime's output; when it exits, fail what it held and free its slot."""
        code = await collect_output(rt)
        rt.dead = True
        self._pool.discard(rt)
        if rt.init_timer is not None:
            rt.init_timer.cancel()
        reason = rt.exit_reason or (
            f"init failed: {rt.init_error}" if rt.init_error else f"exited with code {code}"
        )
        tail = rt.tail.decode(errors="replace").replace("\r", "\n").strip()
        message = f"Lambda runtime {rt.index} {reason}" + (
            f"; its last output:\n{tail[-1500:]}" if tail else ""
        )
        log.info("lambda runtime %d gone: %s", rt.index, reason)
        if rt.current is not None:
            self.settle(rt, rt.current, error=RuntimeExited(message), release=False)
        while not rt.inbox.empty():
            inv = rt.inbox.get_nowait()
            if inv is not None and not inv.future.done():
                inv.future.set_exception(RuntimeExited(message))
        rt.inbox.put_nowait(None)  # unblock a /next still waiting for this runtime
        self._by_port.pop(rt.port, None)
        await rt.site.stop()
        self._pool.match()

    def _init_expired(self, rt: Runtime) -> None:
        if not rt.ready and not rt.dead:
            self.reset(rt, f"did not finish init within {self._init_timeout_s:g} s")

    def _invocation_expired(self, rt: Runtime, inv: Invocation) -> None:
        if rt.current is inv:
            error = SpillTimeout(
                f"{inv.request_id} Task timed out after {self._timeout_s:.2f} seconds"
            )
            self.settle(rt, inv, error=error, release=False)
            self.reset(rt, f"was killed: invocation timed out after {self._timeout_s:g} s")

    # ---- RuntimeHost: what the Runtime API reports ----------------------------------------

    def runtime_at(self, port: int) -> Runtime | None:
        rt = self._by_port.get(port)
        return rt if rt is not None and not rt.dead else None

    def init_done(self, rt: Runtime) -> None:
        rt.ready = True
        rt.init_ms = (time.perf_counter() - rt.spawned) * 1000.0
        if rt.init_timer is not None:
            rt.init_timer.cancel()
        log.info("lambda runtime %d ready after %.0f ms", rt.index, rt.init_ms)

    def deliver(self, rt: Runtime, inv: Invocation) -> None:
        inv.delivered = time.perf_counter()
        inv.started_at = time.time()
        inv.cold = rt.served == 0
        rt.served += 1
        rt.current = inv
        inv.timer = asyncio.get_running_loop().call_later(
            self._timeout_s, self._invocation_expired, rt, inv
        )

    def release(self, rt: Runtime) -> None:
        self._pool.release(rt)

    def settle(
        self,
        rt: Runtime,
        inv: Invocation,
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
        init_ms = rt.init_ms if inv.cold else 0.0
        charge = self._meter.bill(
            inv.model, inv.started_at, duration_ms, init_ms, failed=error is not None
        )
        if not inv.future.done():
            if error is not None:
                inv.future.set_exception(error)
            else:
                inv.future.set_result(Done(body or b"", duration_ms, charge.billed_ms, inv.cold))
        if release:
            self._pool.release(rt)

    def reset(self, rt: Runtime, reason: str) -> None:
        rt.exit_reason = reason
        kill(rt)
