"""The local Lambda's fault-injection switch (``RuntimePool.throttle``), which the
throttling scenario uses: refuses at once as Lambda's 429 would, then lets go."""

from __future__ import annotations

from typing import cast

import pytest
from aiohttp import web

from mark.cloud.local.lambda_.pool import RuntimePool
from mark.cloud.local.lambda_.records import Runtime
from mark.errors import SpillThrottled, is_throttled


async def test_a_throttled_pool_refuses_every_acquire_until_the_switch_ends() -> None:
    pool = RuntimePool(max_concurrency=2, queue_timeout_s=5.0)
    spawned: list[Runtime] = []

    async def spawn() -> Runtime:
        spawned.append(Runtime(len(spawned), 0, cast(web.SockSite, None)))
        return spawned[-1]

    pool.throttle(60)
    for wait in (True, False):
        with pytest.raises(SpillThrottled, match="TooManyRequestsException") as err:
            await pool.acquire(spawn, wait=wait)
        assert is_throttled(err.value)
    assert spawned == [] and pool.live == 0  # refused before any runtime was reserved
    pool.throttle(0)
    assert await pool.acquire(spawn, wait=True) is spawned[0]
    assert pool.live == 1
