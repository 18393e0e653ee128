"""Which asyncio event loop mark's processes run on: uvloop where it is installed.

The frontend's cost per request is mostly event-loop and socket-transport
work (measured with py-spy under load: ``_SelectorSocketTransport.write``
alone was the largest self-time frame). uvloop does that part in C, so the
daemon and the agents run on it; ``MARK_EVENT_LOOP=asyncio`` falls back to the
standard loop (for debugging, or a platform uvloop does not support).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "MARK_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or ``None`` (the standard loop) if unwanted or missing."""
    if os.environ.get(ENV, "uvloop").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
