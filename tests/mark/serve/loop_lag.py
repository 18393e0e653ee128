"""How long a big request body stalls the event loop: parsed inline, in a thread, or
the way the endpoint parses it (``mark.serve.endpoint.Parsing``).

    .venv/bin/python tests/mark/serve/loop_lag.py

A probe sleeps 1 ms in a loop and records how late it wakes; five 9 MiB bodies of a
valid-looking but wrong-shaped V1 request (the junk a client could send) are parsed
one after another. Prints the worst and the 99th percentile lag of each way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import orjson

from bouncer.contract import TensorSpec
from mark.serve.codec import BadRequest, Tensor, read_v1
from mark.serve.endpoint import MAX_INSTANCES_PER_REQUEST, Parsing

SCHEMA = TensorSpec("input", "float32", (1, 8, 8))
JUNK = orjson.dumps({"instances": [[0.123456789] * 1000] * 800})


def parse(body: bytes) -> Tensor | None:
    try:
        return read_v1(body, SCHEMA, MAX_INSTANCES_PER_REQUEST)
    except BadRequest:
        return None


async def lags_while(parse_all: Callable[[], Awaitable[None]]) -> list[float]:
    lags: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.05)
    await parse_all()
    stop.set()
    await task
    return lags


async def main() -> None:
    parsing = Parsing()
    await parsing.run(parsing.inline_bytes + 1, parse, b"{}")  # start the pool first

    async def inline() -> None:
        for _ in range(5):
            parse(JUNK)
            await asyncio.sleep(0.01)

    async def thread() -> None:
        for _ in range(5):
            await asyncio.to_thread(parse, JUNK)
            await asyncio.sleep(0.01)

    async def endpoint() -> None:
        for _ in range(5):
            await parsing.run(len(JUNK), parse, JUNK)
            await asyncio.sleep(0.01)

    print(f"body: {len(JUNK) / 2**20:.1f} MiB")
    for name, way in (("inline", inline), ("thread", thread), ("endpoint", endpoint)):
        lags = await lags_while(way)
        worst, p99 = 1e3 * max(lags), 1e3 * float(np.percentile(lags, 99))
        print(f"{name:>8}: worst loop lag {worst:6.1f} ms, p99 {p99:6.1f} ms")
    parsing.close()


if __name__ == "__main__":
    asyncio.run(main())
