"""``LocalLambda``, the ``Serverless`` port of the local world: the spill function run by
real awslambdaric runtimes (the package docstring says why and how)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from bouncer.contract import ModelContract
from mark.catalog import LambdaPrices, load_catalog
from mark.cloud.local.lambda_.events import absolute_source, decode_reply, encode_event, plain
from mark.cloud.local.lambda_.metering import LambdaMeter, LambdaUsage
from mark.cloud.local.lambda_.pool import RuntimePool
from mark.cloud.local.lambda_.process import RuntimeLauncher
from mark.cloud.local.lambda_.records import Done, Invocation, Runtime
from mark.cloud.local.lambda_.supervisor import RuntimeSupervisor
from mark.cloud.spill_event import Source
from mark.errors import SpillError, SpillTimeout
from mark.ports import SpillResult
from mark.state.records import LedgerEntry

DEFAULT_HANDLER = "lambda_handlers.spill.handler"
ACCOUNT_ID = "123456789012"


class LocalLambda:
    """The ``Serverless`` port of the local world: a pool of real awslambdaric runtimes.

    ``models`` maps a model name to its contract (or a bare source: a TorchScript
    path or ``pkg.mod:factory``); it is sent in each event so one function serves
    every model, as the spill handler expects.
    """

    def __init__(
        self,
        models: Mapping[str, str | ModelContract] | None = None,
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
        self._models = {name: absolute_source(src) for name, src in (models or {}).items()}
        prices = prices if prices is not None else load_catalog().lambda_prices
        self._meter = LambdaMeter(prices, memory_mb, arch, bill_init)
        self._pool = RuntimePool(max_concurrency, self.queue_timeout_s)
        launcher = RuntimeLauncher(
            handler=handler,
            function_name=function_name,
            memory_mb=memory_mb,
            region=region,
            python=python,
            cwd=cwd,
            env=env,
        )
        self._runtimes = RuntimeSupervisor(
            launcher,
            self._pool,
            self._meter,
            function_arn=self.function_arn,
            timeout_s=timeout_s,
            init_timeout_s=init_timeout_s,
        )

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Set up the Runtime API application; runtimes start on demand."""
        await self._runtimes.api.start()

    async def close(self) -> None:
        """Kill every runtime (their whole process groups), fail what waits, stop serving."""
        if self._pool.closed:
            return
        self._pool.close()
        await self._runtimes.close()

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

    async def invoke(
        self,
        model: str,
        batch: Sequence[Any],
        dtype: str = "float32",
        *,
        source: Source | None = None,
    ) -> SpillResult:
        """Run one batch of ``dtype`` rows on a runtime (warm if one is idle); raise a
        ``SpillError`` otherwise. ``source``: the model's contract or source for this
        event, instead of the one configured (an event that carries its own)."""
        rows = [plain(x) for x in batch]
        payload = (
            encode_event(model, rows, source, dtype)
            if source is not None
            else self._event(model, rows, dtype)
        )
        rt = await self._acquire(wait=True)
        assert rt is not None
        done = await self._dispatch_to(rt, model, payload)
        return decode_reply(model, done, self.memory_mb)

    async def warm_up(self, model: str, concurrency: int) -> None:
        """Make ``concurrency`` runtimes (at most the limit) warm with ``model`` loaded.

        Idle runtimes are pinged and new ones started up to the target, all at
        once and each with its own ping, so that many distinct runtimes end up
        warm; runtimes busy serving count as warm and are left alone.
        """
        target = min(concurrency, self.max_concurrency)
        busy = self._pool.busy
        taken: list[Runtime] = []
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
            decode_reply(model, res, self.memory_mb)  # raises if the model could not load

    # ---- accounting ----------------------------------------------------------------------

    @property
    def cold_starts(self) -> int:
        """Runtimes started so far (each one's first invocation is a cold start)."""
        return self._runtimes.spawned

    @property
    def runtimes(self) -> int:
        """Runtimes alive now (starting, idle or busy)."""
        return self._runtimes.alive

    def child_pids(self) -> list[int]:
        """Process ids of the runtimes alive now."""
        return self._runtimes.child_pids()

    def usage(self) -> LambdaUsage:
        """Totals since start: requests, errors, cold starts, billed duration, GB-s, cost."""
        return self._meter.usage(self._runtimes.spawned)

    def take_charges(self) -> list[LedgerEntry]:
        """Charges since the last call, one ledger entry per model, for ``Store.add_charges``."""
        return self._meter.take_charges()

    def use(self, model: str, source: Source) -> None:
        """From now on, events for ``model`` carry ``source`` (a new version's contract)."""
        self._models[model] = absolute_source(source)

    # ---- invocations ---------------------------------------------------------------------

    def _event(self, model: str, instances: list[Any], dtype: str = "float32") -> bytes:
        return encode_event(model, instances, self._models.get(model), dtype)

    async def _acquire(self, *, wait: bool) -> Runtime | None:
        """Reserve a runtime from the pool (``None``: none free and ``wait`` is false)."""
        if self._pool.closed or not self._runtimes.api.running:
            raise SpillError("the local Lambda is not running (call start())")
        return await self._pool.acquire(self._runtimes.spawn, wait=wait)

    async def _dispatch_to(self, rt: Runtime, model: str, payload: bytes) -> Done:
        """Hand the event to a reserved runtime and wait; the platform's timers bound the wait."""
        loop = asyncio.get_running_loop()
        inv = Invocation(str(uuid.uuid4()), model, payload, loop.create_future())
        rt.inbox.put_nowait(inv)
        # Init and invocation timeouts kill the runtime, whose death settles the future;
        # this outer bound only guards against a bug in that machinery.
        guard = self.init_timeout_s + self.timeout_s + 10.0
        try:
            return await asyncio.wait_for(asyncio.shield(inv.future), guard)
        except TimeoutError:
            self._runtimes.reset(rt, "the invocation was lost (no reply and no exit)")
            raise SpillTimeout(f"no reply from runtime {rt.index} within {guard:.0f} s") from None
        except asyncio.CancelledError:
            inv.future.cancel()  # undelivered: the runtime skips it; delivered: reply is dropped
            raise
