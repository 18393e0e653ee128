"""What a running daemon holds (``Running``), and the small loops its tasks run in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from mark.catalog import Catalog
from mark.clock import WallClock
from mark.config import Settings
from mark.control import Controller
from mark.control.cluster_feed import ClusterFeed
from mark.control.health import HealthTracker
from mark.identity import frontend_id
from mark.serve.auth import KeyCache
from mark.serve.endpoint import Served
from mark.serve.intake import Intake
from mark.state import FrontendRecord, SqlStore
from mark.world import Job, World

log = logging.getLogger("mark.daemon")


@dataclass
class Running:
    """Everything the daemon started, so a test (or ``serve``) can reach it."""

    settings: Settings
    store: SqlStore
    world: World
    session: aiohttp.ClientSession
    models: dict[str, Served]
    runner: web.AppRunner
    url: str
    controller: Controller | None = None
    intake: Intake = field(default_factory=Intake)
    """The endpoint's phase (starting, open, draining) and the requests it has in hand."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    """Stopped as a drain begins: the control loop and the world's jobs."""
    serving_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    """Kept through the drain, stopped after it: agent syncs, key refresh, telemetry."""
    jobs: list[Job] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # model → the file it loads
    catalog: Catalog | None = None
    profiled: set[tuple[str, str]] = field(default_factory=set)  # (model, type) stored
    health: HealthTracker = field(default_factory=HealthTracker)
    api_key: str | None = None  # the key in <data_dir>/api-key, when it is this store's
    keys: KeyCache | None = None  # what the endpoint checks keys against (api.auth)
    refused: set[tuple[str, str]] = field(default_factory=set)
    """(model, version) a reload refused or a roll turned back from: not tried again."""
    reload_now: asyncio.Event = field(default_factory=asyncio.Event)
    """Set (SIGHUP) to read the model repository again at once."""
    reloads: int = 0
    """How many times the model repository was read again (done, or failed)."""
    started_at: float = field(default_factory=lambda: WallClock().now())
    synced_at: float | None = None
    """When the last agent sync that read the store's retiring marks began reading them:
    every mark made before then is applied (``mark.agent_sync.read_marks``)."""
    cluster: list[FrontendRecord] = field(default_factory=list)
    """The live frontends, this one included, as of the last beat."""
    feed: ClusterFeed = field(default_factory=lambda: ClusterFeed(frontend_id()))
    """The leader's look at the other frontends' counts (``mark.control.cluster_feed``)."""


def store_metrics(store: SqlStore) -> str:
    return store.outbox.prometheus() if store.outbox is not None else ""


def leads(run: Running, clock: WallClock) -> bool:
    """Whether this frontend leads the cluster now (none without a control loop)."""
    return run.controller is not None and run.controller.leading(clock.now())


async def every(seconds: float, what: str, fn: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await fn()
        except Exception:  # one failed round must not stop the daemon; the next one retries
            log.exception("%s failed", what)


async def cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
