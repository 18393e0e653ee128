"""What the local Lambda keeps about each runtime and each invocation it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Done:
    """A finished invocation: the handler's reply and what it is billed."""

    body: bytes
    duration_ms: float
    billed_ms: int
    cold: bool


@dataclass(eq=False)
class Invocation:
    request_id: str
    model: str
    payload: bytes
    future: asyncio.Future[Done]
    delivered: float = 0.0  # perf_counter when the runtime took it
    started_at: float = 0.0  # wall clock, for the ledger
    cold: bool = False
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class Runtime:
    """One awslambdaric process and its own Runtime API socket."""

    index: int
    port: int
    site: web.SockSite
    inbox: asyncio.Queue[Invocation | None] = field(default_factory=asyncio.Queue)
    proc: asyncio.subprocess.Process | None = None
    spawned: float = 0.0
    ready: bool = False  # has asked for its first invocation: init is over
    init_ms: float = 0.0
    served: int = 0
    current: Invocation | None = None
    dead: bool = False
    exit_reason: str | None = None
    init_error: str | None = None
    tail: bytearray = field(default_factory=bytearray)
    watcher: asyncio.Task[None] | None = None
    init_timer: asyncio.TimerHandle | None = None
