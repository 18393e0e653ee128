"""Where request bodies are parsed: small ones on the event loop, big ones in a bounded
pool of parser processes."""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from mark.serve.codec import BadRequest

log = logging.getLogger("mark.api")

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are parsed on the event loop; larger ones in a parser process.

Parsing costs about 10 ms per MiB (orjson, then numpy's list-to-array), so 64 KiB
stalls the loop that runs every model's batcher for under a millisecond, while a
parser process round trip costs about as much. Threads would not do: orjson and
numpy hold the GIL for the whole parse (a 9 MiB body stalled the loop 60 ms from a
thread, 100 ms inline, 6 ms from a process: ``tests/mark/serve/loop_lag.py``)."""
PARSER_PROCESSES = 2
"""At most this many parser processes, however many big bodies arrive: a flood queues
(each body already bounded by ``api.max_body_bytes``) instead of forking without end."""
PARSE_QUEUE = 16
"""At most this many big bodies waiting for or in a parser process; the next one is
refused (503, ``Retry-After``) instead of held: 16 bodies of 8 MiB are 128 MiB held
(and again as pickles) and about a second of parsing on two processes."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass
class Parsing:
    """Where request bodies are parsed: small ones inline, big ones in a bounded process
    pool (started on the first big body, so a daemon never sent one pays nothing)."""

    inline_bytes: int = INLINE_BODY_BYTES
    processes: int = PARSER_PROCESSES
    max_queued: int = PARSE_QUEUE
    _pool: ProcessPoolExecutor | None = field(default=None, repr=False)
    _queued: int = field(default=0, repr=False)

    async def run(self, size: int, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``fn(*args)``, off the event loop when ``size`` is over ``inline_bytes``;
        its exceptions (``BadRequest``) are raised here either way. A parser process that
        died (killed for memory, say) fails the requests it had with a 503 and the next
        big body gets a new pool, instead of every later one failing on a broken pool."""
        if size <= self.inline_bytes:
            return fn(*args, **kwargs)
        if self._queued >= self.max_queued:
            raise BadRequest(
                503, f"{self._queued} large request bodies are being parsed already; retry"
            )
        self._queued += 1
        try:
            return await self._in_pool(fn, *args, **kwargs)
        finally:
            self._queued -= 1

    async def _in_pool(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._pool is None:
            # forkserver, not fork: the daemon has threads, and a forked child would
            # inherit their locks; the server forks workers from a clean process.
            ctx = multiprocessing.get_context(
                "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            )
            self._pool = ProcessPoolExecutor(
                max_workers=max(1, min(self.processes, os.cpu_count() or 1)), mp_context=ctx
            )
        pool = self._pool
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))
        except BrokenProcessPool:
            log.error("a request parser process died; a new pool starts with the next big body")
            if self._pool is pool:
                self.close()
            raise BadRequest(503, "the request parser failed; retry") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
